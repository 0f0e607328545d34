"""Every request that got no result shows, by kind, as RunResult.summary() and /metrics count it."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from bokeh.models import Div
from labserve.widgets import Charts
from labserve.widgets.dashboard import _numbers
from labserve.widgets.series import LiveSeries, result_rows
from prometheus_client import CollectorRegistry, generate_latest

import labserve
from labserve.metrics.prometheus import SnapshotCollector

X = np.ones((1, 4))


class Gate(labserve.Runnable):
    """A model that holds its batch until the test opens the gate."""

    def __init__(self) -> None:
        self.open = threading.Event()

    @labserve.method(batchable=True, batch_dim=0, max_batch_size=1, max_latency_ms=1)
    def predict(self, x: np.ndarray) -> np.ndarray:
        self.open.wait(10)
        return np.asarray(x).sum(axis=1)


@pytest.fixture
def gated() -> Iterator[tuple[labserve.Runner, Gate]]:
    model = Gate()
    runner = labserve.Runner(model, name="gated", max_queue_size=2)
    yield runner, model
    model.open.set()
    runner.stop(timeout=10)


def test_refusals_at_a_full_queue_show_in_the_numbers_line_and_the_rows(gated):
    runner, model = gated
    series = LiveSeries(window_s=1e9)  # one span: the whole test
    series.update(runner.predict.stats())

    def until(condition: Callable[[], bool]) -> None:
        """Poll for a state the runner will reach (not a timing assertion)."""
        end = time.monotonic() + 10.0
        while not condition():
            assert time.monotonic() < end, "condition not reached in time"
            time.sleep(0.01)

    def call() -> object:
        try:
            return runner.predict.run(X)
        except labserve.LabServeError as exc:
            return exc

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        calls = [pool.submit(call)]
        until(lambda: runner.predict.stats().in_flight_batches == 1)  # it holds the model
        # Two wait in the queue; the other five are refused at admission.
        calls += [pool.submit(call) for _ in range(7)]
        until(lambda: runner.predict.stats().refused == 5)
        model.open.set()
        outcomes = [c.result() for c in calls]
    refused = [o for o in outcomes if isinstance(o, labserve.QueueFullError)]
    assert len(refused) == runner.predict.stats().refused == 5
    tick = series.update(runner.predict.stats())
    recent = series.recent
    assert recent is not None
    assert recent.refused_pct == pytest.approx(100.0 * 5 / 8)  # of all 8 that ended
    assert recent.rejected_pct == recent.refused_pct  # summary(): rejected_pct counts refusals
    assert tick["refused_rps"][0] == pytest.approx(5 / recent.span_s)
    line = _numbers(runner.predict.stats(), recent)
    assert "rejected <b>62.5%</b> (" in line and "refused</span> 62.5%)" in line
    assert "timed out" not in line and "failed" not in line  # none: the line stays short
    # /metrics counts the same five under the same name.
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: [runner.predict.stats()]))
    text = generate_latest(registry).decode()
    assert 'labserve_requests_total{method="predict",outcome="refused",runner="gated"} 5.0' in text


def test_each_kind_is_its_own_share_of_what_ended(gated):
    runner, _ = gated
    series = LiveSeries(window_s=1e9)
    before = runner.predict.stats()
    series.update(before)
    after = dataclasses.replace(
        before, time_s=before.time_s + 2.0, served=10, refused=60, rejected=20, timeout=6,
        failed=4, admitted=40,
    )  # fmt: skip
    tick = series.update(after)
    recent = series.recent
    assert recent is not None
    assert (recent.rejected_pct, recent.refused_pct) == (80.0, 60.0)
    assert (recent.timeout_pct, recent.failed_pct) == (6.0, 4.0)
    kinds = ("served", "refused", "rejected", "timeout", "failed")
    assert [tick[f"{k}_rps"][0] for k in kinds] == [5.0, 30.0, 10.0, 3.0, 2.0]  # per second
    line = _numbers(after, recent)
    for text in ("rejected <b>80.0%</b>", "refused</span> 60.0%", "timed out <b>6.0%</b>",
                 "failed <b>4.0%</b>"):  # fmt: skip
        assert text in line


def test_a_finished_run_shows_each_kind_its_summary_counts():
    result = labserve.simulate(
        labserve.ConstantArrivals(3000), duration_s=1.0, cost=(2.0, 0.5), max_batch_size=4,
        max_latency_ms=5, max_queue_size=50, request_timeout_ms=30,
    )  # fmt: skip
    tick = result_rows(result, bin_s=0.1)
    counts = {k: round(sum(tick[f"{k}_rps"]) * 0.1) for k in ("refused", "rejected", "timeout")}
    code = labserve.OUTCOMES.index
    assert counts == {k: int((result.outcome == code(k)).sum()) for k in counts}
    assert counts["refused"] > 0 and counts["timeout"] > 0  # the case this test is about
    s = result.summary()
    n = len(result.outcome)
    assert 100.0 * (counts["refused"] + counts["rejected"]) / n == pytest.approx(s["rejected_pct"])
    assert 100.0 * counts["timeout"] / n == pytest.approx(s["timeout_pct"])


def test_the_throughput_chart_draws_each_kind():
    charts = Charts()
    drawn = [r.glyph.y for r in charts.figures["throughput"].renderers]
    assert drawn == ["served_rps", "refused_rps", "rejected_rps", "timeout_rps", "failed_rps"]
    keys = [d.text for d in charts.layout.select({"type": Div})]
    assert any("refused (queue full)" in k and "timed out" in k for k in keys)


def test_each_key_sits_under_its_own_chart():
    charts = Charts()
    for cell in charts.layout.children:
        column = cell[0]
        fig, key = column.children
        assert fig in charts.figures.values() and isinstance(key, Div)


def test_a_negative_fixed_cost_says_so_and_the_title_fits():
    charts = Charts()
    items = [2.0, 4.0, 8.0] * 20
    ms = [0.5 * n for n in items]
    ms[5] = 136.0
    charts.show_fit(items, ms, -12.25, 1.1234, cap=64.0)
    title = charts.figures["cost"].title.text
    assert "(a < 0: for 2-8 only)" in title and len(title) <= 60


def test_a_long_refusal_wraps_instead_of_pushing_the_load_controls_away(gated):
    from labserve.widgets import Dashboard
    from labserve.widgets.controls_base import ERROR_WIDTH

    runner, _ = gated
    dash = Dashboard(runner, example=X, hz=20)
    try:
        dash.controls["max_batch_size_text"].value = "not a number at all " * 5
        shown = dash.errors["max_batch_size"]
        assert "max_batch_size must be" in shown.value
        assert shown.layout.max_width == ERROR_WIDTH
    finally:
        dash.close()
