"""The generation dashboard headless: rows from snapshots, controls, load, close, a URL."""

from __future__ import annotations

import dataclasses
import html
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from bokeh.document import Document
from labserve.widgets import Dashboard, GenerationDashboard
from labserve.widgets.generation.charts import GenerationCharts
from labserve.widgets.generation.loadpanel import GenerationLoadControls
from labserve.widgets.generation.pump import GenerationPump
from labserve.widgets.generation.series import GEN_COLUMNS, GenerationSeries

import labserve
from labserve.generation.results import StepSeries
from labserve.lab.demo import TinyLM


def wait_for(condition: Callable[[], Any], timeout: float = 20.0) -> None:
    """Poll a condition the pump or the loop will make true (not a timing assertion)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def steps(*rows: tuple[float, int, int]) -> StepSeries:
    """Steps ending at each ``(end_s, prefill tokens, decode tokens)``."""
    n = len(rows)
    end = np.array([r[0] for r in rows], dtype=np.float64)
    zeros = np.zeros(n, np.int64)
    return StepSeries(
        start_s=end - 0.001,
        end_s=end,
        num_seqs=zeros + 1,
        num_prefill_tokens=np.array([r[1] for r in rows], dtype=np.int64),
        num_decode_tokens=np.array([r[2] for r in rows], dtype=np.int64),
        num_running=zeros,
        num_waiting=zeros,
        kv_blocks_used=zeros,
        num_preempted=zeros,
        num_context_tokens=zeros,
    )


def snapshot(
    time_s: float,
    step_rows: tuple[tuple[float, int, int], ...] = (),
    *,
    preemptions: int = 0,
    served: int = 0,
    config: labserve.GenerationConfig | None = None,
    ttft_p99: float = math.nan,
    goodput: float = 0.0,
) -> labserve.GenerationSnapshot:
    nan = math.nan
    percentiles = {m: {"p50": nan, "p90": nan, "p95": nan, "p99": nan} for m in
                   ("ttft", "itl", "tpot", "e2e")}  # fmt: skip
    percentiles["ttft"]["p99"] = ttft_p99
    return labserve.GenerationSnapshot(
        runner="lm", method="generate", time_s=time_s,
        config=config or labserve.GenerationConfig(), num_running=3, num_waiting=5,
        kv_blocks_used=40, outcomes={"served": served}, num_preemptions=preemptions,
        prompt_tokens=0, output_tokens=0, window_s=10.0, percentiles_ms=percentiles,
        output_tokens_per_s=100.0, prompt_tokens_per_s=50.0, requests_per_s=2.0,
        goodput=goodput, steps=steps(*step_rows), histograms={},
    )  # fmt: skip


def test_each_step_is_counted_in_one_row_and_an_idle_method_shows_none():
    series = GenerationSeries()
    first = series.update(snapshot(100.0, ((99.9, 64, 0), (100.0, 0, 2))))
    assert set(first) == set(GEN_COLUMNS)
    assert first["t"] == [0.0]
    assert first["prefill_per_step"] == [32.0] and first["decode_per_step"] == [1.0]
    assert first["steps"] == [2.0]
    # One new step since: only it counts.
    row = series.update(snapshot(100.2, ((99.9, 64, 0), (100.0, 0, 2), (100.1, 0, 4))))
    assert row["prefill_per_step"] == [0.0] and row["decode_per_step"] == [4.0]
    assert row["steps"] == [1.0]
    # The method went idle: the same steps again are not new; the row says none.
    idle = series.update(snapshot(100.4, ((99.9, 64, 0), (100.0, 0, 2), (100.1, 0, 4))))
    assert math.isnan(idle["prefill_per_step"][0]) and math.isnan(idle["decode_per_step"][0])
    assert idle["steps"] == [0.0]
    assert idle["num_running"] == [3.0] and idle["num_waiting"] == [5.0]  # the state now


def test_preemptions_are_counted_over_the_last_second_and_a_reset_starts_over():
    series = GenerationSeries()
    assert math.isnan(series.update(snapshot(0.0, preemptions=10, served=5))["preempted"][0])
    assert series.update(snapshot(0.5, preemptions=13, served=6))["preempted"] == [3.0]
    assert series.update(snapshot(1.0, preemptions=14, served=7))["preempted"] == [4.0]
    assert series.update(snapshot(2.0, preemptions=14, served=8))["preempted"] == [0.0]
    # Reset: the counters went down; the old count is not subtracted from the new one.
    reset = series.update(snapshot(2.2, ((2.1, 0, 1),), preemptions=1, served=0))
    assert math.isnan(reset["preempted"][0])
    assert reset["steps"] == [1.0]


def test_targets_limits_and_goodput_are_gaps_when_not_set():
    series = GenerationSeries()
    row = series.update(snapshot(0.0, goodput=1.5))
    for column in ("ttft_slo_ms", "tpot_slo_ms", "num_kv_blocks", "goodput"):
        assert math.isnan(row[column][0]), column
    config = labserve.GenerationConfig(ttft_slo_ms=300, tpot_slo_ms=30, num_kv_blocks=512,
                                       max_num_seqs=8)  # fmt: skip
    row = series.update(snapshot(0.2, config=config, goodput=1.5, ttft_p99=250.0))
    assert row["ttft_slo_ms"] == [300.0] and row["tpot_slo_ms"] == [30.0]
    assert row["num_kv_blocks"] == [512.0] and row["max_num_seqs"] == [8.0]
    assert row["goodput"] == [1.5] and row["ttft_p99"] == [250.0]


class ScriptedSource:
    """A GenerationSource whose snapshots a test hands out, one per view."""

    resettable = False

    def __init__(self, snaps: list[labserve.GenerationSnapshot]) -> None:
        self.name, self.runner, self.method = "lm.generate", "lm", "generate"
        self._snaps = snaps
        self.views = 0
        self.config = labserve.GenerationConfig()
        self.alive = True

    def view(self) -> labserve.GenerationView:
        snap = self._snaps[min(self.views, len(self._snaps) - 1)]
        self.views += 1
        return labserve.GenerationView(snap, self.config)

    def configure(self, **changes: Any) -> labserve.GenerationConfig:
        self.config = self.config.replace(**changes)
        return self.config

    def reset_stats(self) -> None:
        raise TypeError("no")

    def start_load(self, **kwargs: Any) -> Any:
        raise labserve.LoadTargetError("scripted", "no load here")


def test_the_pump_streams_one_row_per_view_and_none_after_stop():
    snaps = [snapshot(float(k), ((float(k), 16 * k, k),)) for k in range(1, 6)]
    source = ScriptedSource(snaps)
    charts, doc = GenerationCharts(hz=50), Document()
    doc.add_root(charts.layout)
    pump = GenerationPump(charts, doc, lambda: source, hz=50)
    wait_for(lambda: len(charts.ticks.data["t"]) >= 5)
    pump.stop()
    data = charts.ticks.data
    assert data["t"][:5] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert data["prefill_per_step"][:5] == [16.0, 32.0, 48.0, 64.0, 80.0]
    # The last snapshot handed out again: no new step, so no tokens per step.
    assert all(math.isnan(v) for v in data["decode_per_step"][5:])
    n = len(data["t"])
    time.sleep(0.1)  # the thread is joined: nothing writes any more
    assert len(charts.ticks.data["t"]) == n and not pump.running
    assert pump.errors == 0


def test_a_second_pump_on_the_same_document_is_refused():
    source = ScriptedSource([snapshot(1.0)])
    charts, doc = GenerationCharts(), Document()
    doc.add_root(charts.layout)
    pump = GenerationPump(charts, doc, lambda: source, hz=10)
    try:
        with pytest.raises(RuntimeError, match="already has a pump"):
            GenerationPump(charts, doc, lambda: source, hz=10)
    finally:
        pump.stop()


@pytest.fixture
def lm() -> Iterator[labserve.Runner]:
    r = labserve.Runner(TinyLM(d_model=32, n_layers=1, d_ff=64, max_model_len=256), name="lm")
    yield r
    r.stop(timeout=10)


@pytest.fixture
def dash(lm: labserve.Runner) -> Iterator[GenerationDashboard]:
    d = GenerationDashboard(lm, hz=20, input_len="uniform:4:16", output_len="uniform:4:32")
    yield d
    d.close()


def test_moving_a_control_configures_the_method_and_a_change_elsewhere_shows(dash, lm):
    c = dash.controls
    c["max_num_seqs"].value = 4
    assert lm.generate.config.max_num_seqs == 4
    c["max_num_batched_tokens_text"].value = "100"
    assert lm.generate.config.max_num_batched_tokens == 100
    assert c["max_num_batched_tokens"].value == 128  # the slider shows the nearest step
    c["enable_chunked_prefill"].value = False
    assert lm.generate.config.enable_chunked_prefill is False
    c["scheduling_policy"].value = "priority"
    assert lm.generate.config.scheduling_policy == "priority"
    c["strategy"].value = "static"
    assert lm.generate.config.strategy == "static"
    c["ttft_slo_ms_text"].value = "300"
    c["tpot_slo_ms_text"].value = "30"
    assert (lm.generate.config.ttft_slo_ms, lm.generate.config.tpot_slo_ms) == (300, 30)
    # TinyLM stores K/V in labserve's blocks: its pool is sized at start, refused live.
    c["num_kv_blocks_text"].value = "64"
    assert "start-time setting" in html.unescape(dash.errors["num_kv_blocks"].value)
    assert lm.generate.config.num_kv_blocks == 0
    # From a cell: the pump's next look brings the controls along.
    lm.generate.configure(max_num_seqs=16, strategy="continuous")
    wait_for(lambda: c["max_num_seqs"].value == 16 and c["strategy"].value == "continuous")
    assert c["max_num_seqs_text"].value == "16"


@pytest.mark.parametrize(
    ("key", "text", "message"),
    [
        ("max_num_seqs", "0", "max_num_seqs"),
        ("max_num_seqs", "many", "max_num_seqs must be an integer, got 'many'"),
        ("tpot_slo_ms", "-1", "tpot_slo_ms"),
        ("num_kv_blocks", "1.5", "num_kv_blocks must be an integer, got '1.5'"),
    ],
)
def test_a_refused_value_says_why_and_changes_nothing(dash, lm, key, text, message):
    before = lm.generate.config
    dash.controls[f"{key}_text"].value = text
    assert message in html.unescape(dash.errors[key].value)
    assert lm.generate.config == before
    assert dash.controls[f"{key}_text"].value == f"{getattr(before, key):g}"


def test_the_load_control_sends_until_stopped_and_the_charts_follow(dash, lm):
    c = dash.controls
    c["rate"].value = "40"
    c["start"].value = True
    assert dash.errors["load"].value == ""
    run = dash.load.run
    assert run is not None
    wait_for(lambda: lm.generate.stats().outcomes["served"] >= 5)
    wait_for(lambda: np.nansum(dash.charts.ticks.data["decode_per_step"]) > 0)
    wait_for(lambda: "sent" in dash.status.value and "tokens/s" in dash.status.value)
    c["start"].value = False
    assert dash.load.run is None and not c["start"].value
    wait_for(lambda: not run.running)
    sent = run.sent
    wait_for(lambda: lm.generate.stats().num_running == 0)  # what was in flight is freed
    time.sleep(0.2)
    assert run.sent == sent  # nothing more is sent


def test_a_bad_length_mix_is_refused_with_its_reason(dash):
    dash.controls["output_len"].value = "lognormal:64"
    dash.controls["start"].value = True
    assert "output tokens 'lognormal:64' is not a length spec" in html.unescape(
        dash.errors["load"].value
    )
    assert dash.load.run is None and not dash.controls["start"].value


def test_close_stops_the_load_and_the_pump_and_nothing_writes_after(lm):
    d = GenerationDashboard(lm, hz=20, input_len="8", output_len="8")
    d.controls["rate"].value = "20"
    d.controls["start"].value = True
    run = d.load.run
    wait_for(lambda: len(d.charts.ticks.data["t"]) > 3)
    d.close()
    d.close()  # idempotent
    assert not d.pump.running and d.load.run is None
    assert run is not None
    wait_for(lambda: not run.running)
    n = len(d.charts.ticks.data["t"])
    time.sleep(0.3)
    assert len(d.charts.ticks.data["t"]) == n


def test_a_runner_with_only_a_generator_points_the_request_dashboard_here(lm):
    with pytest.raises(ValueError, match="GenerationDashboard"):
        Dashboard(lm)


def test_the_snapshot_survives_the_trip_through_stats(lm):
    lm.generate.run([1, 2, 3], max_tokens=5, temperature=0)
    shared = list(range(1, 40))  # two full blocks of 16 shared: the second prompt hits them
    lm.generate.run([*shared, 7], max_tokens=2, temperature=0)
    lm.generate.run([*shared, 9], max_tokens=2, temperature=0)
    snap = lm.generate.stats()
    back = labserve.generation_snapshot_from_dict(snap.as_dict())
    assert snap.prefix_cache_hits == 32 and snap.kv_blocks_cached > 0
    for name in ("prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate",
                 "prefill_tokens_saved_per_s", "kv_blocks_cached"):  # fmt: skip
        assert getattr(back, name) == pytest.approx(getattr(snap, name)), name
    assert back.config == snap.config
    assert back.outcomes == snap.outcomes and back.num_running == snap.num_running
    assert back.percentiles_ms["ttft"]["p50"] == pytest.approx(snap.percentiles_ms["ttft"]["p50"])
    assert back.steps.end_s.tolist() == snap.steps.end_s[-10:].tolist()
    assert back.steps.num_decode_tokens.tolist() == snap.steps.num_decode_tokens[-10:].tolist()


def test_by_url_the_dashboard_streams_configures_and_follows_patch_config(lm):
    server = labserve.serve(lm, port=0, token="secret")
    try:
        d = GenerationDashboard(server.url, token="secret", hz=10)
        try:
            assert d.method.name == "lm.generate" and not d.method.resettable
            assert d.controls["reset"].description == "clear charts"
            lm.generate.run([1, 2, 3], max_tokens=4, temperature=0)
            wait_for(lambda: np.nansum(d.charts.ticks.data["decode_per_step"]) > 0)
            d.controls["max_num_seqs"].value = 8  # PATCH /config with the token
            assert lm.generate.config.max_num_seqs == 8
            wait_for(lambda: d.charts.ticks.data["max_num_seqs"][-1:] == [8.0])
            lm.generate.configure(max_num_batched_tokens=256)  # elsewhere: the slider follows
            wait_for(lambda: d.controls["max_num_batched_tokens"].value == 256)
            # Load over /v1/completions (streamed), until stopped.
            served = lm.generate.stats().outcomes["served"]
            d.controls["input_len"].value, d.controls["output_len"].value = "8", "uniform:4:16"
            d.controls["rate"].value = "20"
            d.controls["start"].value = True
            assert d.errors["load"].value == ""
            run = d.load.run
            wait_for(lambda: lm.generate.stats().outcomes["served"] >= served + 5)
            d.controls["start"].value = False
            assert run is not None
            wait_for(lambda: not run.running)
        finally:
            d.close()
    finally:
        server.stop()


def test_until_stopped_chains_runs_and_stops_them_all():
    class Run:
        def __init__(self, seed: int) -> None:
            self.seed, self.sent, self.running = seed, seed + 1, True

        def stop(self) -> None:
            self.running = False

    started: list[Run] = []
    chained = threading.Event()

    def start(seed: int, duration_s: float) -> Run:
        started.append(Run(seed))
        if seed >= 2:
            chained.set()
        return started[-1]

    load = labserve.UntilStopped(start, chunk_s=0.01)
    assert chained.wait(10)
    load.stop()
    assert [r.seed for r in started[:3]] == [0, 1, 2]
    assert not any(r.running for r in started) and not load.running
    assert load.sent == sum(r.sent for r in started)


def test_a_new_dashboard_on_the_same_method_ends_the_old_one(lm):
    """A re-run cell: the old dashboard's pump and load do not live on beside the new one."""
    old = GenerationDashboard(lm, hz=10, input_len="8", output_len="8")
    shown = old.view()
    old.controls["start"].value = True
    run = old.load.run
    new = GenerationDashboard(lm, hz=10)
    try:
        assert not old.pump.running and old.load.run is None
        [note] = shown.children  # the old view says it is closed
        assert "closed" in note.value
        assert run is not None
        wait_for(lambda: not run.running)
        assert new.pump.running
    finally:
        new.close()


def test_a_stopped_runner_ends_the_pump_and_the_status_says_so():
    lm = labserve.Runner(TinyLM(d_model=32, n_layers=1, d_ff=64, max_model_len=64), name="lm2")
    d = GenerationDashboard(lm, hz=20)
    try:
        wait_for(lambda: len(d.charts.ticks.data["t"]) > 2)
        lm.stop(timeout=10)
        wait_for(lambda: not d.pump.running)
        assert "lm2.generate stopped" in d.status.value
    finally:
        d.close()


def test_each_display_brings_its_own_bokehjs_carrier_closed_with_the_dashboard(dash, monkeypatch):
    # A page reloaded and Run All at once cannot draw a widget the kernel made before; the
    # charts then had no BokehJS. Each display brings a new hidden carrier.
    shown: list[Any] = []
    monkeypatch.setattr("labserve.widgets.bokehjs.display", shown.append)
    bundle = dash._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    # No live numbers or state in a saved notebook (it said "(live)" before anything ran).
    assert (
        bundle["text/plain"]
        == f"<GenerationDashboard {dash.method.name}: live charts when its cell runs>"
    )
    assert "live)" in repr(dash)  # the object itself says what it is doing
    dash._repr_mimebundle_()
    assert len(shown) == 2 and shown[0] is not shown[1]
    assert all(c.layout.display == "none" for c in shown)
    dash.close()
    assert all(c.comm is None for c in shown)


def test_the_prefix_cache_columns_carry_the_snapshots_hit_rate_and_stop_when_caching_is_off():
    series = GenerationSeries()
    on = labserve.GenerationConfig(enable_prefix_caching=True)
    snap = dataclasses.replace(snapshot(0.0, config=on), prefix_cache_hit_rate=0.75,
                               prefill_tokens_saved_per_s=480.0, kv_blocks_cached=12)  # fmt: skip
    row = series.update(snap)
    assert row["prefix_hit_pct"] == [75.0] and row["prefill_saved_per_s"] == [480.0]
    assert row["kv_blocks_cached"] == [12.0]
    # No lookup in the window: a gap, not 0% (nothing was missed).
    row = series.update(dataclasses.replace(snap, time_s=0.2, prefix_cache_hit_rate=math.nan))
    assert math.isnan(row["prefix_hit_pct"][0])
    off = labserve.GenerationConfig(enable_prefix_caching=False)
    row = series.update(dataclasses.replace(snap, time_s=0.4, config=off))
    assert math.isnan(row["kv_blocks_cached"][0])


def test_the_prefix_caching_checkbox_configures_the_method_and_follows_a_change_elsewhere(dash, lm):
    box = dash.controls["enable_prefix_caching"]
    assert box.value is True  # TinyLM stores K/V in labserve's blocks: on by default
    box.value = False
    assert lm.generate.config.enable_prefix_caching is False
    assert "prefix caching off" in _status_when(dash, "prefix caching off")
    lm.generate.configure(enable_prefix_caching=True)  # from a cell: the box follows
    wait_for(lambda: box.value is True)
    assert dash.errors["enable_prefix_caching"].value == ""


def _status_when(dash: GenerationDashboard, text: str) -> str:
    wait_for(lambda: text in dash.status.value)
    return dash.status.value


def test_prefix_caching_is_refused_beside_the_box_for_a_model_with_its_own_caches():
    class OwnCaches(labserve.Runnable):
        @labserve.method(generative=True)
        def generate(self, batch: Any) -> Any:
            return np.zeros((batch.num_sampling, 4))

    own = labserve.Runner(OwnCaches, name="own_caches")
    d = GenerationDashboard(own, hz=10)
    try:
        box = d.controls["enable_prefix_caching"]
        assert box.value is False
        box.value = True
        assert "keeps its own caches" in html.unescape(d.errors["enable_prefix_caching"].value)
        assert box.value is False and own.generate.config.enable_prefix_caching is False
    finally:
        d.close()
        own.stop(timeout=10)


class RecordingSource(ScriptedSource):
    """A scripted source that keeps what each load was started with."""

    def __init__(self) -> None:
        super().__init__([snapshot(1.0)])
        self.loads: list[dict[str, Any]] = []

    def start_load(self, **kwargs: Any) -> Any:
        self.loads.append(kwargs)
        return _Done()


class _Done:
    sent, running = 0, False

    def stop(self) -> None:
        pass


def test_the_load_panels_shared_prefix_workload_reaches_the_source():
    source = RecordingSource()
    panel = GenerationLoadControls(lambda: source, input_len="32", output_len="64")
    c = panel.widgets
    c["start"].value = True  # no prefix, one turn: the length mix, no workload
    assert source.loads[-1]["workload"] is None and panel.error.value == ""
    panel.stop()
    c["prefix_len"].value, c["num_prefixes"].value = "256", "4"
    c["turns"].value, c["think_time_s"].value = "4", "0.5"
    c["start"].value = True
    panel.stop()
    workload = source.loads[-1]["workload"]
    assert isinstance(workload, labserve.SharedPrefixWorkload)
    assert (workload.prefix_len, workload.num_prefixes, workload.turns) == (256, 4, 4)
    assert workload.think_time_s == 0.5
    assert len(workload.prompt_ids(0)) == 256 + 32  # the prefix, then the user's message
    c["turns"].value = "two"
    c["start"].value = True
    assert "turns must be an integer, got 'two'" in html.unescape(panel.error.value)
    assert panel.run is None and len(source.loads) == 2


def test_a_shared_prefix_load_from_the_panel_shows_hits_in_the_chart(dash, lm):
    c = dash.controls
    c["input_len"].value, c["output_len"].value = "8", "4"
    c["prefix_len"].value, c["num_prefixes"].value = "64", "1"
    c["rate"].value = "20"
    c["start"].value = True
    assert dash.errors["load"].value == ""
    wait_for(lambda: np.nanmax([0.0, *dash.charts.ticks.data["prefix_hit_pct"]]) > 0)
    c["start"].value = False
    assert lm.generate.stats().prefix_cache_hits > 0
    wait_for(lambda: "prefix cache hit rate" in dash.status.value)


def test_the_status_line_reads_the_share_within_the_targets(dash, lm):
    # What a search's ``attainment`` is judged on: goodput over the served rate, live.
    lm.generate.configure(ttft_slo_ms=60_000, tpot_slo_ms=60_000)  # every request meets these
    for _ in range(3):
        lm.generate.run("ab", max_tokens=4)
    assert "(<b>100%</b> within the targets)" in _status_when(dash, "within the targets")
    lm.generate.reset_stats()
    lm.generate.configure(ttft_slo_ms=0.001)  # a microsecond to the first token: none meets it
    for _ in range(3):
        lm.generate.run("ab", max_tokens=4)
    assert "(<b>0%</b> within the targets)" in _status_when(dash, "<b>0%</b> within")
