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
import urllib.parse
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

from labserve.runtime.loop import loop_kind

__all__ = [
    "FAILED_RUN",
    "FailedRun",
    "UsageError",
    "check_run",
    "check_sections",
    "import_from_cwd",
    "loop_choice",
    "numbers",
    "schedule_line",
]

if TYPE_CHECKING:  # generic in typeshed only
    # What build_parser hands each subcommand's add_command, to add its parser to.
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


class UsageError(Exception):
    """A bad argument, said in one line."""


class FailedRun(Exception):
    """A load run that failed, as :data:`FAILED_RUN` says: exit status 1, said in one line."""


FAILED_RUN = (
    "exit status: 0 when the run served requests and no reply was a 4xx; 1 when nothing was"
    " served or any request got a 4xx (a wrong --model or path, a length over the model's"
    " limits, a missing token: the load itself is wrong, so its figures mean nothing); 2 for"
    " a bad argument. Overload (503s, timeouts) is a measurement: it is reported, with 0."
)


def check_run(outcome: Any, url: str) -> None:
    """Raise FailedRun when a load's outcomes (codes into OUTCOMES) make it a failed run."""
    from labserve.base.vocabulary import CLIENT_ERROR, CONNECT_ERROR, OUTCOMES, SERVED

    codes = [int(c) for c in outcome]
    if not codes:
        raise FailedRun("no request was sent")
    if set(codes) == {CONNECT_ERROR}:
        parts = urllib.parse.urlsplit(url)
        where = f"{parts.scheme}://{parts.netloc}"
        raise FailedRun(f"the server is not reachable at {where}: no request could connect")
    bad = codes.count(CLIENT_ERROR)
    if bad:
        raise FailedRun(
            f"{bad:,} of {len(codes):,} requests got a 4xx reply (their errors are above):"
            " the load asks for what the server does not serve"
        )
    if SERVED not in codes:
        kinds = sorted({OUTCOMES[c] for c in codes})
        raise FailedRun(f"none of {len(codes):,} requests was served ({', '.join(kinds)})")


def schedule_line(lag_s: Any, rate_rps: float) -> str:
    """Whether an open loop kept its rate, and by what that is judged (see schedule_kept)."""
    from labserve.load.run import schedule_kept

    kept, said = schedule_kept(lag_s, rate_rps)
    rate = f"{rate_rps:,.0f}" if rate_rps >= 100 else f"{rate_rps:,.3g}"
    return f"schedule: {'kept' if kept else 'could NOT keep'} {rate} req/s: {said}"


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
