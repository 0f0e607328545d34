"""The dashboard for a method with a ragged axis: tokens per batch, padding, and their knobs."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from labserve.widgets import Dashboard
from labserve.widgets.tokencontrols import format_buckets, parse_buckets
from labserve.widgets.tokens import TOKEN_COLUMNS, TokenSeries, token_numbers

import labserve
from labserve.lab.demo import SleepModel

IDS = np.ones((1, 8), dtype=np.int64)


class Tokens(labserve.Runnable):
    """A padded model costing its padded tokens (a sleep): each row's sum of its own ids."""

    @labserve.method(
        batchable=True,
        pad=labserve.Padding(axis=1, pad_value=0, lengths_arg=None),
        max_batch_size=64,
        max_latency_ms=5,
    )
    def encode(self, ids: np.ndarray) -> np.ndarray:
        # 0.01 ms a padded token: a batch of 4-12 rows 96-160 wide sleeps 4-19 ms, well above
        # a loaded machine's wake-up jitter (1-3 ms at load 10), which decided the fit when a
        # token cost a fifth of this (the cost-line test failed at load 10+).
        time.sleep((0.2 + 0.01 * ids.size) / 1000.0)
        return np.asarray(ids.sum(axis=1, keepdims=True))


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll a condition the pump or the load will make true (not a timing assertion)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


@pytest.fixture
def runner() -> Iterator[labserve.Runner]:
    r = labserve.Runner(Tokens, name="tok")
    yield r
    r.stop(timeout=10)


@pytest.fixture
def dash(runner: labserve.Runner) -> Iterator[Dashboard]:
    d = Dashboard(runner, example=IDS, hz=20)
    yield d
    d.close()


def _batch(tokens: int, padding: int) -> labserve.BatchRecord:
    return labserve.BatchRecord(0.0, 0.001, 1, 1, "full", tokens, padding)


def test_token_series_counts_the_batches_of_the_last_second(runner):
    base = runner.encode.stats()
    series = TokenSeries(window_s=1.0)

    def look(time_s: float, batches: int, recent: list[labserve.BatchRecord]) -> dict:
        snap = dataclasses.replace(base, time_s=time_s, batches=batches,
                                   recent_batches=tuple(recent))  # fmt: skip
        return series.update(snap)

    first = look(0.0, 2, [_batch(100, 90), _batch(100, 90)])  # fired before the first look
    assert set(first) == set(TOKEN_COLUMNS) and math.isnan(first["tokens_per_batch"][0])
    row = look(0.5, 4, [_batch(100, 90), _batch(100, 90), _batch(64, 48), _batch(32, 0)])
    assert row == {"tokens_per_batch": [48.0], "padding_pct": [50.0]}
    row = look(1.6, 5, [_batch(64, 48), _batch(32, 0), _batch(16, 0)])  # only the new one
    assert row == {"tokens_per_batch": [16.0], "padding_pct": [0.0]}  # the others aged out
    assert series.recent is not None and series.recent.batches == 1
    row = look(1.7, 1, [_batch(10, 5)])  # the stats were reset: count from here
    assert math.isnan(row["tokens_per_batch"][0])
    assert look(1.8, 2, [_batch(10, 5), _batch(20, 5)]) == {
        "tokens_per_batch": [20.0],
        "padding_pct": [25.0],
    }


def test_a_model_slower_than_the_window_shows_its_last_batch_for_a_while(runner):
    base = runner.encode.stats()
    series = TokenSeries(window_s=1.0, hold_s=10.0)

    def look(time_s: float, batches: int, recent: list[labserve.BatchRecord]) -> dict:
        snap = dataclasses.replace(base, time_s=time_s, batches=batches,
                                   recent_batches=tuple(recent))  # fmt: skip
        return series.update(snap)

    look(0.0, 0, [])
    assert look(0.2, 1, [_batch(1600, 1200)]) == {"tokens_per_batch": [1600.0],
                                                   "padding_pct": [75.0]}  # fmt: skip
    assert look(2.7, 1, [_batch(1600, 1200)])["padding_pct"] == [75.0]  # none since: held
    assert series.recent is not None and series.recent.age_s == pytest.approx(2.5)
    assert "last batch, 2.5 s ago" in token_numbers(series.recent, base.config)
    assert math.isnan(look(10.3, 1, [_batch(1600, 1200)])["padding_pct"][0])  # too old


def test_token_numbers_say_what_padding_costs_and_the_budget():
    config = labserve.BatchingConfig(max_batch_tokens=4096)
    assert "padding <b>-</b>" in token_numbers(None, config)
    series = TokenSeries()
    assert "of 4,096" in token_numbers(series.recent, config)


def test_buckets_text_round_trips():
    assert parse_buckets("16, 32 64") == [16, 32, 64]
    assert parse_buckets(" ") == []
    assert format_buckets((16, 32)) == "16, 32"
    with pytest.raises(ValueError, match="length_buckets must be integers"):
        parse_buckets("16, lots")


def test_a_ragged_method_gets_the_token_chart_controls_and_length_mix(dash):
    assert "tokens" in dash.charts.figures
    assert set(TOKEN_COLUMNS) <= set(dash.charts.ticks.data)
    for key in ("length_buckets", "max_batch_tokens", "padding", "input_len"):
        assert key in dash.controls


def test_a_method_without_a_ragged_axis_gets_none_of_it():
    r = labserve.Runner(SleepModel(a_ms=0.1, b_ms=0.0), name="plain")
    d = Dashboard(r, example=np.ones((1, 4)), hz=20)
    try:
        assert "tokens" not in d.charts.figures and d.tokens is None
        assert "length_buckets" not in d.controls and "input_len" not in d.controls
        assert not set(TOKEN_COLUMNS) & set(d.charts.ticks.data)
    finally:
        d.close()
        r.stop(timeout=10)


def test_the_token_controls_configure_the_runner(dash, runner):
    dash.controls["length_buckets"].value = "16, 32, 64"
    assert runner.encode.config.length_buckets == (16, 32, 64)
    dash.controls["max_batch_tokens"].value = "2048"
    assert runner.encode.config.max_batch_tokens == 2048
    dash.controls["padding"].value = False
    assert runner.encode.config.padding is False
    dash.controls["length_buckets"].value = ""
    assert runner.encode.config.length_buckets == ()
    wait_for(lambda: "max_batch_tokens: 2048" in dash.controls["export"].value)


@pytest.mark.parametrize(
    ("key", "text", "message"),
    [
        ("length_buckets", "64, 16", "length_buckets must be a list of at most 64 increasing"),
        ("length_buckets", "16, lots", "length_buckets must be integers"),
        ("max_batch_tokens", "-1", "max_batch_tokens must be an integer >= 0"),
        ("max_batch_tokens", "lots", "max_batch_tokens must be an integer, got 'lots'"),
    ],
)
def test_a_bad_token_setting_says_why_and_changes_nothing(dash, runner, key, text, message):
    before = runner.encode.config
    dash.controls[key].value = text
    assert runner.encode.config == before
    assert message in dash.errors[key].value.replace("&#x27;", "'").replace("&gt;", ">")
    shown = format_buckets(before.length_buckets) if key == "length_buckets" else "0"
    assert dash.controls[key].value == shown  # back to what holds


def test_the_token_controls_follow_a_change_made_elsewhere(dash, runner):
    runner.configure("encode", length_buckets=[8, 128], max_batch_tokens=512, padding=False)
    wait_for(lambda: dash.controls["length_buckets"].value == "8, 128")
    assert dash.controls["max_batch_tokens"].value == "512"
    assert dash.controls["padding"].value is False


def test_a_length_mix_from_the_load_panel_shows_tokens_and_padding(dash, runner):
    dash.controls["duration"].value = "1"
    dash.controls["rate"].value = "400"
    dash.controls["input_len"].value = "lognormal:16:128"
    dash.controls["start"].value = True
    assert dash.errors["load"].value == ""
    wait_for(lambda: runner.encode.stats().padding_tokens_total > 0)  # lengths did differ
    ticks = dash.charts.ticks.data
    wait_for(lambda: any(math.isfinite(v) and v > 0 for v in ticks["padding_pct"]))
    wait_for(lambda: "padding <b>-</b>" not in dash.tokens.readout.value)
    assert all(0 <= v <= 100 for v in ticks["padding_pct"] if math.isfinite(v))


def test_a_bad_length_mix_is_shown_and_starts_nothing(dash, runner):
    dash.controls["input_len"].value = "nonsense:1"
    dash.controls["start"].value = True
    assert "is not a length spec" in dash.errors["load"].value
    assert dash.load.run is None and dash.controls["start"].value is False
    assert runner.encode.stats().admitted == 0


def test_a_server_by_url_gets_the_token_view_when_asked(runner):
    server = labserve.serve(runner)
    try:
        plain = Dashboard(server.url, token=server.token)
        plain.close()
        assert plain.tokens is None  # a URL's ragged axis is not known here
        d = Dashboard(server.url, example=IDS, hz=20, tokens=True, token=server.token)
        try:
            d.controls["length_buckets"].value = "16, 64"  # through PATCH /config
            assert runner.encode.config.length_buckets == (16, 64)
            d.controls["duration"].value = "1"
            d.controls["rate"].value = "200"
            d.controls["start"].value = True  # the HTTP load generator sends the length mix
            assert d.errors["load"].value == ""
            wait_for(lambda: runner.encode.stats().padding_tokens_total > 0)
            wait_for(lambda: "padding <b>-</b>" not in d.tokens.readout.value)
        finally:
            d.close()
    finally:
        server.stop()


def test_a_padded_models_cost_line_runs_through_its_batches(dash, runner):
    # Its cost is almost all per padded token: a line of the fit's fixed and per-item parts
    # alone ran far below every point. Batches of 4-12 items, 96-160 tokens wide.
    rng = np.random.default_rng(0)
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        for _ in range(40):
            widths = rng.integers(96, 161, size=int(rng.integers(4, 13)))
            ids = [np.ones((1, int(n)), dtype=np.int64) for n in widths]
            list(pool.map(runner.encode.run, ids, timeout=10))
    fit = runner.encode.stats().cost_fit

    def drawn() -> bool:
        # The chart shows the fit of the runner's latest snapshot: at load 15 a pump's look
        # taken before the last batches were counted titled 148 tokens/item against 150.
        nonlocal fit
        fit = runner.encode.stats().cost_fit
        with dash.pump.lock:
            title = dash.charts.figures["cost"].title.text
            return len(dash.charts.fit_line.data["items"]) == 2 and (
                f"at {fit.width:.0f} tokens/item" in title
            )

    wait_for(drawn)
    assert fit.c_ms > 0 and fit.width > 90  # the per-token part the line must include
    with dash.pump.lock:
        line = dict(dash.charts.fit_line.data)
        points = dict(dash.charts.fit_points.data)
        title = dash.charts.figures["cost"].title.text
    slope = (line["duration_ms"][1] - line["duration_ms"][0]) / (
        line["items"][1] - line["items"][0]
    )
    items, ms = np.asarray(points["items"]), np.asarray(points["duration_ms"])
    at_median = line["duration_ms"][0] + slope * (np.median(items) - line["items"][0])
    assert 0.5 < at_median / np.median(ms) < 2.0, (line, title)
    assert f"at {fit.width:.0f} tokens/item" in title
