"""Re-running a dashboard's cells leaves no ghost; a closed dashboard's page says it is closed."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from labserve.widgets import Dashboard

import labserve
from labserve.lab.demo import SleepModel

X = np.ones((1, 4))


@pytest.fixture(autouse=True)
def nothing_left() -> Iterator[None]:
    labserve.stop_all()
    yield
    labserve.stop_all()


def _runner() -> labserve.Runner:
    return labserve.Runner(SleepModel(a_ms=0.5, b_ms=0.01), name="m")


def test_a_dashboard_on_the_same_method_replaces_the_old_one(capsys):
    runner = _runner()
    old = Dashboard(runner, example=X, hz=20)
    view = old.view()
    capsys.readouterr()
    new = Dashboard(runner, example=X, hz=20)
    assert (
        capsys.readouterr().err
        == "labserve: replaced dashboard 'm.predict': the old one is stopped\n"
    )
    assert not old.pump.running and new.pump.running
    # The old view on the page says so instead of showing controls that do nothing.
    assert len(view.children) == 1 and "closed" in view.children[0].value


def test_re_running_the_whole_lesson_stops_the_old_runner_server_dashboard_and_load(capsys):
    runner = _runner()
    server = labserve.serve(runner)
    dash = Dashboard(server, example=X, hz=20)
    dash.controls["rate"].value = "200"
    dash.controls["start"].value = True
    assert dash.load.run is not None and dash.load.run.running
    capsys.readouterr()
    _runner()  # the first cell again
    said = capsys.readouterr().err
    assert said.startswith(
        "labserve: replaced runner 'm': the old one is stopped (stopped with it:"
    )
    assert (
        "dashboard 'm.predict'" in said
        and f"server {server.url!r}" in said
        and "load 'm.predict #" in said
    )
    assert runner.stopped and not dash.pump.running and "stopped" in repr(server)
