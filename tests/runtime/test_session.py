"""A re-run cell replaces what it re-creates; one call stops everything labserve started."""

from __future__ import annotations

import re

import numpy as np
import pytest

import labserve
from labserve.lab.demo import SleepModel
from labserve.runtime import session

X = np.ones((1, 4))


@pytest.fixture(autouse=True)
def nothing_left():
    """Each test starts and ends with nothing recorded as running."""
    labserve.stop_all()
    yield
    labserve.stop_all()


def _runner(name: str = "m") -> labserve.Runner:
    return labserve.Runner(SleepModel(a_ms=0.5, b_ms=0.01), name=name)


def test_a_runner_of_the_same_name_replaces_the_old_one_with_its_server_and_load(capsys):
    old = _runner()
    server = labserve.serve(old)
    run = labserve.start_load(
        old.predict, example=X, duration_s=60, arrivals=labserve.ConstantArrivals(200)
    )
    capsys.readouterr()
    new = _runner()
    said = capsys.readouterr().err
    assert re.fullmatch(
        r"labserve: replaced runner 'm': the old one is stopped \(stopped with it: "
        r"load 'm\.predict #\d+', server 'http://127\.0\.0\.1:\d+'\)\n",
        said,
    ), said
    assert old.stopped and not new.stopped
    assert repr(server).startswith("<labserve.Server stopped")
    run.result(timeout=30)  # its sending stopped: the run ends
    assert new.predict.run(X).shape == (1, 1)
    assert session.running() == [("runner", "m")]


def test_one_runner_may_be_served_twice(capsys):
    runner = _runner()
    first, second = labserve.serve(runner), labserve.serve(runner)
    assert "listening" in repr(first) and "listening" in repr(second)
    assert capsys.readouterr().err == ""
    _runner()  # replacing the runner ends both
    assert "stopped" in repr(first) and "stopped" in repr(second)


def test_other_names_live_side_by_side(capsys):
    a, b = _runner("a"), _runner("b")
    assert not (a.stopped or b.stopped)
    assert capsys.readouterr().err == ""


def test_stop_all_stops_loads_then_servers_then_runners():
    runner = _runner()
    server = labserve.serve(runner)
    run = labserve.start_load(
        runner.predict, example=X, duration_s=60, arrivals=labserve.ConstantArrivals(200)
    )
    stopped = labserve.stop_all()
    assert stopped[0].startswith("load 'm.predict #")
    assert stopped[1:] == [f"server {server.url!r}", "runner 'm'"]
    assert runner.stopped and "stopped" in repr(server) and not run.running
    assert labserve.stop_all() == []  # twice: nothing left


def test_what_stopped_by_itself_is_forgotten():
    runner = _runner()
    # Closed loop: it has no send schedule to fall behind, so a busy machine cannot make
    # it warn (an open loop at 100 req/s did: one send 7 ms late is a LoadWarning). The
    # run is tracked and forgotten the same way.
    labserve.load_test(runner.predict, example=X, duration_s=0.05, concurrency=1)
    runner.stop()
    assert session.running() == []
