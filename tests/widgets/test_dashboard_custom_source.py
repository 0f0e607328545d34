"""The dashboard needs only the MethodSource protocol: a source of two runners as replicas."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from labserve.widgets import Dashboard

import labserve
from labserve.lab.demo import SleepModel

X = np.ones((1, 4))


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    """Poll a condition the pump will make true (not a timing assertion)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


class TwoRunners:
    """A user's own source: two in-process runners shown as the replicas of one method."""

    resettable = True

    def __init__(self, a: labserve.Runner, b: labserve.Runner) -> None:
        self.parts = {"replica-a": a, "replica-b": b}
        self.runner, self.method, self.name = "pair", "predict", "pair.predict"
        self.stale: frozenset[str] = frozenset()

    @property
    def config(self) -> labserve.BatchingConfig:
        return self.parts["replica-a"].predict.config

    @property
    def alive(self) -> bool:
        return True

    def configure(self, **changes: Any) -> labserve.BatchingConfig:
        for r in self.parts.values():
            config = r.predict.configure(**changes)
        return config

    def view(self) -> labserve.SourceView:
        snaps = {rid: r.predict.stats() for rid, r in self.parts.items()}
        return labserve.SourceView(snaps["replica-a"], self.config, snaps, self.stale)

    def reset_stats(self) -> None:
        for r in self.parts.values():
            r.predict.reset_stats()

    def example(self) -> Any:
        return X

    def start_load(self, *, example: Any = None, **kwargs: Any) -> labserve.LoadRun:
        return labserve.start_load(self.parts["replica-a"].predict, example=example, **kwargs)


@pytest.fixture
def pair() -> Iterator[TwoRunners]:
    a = labserve.Runner(SleepModel(a_ms=0.5, b_ms=0.01), name="a")
    b = labserve.Runner(SleepModel(a_ms=0.5, b_ms=0.01), name="b")
    yield TwoRunners(a, b)
    a.stop(timeout=10)
    b.stop(timeout=10)


def test_a_source_of_ones_own_drives_the_whole_dashboard(pair):
    assert isinstance(pair, labserve.MethodSource)
    d = Dashboard(pair, hz=20)
    try:
        assert list(d.methods) == ["pair.predict"]
        d.controls["max_batch_size"].value = 4  # the control reaches both "replicas"
        assert [r.predict.config.max_batch_size for r in pair.parts.values()] == [4, 4]
        for _ in range(3):
            pair.parts["replica-a"].predict.run(X)
        pair.parts["replica-b"].predict.run(X)
        wait_for(lambda: "2 of 2 replicas reporting" in d.replicas.value)
        assert d.replicas.layout.display is None
        pair.stale = frozenset({"replica-b"})
        wait_for(lambda: "1 of 2 replicas reporting" in d.replicas.value)
        assert "stale" in d.replicas.value
        d.controls["reset"].click()  # resettable: the counts start over on both
        assert [r.predict.stats().served for r in pair.parts.values()] == [0, 0]
        d.controls["rate"].value = "200"  # the example comes from the source
        d.controls["duration"].value = "0.3"
        d.controls["start"].value = True
        assert d.errors["load"].value == ""
        wait_for(lambda: not d.controls["start"].value)
        assert pair.parts["replica-a"].predict.stats().served > 0
        assert d.pump.last_error is None, repr(d.pump.last_error)
    finally:
        d.close()
