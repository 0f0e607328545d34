"""labserve.ray.init: a local start that timed out is started again; nothing else is."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
from typing import Any

import pytest
import ray

import labserve.ray
from labserve.ray import cluster

TIMED_OUT = Exception(
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)


@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """ray.init fails as queued here (an exception each), then succeeds; calls recorded."""
    calls: list[dict[str, Any]] = []
    failures: list[BaseException] = []

    def init(**kwargs: Any) -> None:
        calls.append(kwargs)
        if failures:
            raise failures.pop(0)

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append({"shutdown": True}))
    return [calls, failures]


def test_a_start_that_timed_out_is_started_again(attempts):
    calls, failures = attempts
    failures += [TIMED_OUT, TIMED_OUT]
    labserve.ray.init(num_cpus=2)
    assert calls == [{"num_cpus": 2}, {"shutdown": True}] * 2 + [{"num_cpus": 2}]


def test_it_gives_up_after_the_last_attempt(attempts):
    calls, failures = attempts
    failures += [TIMED_OUT] * cluster.INIT_ATTEMPTS
    with pytest.raises(Exception, match="timed out during startup"):
        labserve.ray.init(num_cpus=2)
    assert len([c for c in calls if "num_cpus" in c]) == cluster.INIT_ATTEMPTS


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"num_cpus": 2}, ValueError("num_cpus must be positive")),
        ({"address": "10.0.0.1:6379"}, TIMED_OUT),  # joining: not ours to restart
    ],
)
def test_other_errors_and_joins_raise_at_once(attempts, kwargs, error):
    calls, failures = attempts
    failures.append(error)
    with pytest.raises(type(error)):
        labserve.ray.init(**kwargs)
    assert calls == [kwargs]


def test_a_timed_out_starts_processes_end_with_it(monkeypatch):
    # As Ray's node does: it starts its GCS and dashboard, then times out waiting for the
    # raylet and raises, holding the Popen objects; ray.shutdown() knows no node to stop.
    started: list[subprocess.Popen[bytes]] = []

    def init(**kwargs: Any) -> None:
        if not started:
            started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
            raise TIMED_OUT

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    labserve.ray.init(num_cpus=2)
    assert started[0].poll() is not None, "the failed start's process outlived it"


def test_a_failed_starts_popen_objects_are_dropped_quietly(monkeypatch, recwarn):
    # A process the failed node started that is still there when its Popen is collected
    # (here: one labserve did not see as its child, so did not end) warns at the collection;
    # in CI that fell in a later test's set-up and failed it.
    pids: list[int] = []

    def init(**kwargs: Any) -> None:
        if not pids:
            survivor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            pids.append(survivor.pid)
            raise Exception(*TIMED_OUT.args)  # a new one: its traceback holds the Popen

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(cluster, "_children", set)
    try:
        labserve.ray.init(num_cpus=2)
        gc.collect()
        assert not [w for w in recwarn if issubclass(w.category, ResourceWarning)]
    finally:
        os.kill(pids[0], signal.SIGKILL)
        os.waitpid(pids[0], 0)
