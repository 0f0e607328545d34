"""The generation dashboard's row per replica: two in-process runners as a method's replicas.

A source of one's own (the ``GenerationSource`` protocol, as a Ray application's through
its proxy): the merged status line stays, and a table gives each replica's running,
waiting, KV blocks, prefix hit rate and the config it runs, so a knob turned once shows on
every row.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from labserve.widgets import GenerationDashboard
from labserve.widgets.generation.dashboard import replica_table

import labserve
from labserve.lab.demo import TinyLM

PREFIX = "a shared system prompt, longer than a block of sixteen bytes: " * 2


def wait_for(condition: Callable[[], Any], timeout: float = 20.0) -> None:
    """Poll a condition the pump will make true (not a timing assertion)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


class TwoReplicas:
    """Two runners' generative methods shown as the replicas of one method."""

    resettable = True

    def __init__(self, a: labserve.Runner, b: labserve.Runner) -> None:
        self.parts = {"ra": a, "rb": b}
        self.runner, self.method, self.name = "pair", "generate", "pair.generate"
        self.stale: frozenset[str] = frozenset()

    @property
    def config(self) -> labserve.GenerationConfig:
        return self.parts["ra"].generate.config

    @property
    def alive(self) -> bool:
        return True

    def configure(self, **changes: Any) -> labserve.GenerationConfig:
        for r in self.parts.values():
            config = r.generate.configure(**changes)
        return config

    def view(self) -> labserve.GenerationView:
        snaps = {rid: r.generate.stats() for rid, r in self.parts.items()}
        return labserve.GenerationView(snaps["ra"], self.config, snaps, self.stale)

    def reset_stats(self) -> None:
        for r in self.parts.values():
            r.generate.reset_stats()

    def start_load(self, **kwargs: Any) -> Any:
        raise NotImplementedError


def rows(table: str) -> dict[str, list[str]]:
    """Each replica's cells by the replica's id, from the table's HTML."""
    found = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table)[1:]:
        cells = [
            html.unescape(re.sub(r"<[^>]+>", "", c))
            for c in re.findall(r"<td[^>]*>(.*?)</td>", row)
        ]
        found[cells[0]] = cells
    return found


@pytest.fixture
def pair() -> Iterator[TwoReplicas]:
    small = {"d_model": 32, "n_layers": 1, "d_ff": 64, "max_model_len": 256}
    a = labserve.Runner(TinyLM(**small), name="a")
    b = labserve.Runner(TinyLM(**small), name="b")
    yield TwoReplicas(a, b)
    a.stop(timeout=10)
    b.stop(timeout=10)


def test_each_replica_has_its_row_and_a_knob_turned_once_shows_on_both(pair):
    d = GenerationDashboard(pair, hz=20)
    try:
        for i in range(3):  # replica a alone sees the shared prefix again: its hits
            pair.parts["ra"].generate.run(PREFIX + f"q{i}", max_tokens=2)
        pair.parts["rb"].generate.run("hello", max_tokens=2)
        wait_for(lambda: [c[6] for c in rows(d.replicas.value).values()] == ["3", "1"])
        assert "2 of 2 replicas reporting" in d.replicas.value
        assert d.replicas.layout.display is None
        table = rows(d.replicas.value)
        assert table["ra"][1:4] == ["live", "0", "0"]  # running, waiting: idle now
        assert re.fullmatch(r"0 of \d+", table["ra"][4])  # KV blocks used of the pool
        assert table["ra"][5] != "0%" and table["rb"][5] == "0%"
        d.controls["max_num_seqs"].value = 4  # once, on the dashboard
        assert [r.generate.config.max_num_seqs for r in pair.parts.values()] == [4, 4]
        wait_for(lambda: {c[-1] for c in rows(d.replicas.value).values()} == {"4"})
        pair.stale = frozenset({"rb"})
        wait_for(lambda: "1 of 2 replicas reporting" in d.replicas.value)
        assert rows(d.replicas.value)["rb"][1] == "stale"
        assert d.pump.last_error is None, repr(d.pump.last_error)
    finally:
        d.close()


def test_a_method_in_one_process_has_no_replica_table(pair):
    view = labserve.GenerationView(pair.parts["ra"].generate.stats(), pair.config)
    assert replica_table(view) == ""
