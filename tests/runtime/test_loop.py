"""The background loop: one named daemon thread, one thread-safe door, a clean stop."""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import labserve
from labserve.runtime.loop import loop_kind


class Doubler(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=8)
    def predict(self, x: np.ndarray) -> np.ndarray:
        if np.isnan(x).any():
            raise FloatingPointError("NaN in input")
        return x * 2


@pytest.fixture
def private_loop() -> Iterator[labserve.BackgroundLoop]:
    """A BackgroundLoop of the test's own (not labserve's process-wide one), always stopped."""
    bg = labserve.BackgroundLoop(name="test-private-loop")
    yield bg
    bg.stop()


async def current_thread() -> threading.Thread:
    return threading.current_thread()


def test_background_loop_is_one_process_wide_named_daemon_thread():
    bg = labserve.background_loop()

    assert labserve.background_loop() is bg
    thread = bg.run(current_thread())
    assert thread.name == "labserve-loop"
    assert thread.daemon
    assert [t for t in threading.enumerate() if t.name == "labserve-loop"] == [thread]


def test_start_and_stop_are_idempotent_and_stop_joins_the_loop_thread(private_loop):
    bg = private_loop
    assert not bg.running

    bg.start()
    bg.start()
    thread = bg.run(current_thread())
    assert bg.running
    assert thread.name == "test-private-loop" and thread.daemon
    assert [t for t in threading.enumerate() if t.name == bg.name] == [thread]

    bg.stop()
    bg.stop()
    assert not bg.running
    assert not thread.is_alive()


def test_stop_leaves_no_thread_behind(private_loop):
    before = set(threading.enumerate())
    bg = private_loop
    runner = labserve.Runner(Doubler, name="private", loop=bg)

    np.testing.assert_array_equal(runner.predict.run(np.ones((2, 3))), np.full((2, 3), 2.0))
    runner.stop()
    bg.stop()

    leaked = {t.name for t in set(threading.enumerate()) - before}
    assert leaked == set(), f"threads still running after BackgroundLoop.stop(): {leaked}"


def test_loop_can_start_again_after_stop(private_loop):
    bg = private_loop
    bg.start()
    first = bg.run(current_thread())
    bg.stop()

    second = bg.run(current_thread())  # run() starts the loop lazily

    assert second is not first
    assert second.is_alive() and not first.is_alive()


def test_run_from_the_loop_thread_raises_and_closes_the_coroutine(private_loop):
    bg = private_loop
    inner_coros: list[Any] = []

    async def inner() -> int:
        return 1

    async def outer() -> int:
        coro = inner()
        inner_coros.append(coro)
        return bg.run(coro)

    with pytest.raises(labserve.LoopThreadError, match="await the coroutine instead"):
        bg.run(outer())
    assert inspect.getcoroutinestate(inner_coros[0]) == inspect.CORO_CLOSED
    assert bg.run(inner()) == 1, "the loop still runs"


def test_stop_from_the_loop_thread_raises(private_loop):
    bg = private_loop

    async def stop_from_inside() -> None:
        bg.stop()

    with pytest.raises(labserve.LoopThreadError):
        bg.run(stop_from_inside())
    assert bg.running


def test_call_runs_on_the_loop_and_refuses_the_loop_thread(private_loop):
    bg = private_loop

    assert bg.call(threading.current_thread) is bg.run(current_thread())

    async def call_from_inside() -> threading.Thread:
        return bg.call(threading.current_thread)  # would wait for itself: refused, like run()

    with pytest.raises(labserve.LoopThreadError):
        bg.run(call_from_inside())
    assert bg.running
    with pytest.raises(ZeroDivisionError):
        bg.call(lambda: 1 / 0)


def test_submit_and_call_soon_hand_work_to_the_loop_from_other_threads(private_loop):
    bg = private_loop
    seen: list[str] = []
    done = threading.Event()

    def note() -> None:
        seen.append(threading.current_thread().name)
        done.set()

    bg.call_soon(note)
    assert done.wait(10)
    assert seen == [bg.name]
    assert bg.submit(current_thread()).result(10).name == bg.name


def test_run_with_a_timeout_cancels_the_coroutine(private_loop):
    bg = private_loop
    cancelled = threading.Event()
    never = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        never.set()

    with pytest.raises(TimeoutError):
        bg.run(forever(), timeout=0.05)
    assert cancelled.wait(10)
    assert not never.is_set()


def test_the_loop_survives_a_model_exception(make_runner):
    runner = make_runner(Doubler)
    loop_thread = labserve.background_loop().run(current_thread())

    with pytest.raises(labserve.ModelError, match="NaN in input"):
        runner.predict.run(np.full((1, 2), np.nan))

    np.testing.assert_array_equal(runner.predict.run(np.ones((1, 2))), np.full((1, 2), 2.0))
    assert labserve.background_loop().run(current_thread()) is loop_thread
    assert loop_thread.is_alive()


def test_stopping_the_loop_drains_its_runners(private_loop):
    bg = private_loop
    runner = labserve.Runner(Doubler, loop=bg)
    np.testing.assert_array_equal(runner.predict.run(np.ones((1, 2))), np.full((1, 2), 2.0))

    bg.stop()  # the runner's shutdown hook runs: it closes its queue and drains

    with pytest.raises(labserve.RunnerStoppedError):
        runner.predict.run(np.ones((1, 2)))
    runner.stop()
    assert not bg.running, "a call to a drained runner does not restart its loop"


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_a_loop_runs_the_kind_asked_for_and_serves_a_runner(kind):
    if kind == "uvloop":
        pytest.importorskip("uvloop")
    bg = labserve.BackgroundLoop(name="test-kind-loop", kind=kind)
    try:
        assert bg.run(loop_module()).startswith(kind)
        assert bg.uvloop == (kind == "uvloop")
        runner = labserve.Runner(Doubler, name=f"on_{kind}", loop=bg)
        np.testing.assert_array_equal(runner.predict.run(np.ones((1, 2))), [[2.0, 2.0]])
        runner.stop()
    finally:
        bg.stop()


def test_the_loop_kind_comes_from_the_environment_at_each_start(monkeypatch, private_loop):
    pytest.importorskip("uvloop")
    monkeypatch.setenv("LABSERVE_LOOP", "asyncio")
    assert private_loop.run(loop_module()).startswith("asyncio")
    private_loop.stop()
    monkeypatch.setenv("LABSERVE_LOOP", "uvloop")
    assert private_loop.run(loop_module()).startswith("uvloop")
    monkeypatch.delenv("LABSERVE_LOOP")
    assert loop_kind() == "uvloop"  # auto: uvloop when installed


def test_a_wrong_loop_kind_is_refused_with_the_choices(monkeypatch):
    with pytest.raises(ValueError, match="auto, asyncio, uvloop, got 'tokio'"):
        labserve.BackgroundLoop(kind="tokio")
    monkeypatch.setenv("LABSERVE_LOOP", "trio")
    with pytest.raises(ValueError, match=r"\$LABSERVE_LOOP must be one of"):
        loop_kind()


def test_without_uvloop_auto_falls_back_and_uvloop_by_name_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed
    assert loop_kind("auto") == "asyncio"
    with pytest.raises(ValueError, match=r"labserve\[fast\]"):
        loop_kind("uvloop")
