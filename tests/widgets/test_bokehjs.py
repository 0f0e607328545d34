"""How BokehJS reaches a page: in a hidden widget shown before every chart, never as an output."""

from __future__ import annotations

from typing import Any

import pytest
from labserve.widgets import bokehjs, load_bokehjs, plot_sweep

import labserve

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class Shell:
    """IPython's shell as ipykernel's: the running cell's request (its id, the run's)."""

    def __init__(self) -> None:
        self.parent: dict[str, Any] = {}

    def run(self, cell: str, run: str) -> None:
        self.parent = {"header": {"msg_id": run}, "metadata": {"cellId": cell}}

    def get_parent(self) -> dict[str, Any]:
        return self.parent


@pytest.fixture
def shown(monkeypatch) -> list[Any]:
    out: list[Any] = []
    monkeypatch.setattr(bokehjs, "display", out.append)
    monkeypatch.setattr(bokehjs, "_shown_by_cell", {})
    return out


@pytest.fixture
def shell(monkeypatch) -> Shell:
    fake = Shell()
    monkeypatch.setattr(bokehjs, "get_ipython", lambda: fake)
    return fake


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return labserve.sweep(rates=[500, 2000], max_batch_size=[8], duration_s=0.2, seed=3)


def test_a_static_chart_shows_bokehjs_in_a_widget_before_itself(shown, rows):
    chart = plot_sweep(rows, x="rate", y="latency_p99_ms")
    bundle = chart._repr_mimebundle_()
    (carrier,) = shown
    assert WIDGET_VIEW in bundle and bokehjs.LOAD_MIME not in bundle
    assert bundle["text/plain"] == "ChartWidget(figure)"  # no random ids in a saved notebook
    # The chart one widget deeper (in a box), as a dashboard's: a reloaded page makes it after
    # the carrier's script has run.
    (box,) = (s for s in chart._shown if s is not carrier)
    assert bundle[WIDGET_VIEW]["model_id"] == box.model_id and box.children == (chart,)
    assert not any("bokeh.min.js" in str(v) for v in bundle.values())  # none in the notebook
    assert "/* BEGIN bokeh.min.js */" in carrier.outputs[0]["data"][bokehjs.LOAD_MIME]
    assert carrier.layout.display == "none" and repr(carrier).startswith("BokehJS ")
    # Every display: a page reloaded, or a second tab, that shows it gets BokehJS again.
    chart._repr_mimebundle_()
    assert len(shown) == 2 and shown[1] is not carrier
    chart.close()
    assert all(c.comm is None for c in [*shown, box])  # closed with the chart
    chart.close()  # idempotent


def test_a_cell_run_again_closes_the_carriers_of_its_earlier_run(shown, shell, rows):
    shell.run("cell-a", "run-1")
    first = plot_sweep(rows, x="rate", y="latency_p99_ms")
    first._repr_mimebundle_()
    first._repr_mimebundle_()  # two in one run: both stay
    shell.run("cell-b", "run-2")
    other = plot_sweep(rows, x="rate", y="latency_p99_ms")
    other._repr_mimebundle_()
    assert all(c.comm is not None for c in shown)
    shell.run("cell-a", "run-3")  # cell a again: its old outputs are gone from the page
    first._repr_mimebundle_()
    assert [c.comm is None for c in shown] == [True, True, False, False]
    for chart in (first, other):
        chart.close()


def test_without_a_cell_id_nothing_is_closed_until_the_chart_is(shown, shell, rows):
    shell.parent = {"header": {"msg_id": "run-1"}, "metadata": {}}  # nbclient sends none
    chart = plot_sweep(rows, x="rate", y="latency_p99_ms")
    chart._repr_mimebundle_()
    shell.parent = {"header": {"msg_id": "run-2"}, "metadata": {}}
    chart._repr_mimebundle_()
    assert all(c.comm is not None for c in shown)
    chart.close()


def test_load_bokehjs_shows_the_same_widget_each_call(shown):
    load_bokehjs()
    load_bokehjs()
    assert len(shown) == 2
    assert all(bokehjs.LOAD_MIME in c.outputs[0]["data"] for c in shown)
    for carrier in shown:
        carrier.close()
