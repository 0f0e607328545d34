"""What the subcommands share: the one-line usage error, number lists, imports, the loop.

Private to ``labserve.cli``: a subcommand's modules import what they share from here, not
from another subcommand's.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

from labserve.runtime.loop import loop_kind

__all__ = ["UsageError", "check_sections", "import_from_cwd", "loop_choice", "numbers"]

if TYPE_CHECKING:  # generic in typeshed only
    # What build_parser hands each subcommand's add_command, to add its parser to.
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


class UsageError(Exception):
    """A bad argument, said in one line."""


def numbers(kind: Callable[[str], Any], what: str) -> Callable[[str], list[Any]]:
    """An argparse type: comma-separated numbers > 0, each converted by ``kind``."""

    def parse(text: str) -> list[Any]:
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{what} must be comma-separated numbers, got {text!r}"
            ) from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"{what} must be numbers > 0, got {text!r}")
        return values

    return parse


def import_from_cwd(module_name: str) -> Any:
    """Import a module, the current folder first on the path (as uvicorn and gunicorn do)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return importlib.import_module(module_name)


@contextlib.contextmanager
def loop_choice(kind: str) -> Iterator[None]:
    """Run labserve's loops (the server's, the load generator's) on the loop asked for.

    ``auto`` is uvloop when installed. uvloop costs the generator about a third less CPU
    per request (benchmarks/http/client_cost.py) and the server less per request too
    (benchmarks/RESULTS.md). Chosen through ``$LABSERVE_LOOP``, put back afterwards
    (``main()`` may run inside another program); a loop, once started, keeps its kind.
    """
    try:
        loop_kind(kind)
    except ValueError as exc:
        raise UsageError(f"--loop {kind}: {exc}") from None
    before = os.environ.get("LABSERVE_LOOP")
    os.environ["LABSERVE_LOOP"] = kind
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LABSERVE_LOOP", None)
        else:
            os.environ["LABSERVE_LOOP"] = before


def check_sections(path: str, served: list[str], *, runner: str | None = None) -> None:
    """A config file's runner sections must name runners there are (a typo is an error).

    ``served``: the runners being served (each section must be one of them); ``runner``: a
    runner the file must have a section for.
    """
    from labserve.config.file import load_config_file

    file = load_config_file(path)
    sections = list(file.runners)
    have = ", ".join(repr(n) for n in sections) or "none (only the global runners.batching)"
    if runner is not None and runner not in sections:
        raise UsageError(
            f"{path} has no section for runner {runner!r}; its runner sections: {have}"
        )
    if served:
        file.check_runners(served)  # before the model loads (serve() checks it again)
