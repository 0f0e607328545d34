"""StepThread: a driver's worker of its own, one named thread that runs its jobs in order."""

from __future__ import annotations

import asyncio
import threading

import pytest

from labserve.runtime.step_thread import StepThread


def test_jobs_run_in_order_on_one_named_thread_that_ends_after_close():
    worker = StepThread("labserve-step-t.one")
    ran: list[tuple[int, str]] = []
    for i in range(200):
        worker.submit(lambda i: ran.append((i, threading.current_thread().name)), i)
    worker.close()
    assert worker.join(10.0)
    assert [i for i, _ in ran] == list(range(200))
    assert {name for _, name in ran} == {"labserve-step-t.one"}
    assert worker.thread is not None and not worker.thread.is_alive()


def test_a_closed_worker_refuses_jobs_and_closing_again_changes_nothing():
    worker = StepThread("labserve-step-t.closed")
    worker.submit(lambda: None)
    worker.close()
    worker.close()
    with pytest.raises(RuntimeError, match=r"labserve-step-t\.closed is closed"):
        worker.submit(lambda: None)
    assert worker.join(10.0) and worker.closed


def test_wait_closed_returns_once_the_thread_ended_and_at_once_if_it_never_started():
    never = StepThread("labserve-step-t.never")
    used = StepThread("labserve-step-t.used")
    gate = threading.Event()
    used.submit(gate.wait)

    async def close_both() -> None:
        never.close()
        await never.wait_closed()
        used.close()
        waiting = asyncio.ensure_future(used.wait_closed())
        await asyncio.sleep(0)
        assert not waiting.done()  # its job still runs: the thread has not ended
        gate.set()
        await waiting

    asyncio.run(close_both())
    assert never.thread is None
    assert used.thread is not None and not used.thread.is_alive()


def test_a_job_that_raises_out_is_reported_and_the_jobs_after_it_still_run(monkeypatch):
    seen: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    worker = StepThread("labserve-step-t.raises")
    gate = threading.Event()
    ran: list[int] = []
    worker.submit(gate.wait)  # holds the thread while the next two are queued

    def boom() -> None:
        raise SystemExit("a model that exits")

    worker.submit(boom)
    worker.submit(ran.append, 1)
    worker.close()
    gate.set()
    asyncio.run(worker.wait_closed())  # the thread that raised handed the rest to a new one
    assert ran == [1]
    assert len(seen) == 1 and isinstance(seen[0], SystemExit)
    assert worker.thread is not None and not worker.thread.is_alive()
