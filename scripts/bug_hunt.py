"""A test of the generation state machine: put each of issue 30's bugs back, one at a time.

For items 1-4 of issue 30 this reapplies the bug as a patch of the fixed code and runs the
state machine of ``tests/runtime/test_generation_driver.py`` against it; the machine must
fail on each, with the invariant that names the bug. Then it runs the machine on the
fixed code, which must pass. Items 5-8 live in the HTTP routes; their tests over the real
server (tests/server/) cover them.

    .venv/bin/python scripts/bug_hunt.py

Exits non-zero if the machine misses a bug or fails on the fixed code.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis.stateful import run_state_machine_as_test

from labserve.generation.scheduler import Scheduler
from labserve.generation.sequence import SeqState
from labserve.runtime.generation import driver as generation_driver
from labserve.runtime.generation.driver import GenerationDriver, _StepResult
from labserve.runtime.generation.streams import End

ROOT = Path(__file__).resolve().parent.parent


def _machine() -> Any:
    path = ROOT / "tests" / "runtime" / "test_generation_driver.py"
    spec = importlib.util.spec_from_file_location("generation_machine", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` inside the block."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


# -- the bugs, as they were -----------------------------------------------------------------


def sample_for_the_whole_step(self, samplers, rows, failed):  # type: ignore[no-untyped-def]
    """Item 1: the token was picked inside the step's try: one failure fails the step."""
    tokens, pieces, stopped = {}, {}, set()
    for entry, sampler in samplers:
        if entry.seq_id in failed:
            continue
        token = sampler.choose(rows[entry.seq_id])
        text, stop = sampler.push(token, entry.final)
        tokens[entry.seq_id], pieces[entry.seq_id] = token, text
        if stop:
            stopped.add(entry.seq_id)
    return _StepResult(tokens, pieces, stopped, failed)


def apply_config_without_stranding(self, config, now):  # type: ignore[no-untyped-def]
    """Item 2: a live change was applied, and the sequences it stranded stayed admitted."""
    self._pending_config = None
    self._config = config
    self._waiting.reorder(config.scheduling_policy)
    return []


def add_with_the_timeout_in_force(original: Callable[..., SeqState]) -> Callable[..., SeqState]:
    """Item 3: a new arrival took the timeout of the config the last step ran with."""

    def add(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        pending, self._pending_config = self._pending_config, None
        try:
            return original(self, *args, **kwargs)
        finally:
            self._pending_config = pending

    return add


def abort_answers_only(self):  # type: ignore[no-untyped-def]
    """Item 4: stop answered the callers but left their sequences stepping."""
    self._closed = True
    for seq in self._steps.live():
        generation_driver._answer(
            seq.handle.stream, End(None, (), RuntimeError("stopped")), self._rt.loop
        )


BUGS: list[tuple[str, Any, str, Any]] = [
    ("1: one sequence's sampling fails the whole step", GenerationDriver, "_sample",
     sample_for_the_whole_step),
    ("2: a live change strands admitted sequences", Scheduler, "_apply_config",
     apply_config_without_stranding),
    ("3: a timeout change reaches arrivals only at the next step", Scheduler, "add",
     add_with_the_timeout_in_force(Scheduler.add)),
    ("4: stop() leaves the model stepping", GenerationDriver, "abort", abort_answers_only),
]  # fmt: skip


def _first_line(exc: AssertionError) -> str:
    lines = str(exc).strip().splitlines()
    where = exc.__traceback__
    while where is not None and where.tb_next is not None:
        where = where.tb_next
    at = f" (at {where.tb_frame.f_code.co_name})" if where is not None else ""
    return (lines[0] if lines else "assertion failed") + at


def main() -> int:
    """Run the machine on each bug, then on the fixed code; 1 if it missed or failed."""
    module = _machine()
    machine, settings = module.GenerationMachine, module.BUG_HUNT
    missed = 0
    for title, owner, name, bug in BUGS:
        with patched(owner, name, bug):
            try:
                run_state_machine_as_test(machine, settings=settings)
            except AssertionError as exc:
                print(f"item {title}: FOUND -> {_first_line(exc)}")
                continue
        missed += 1
        print(f"item {title}: MISSED")
    try:
        run_state_machine_as_test(machine, settings=settings)
        print("fixed code: the machine passes")
    except AssertionError as exc:
        missed += 1
        print(f"fixed code: FAILS -> {_first_line(exc)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
