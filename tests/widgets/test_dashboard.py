"""The dashboard headless: controls act on the runner, the pump streams, memory stays bounded."""

from __future__ import annotations

import asyncio
import html
import json
import math
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from bokeh.document import Document
from bokeh.models import Div, Legend
from bokeh.protocol import Protocol
from bokeh.protocol.exceptions import ProtocolError
from bokeh.protocol.receiver import Receiver
from jupyter_bokeh import BokehModel
from labserve.widgets import Charts, ChartWidget, Dashboard, Pump, loadpanel, plot
from labserve.widgets.chartwidget import (
    ACK_EVERY_S,
    ACK_TIMEOUT_S,
    CALM_S,
    MAX_IN_FLIGHT,
    SILENT_TIMEOUT_S,
    SLOW_ACK_S,
)
from labserve.widgets.series import TICK_COLUMNS, LiveSeries, fit_cost, result_rows

import labserve
from labserve.lab.demo import SleepModel

X = np.ones((1, 4))


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll a condition the pump or the loop will make true (not a timing assertion)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


@pytest.fixture
def runner() -> Iterator[labserve.Runner]:
    r = labserve.Runner(SleepModel(a_ms=0.5, b_ms=0.01), name="sleep")
    yield r
    r.stop(timeout=10)


@pytest.fixture
def dash(runner: labserve.Runner) -> Iterator[Dashboard]:
    d = Dashboard(runner, example=X, hz=20)
    yield d
    d.close()


def test_moving_a_control_configures_the_runner(dash, runner):
    dash.controls["max_batch_size"].value = 4
    assert runner.predict.config.max_batch_size == 4
    dash.controls["strategy"].value = "off"
    assert runner.predict.config.strategy == "off"
    dash.controls["max_latency_ms"].value = 200
    assert runner.predict.config.max_latency_ms == 200
    dash.controls["max_latency_ms_text"].value = "0.25"
    assert runner.predict.config.max_latency_ms == 0.25
    dash.controls["on_overload"].value = "reject"
    assert runner.predict.config.on_overload == "reject"
    dash.controls["latency_slo_ms_text"].value = "15"
    assert runner.predict.config.latency_slo_ms == 15
    runner.configure("predict", latency_slo_ms=5)  # from a cell: the box follows
    dash.batching.follow()
    assert dash.controls["latency_slo_ms_text"].value == "5"
    assert "max_batch_size: 4" in dash.controls["export"].value  # the export follows


@pytest.mark.parametrize(
    ("key", "text", "message"),
    [
        ("max_batch_size", "0", "max_batch_size must be an integer >= 1"),
        ("max_batch_size", "lots", "max_batch_size must be an integer, got 'lots'"),
        ("max_latency_ms", "-3", "max_latency_ms"),
        ("max_latency_ms", "soon", "max_latency_ms must be a number"),
        ("latency_slo_ms", "-1", "latency_slo_ms must be a finite number >= 0"),
    ],
)
def test_a_bad_typed_value_says_why_and_changes_nothing(dash, runner, key, text, message):
    before = runner.predict.config
    dash.controls[f"{key}_text"].value = text
    assert message in html.unescape(dash.errors[key].value)
    assert runner.predict.config == before
    assert dash.controls[f"{key}_text"].value == f"{getattr(before, key):g}"  # shows what holds
    dash.controls[f"{key}_text"].value = "8"  # a good value clears the message
    assert dash.errors[key].value == ""
    assert getattr(runner.predict.config, key) == 8


def test_the_controls_follow_a_change_made_elsewhere(dash, runner):
    runner.configure("predict", max_batch_size=16, strategy="fixed", max_latency_ms=50)
    in_force = runner.predict.config
    # The export is the last control the pump's thread writes: waiting on an earlier one and
    # then reading the export raced that thread on a loaded machine.
    wait_for(lambda: "max_batch_size: 16" in dash.controls["export"].value)
    assert dash.controls["max_batch_size"].value == 16
    assert dash.controls["strategy"].value == "fixed"
    assert dash.controls["max_latency_ms"].value == 50
    assert dash.controls["max_batch_size_text"].value == "16"
    assert runner.predict.config is in_force  # showing it did not configure the runner again
    dash.controls["max_batch_size"].value = 8  # and the controls still act
    assert runner.predict.config.max_batch_size == 8


def test_the_controls_follow_a_patch_config_from_another_client(runner):
    server = labserve.serve(runner)
    d = Dashboard(server, example=X, hz=20)
    try:
        request = urllib.request.Request(
            f"{server.url}/config",
            data=json.dumps({"runner": "sleep", "method": "predict", "max_batch_size": 4}).encode(),
            method="PATCH",
            headers={"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5):
            pass
        wait_for(lambda: d.controls["max_batch_size"].value == 4)
    finally:
        d.close()
        server.stop()


def test_the_pump_streams_rows_while_load_runs(dash, runner):
    dash.controls["rate"].value = "400"
    dash.controls["duration"].value = "1"
    dash.controls["start"].value = True
    assert dash.errors["load"].value == ""
    wait_for(lambda: not dash.controls["start"].value)  # the run ended; the button says so
    ticks = dash.charts.ticks.data
    assert len(ticks["t"]) >= 2 and ticks["t"] == sorted(ticks["t"])
    assert max(x for x in ticks["served_rps"] if math.isfinite(x)) > 0
    sizes = [x for x in ticks["batch_max"] if math.isfinite(x)]
    assert sizes and max(sizes) <= runner.predict.config.max_batch_size
    assert "req/s served" in dash.status.value and "(last " in dash.status.value
    assert dash.pump.last_error is None, repr(dash.pump.last_error)


def test_the_load_runs_until_stopped_by_default(dash, runner, monkeypatch):
    monkeypatch.setattr(loadpanel, "CHUNK_S", 0.3)  # chain short runs to see several
    started: list[labserve.LoadRun] = []
    start_load = labserve.RunnerSource.start_load
    monkeypatch.setattr(
        labserve.RunnerSource,
        "start_load",
        lambda *a, **k: started.append(start_load(*a, **k)) or started[-1],
    )
    assert dash.controls["duration"].value == ""  # "until stopped"
    dash.controls["rate"].value = "300"
    dash.controls["start"].value = True
    assert dash.errors["load"].value == ""
    wait_for(lambda: dash.load._chunks >= 4)
    assert dash.controls["start"].value is True
    wait_for(lambda: "until stopped" in dash.status.value)
    assert "running 0:0" in dash.status.value  # the elapsed time
    dash.controls["start"].value = False
    assert dash.load.run is None
    assert runner.predict.stats().served > 300 * 0.3 * 3 * 0.5  # the chained runs all sent
    runs = len(started)
    assert runs >= 4
    time.sleep(0.6)  # two chunks long: a chained run started after the stop would show
    assert len(started) == runs and dash.load.run is None


def test_a_bad_load_setting_is_shown_and_starts_nothing(dash, runner):
    dash.controls["rate"].value = "-5"
    dash.controls["start"].value = True
    assert "rate_rps" in dash.errors["load"].value
    assert dash.controls["start"].value is False
    assert dash.load.run is None


def test_a_failing_chart_update_shows_in_the_status_line(dash, runner, monkeypatch):
    def broken(tick):
        raise ValueError("the chart refused a row")

    monkeypatch.setattr(dash.charts, "stream", broken)
    runner.predict.run(X)
    wait_for(lambda: "chart update failed" in dash.status.value)
    assert "ValueError: the chart refused a row" in html.unescape(dash.status.value)
    assert "req/s served" in dash.status.value  # the numbers still show
    assert dash.pump.running and dash.pump.errors >= 1


def test_without_an_example_the_load_controls_say_what_is_missing(runner):
    d = Dashboard(runner, hz=20)
    try:
        d.controls["start"].value = True
        assert "example" in d.errors["load"].value
    finally:
        d.close()


def test_live_charts_keep_only_the_rows_their_window_shows():
    # Each row kept is drawn on every frame: the window (60 s) and two time steps, at 5 Hz.
    charts = Charts(follow_s=60.0, hz=5.0)
    tick = {c: [0.0] * 100 for c in TICK_COLUMNS}
    for _ in range(100):  # 10,000 ticks, past the rollover
        charts.stream(tick)
    assert len(charts.ticks.data["t"]) == (60 + 2 * 5) * 5
    finished = Charts(follow_s=None)  # a finished run's charts keep more
    for _ in range(100):
        finished.stream(tick)
    assert len(finished.ticks.data["t"]) == 1500


def test_two_pumps_never_write_one_document(runner):
    charts = Charts()
    doc = Document()
    doc.add_root(charts.layout)
    first = Pump(charts, doc, lambda: runner.predict, hz=20)
    try:
        with pytest.raises(RuntimeError, match="already has a pump"):
            Pump(charts, doc, lambda: runner.predict, hz=20)
    finally:
        first.stop()
    second = Pump(charts, doc, lambda: runner.predict, hz=20)  # once stopped, it may be replaced
    second.stop()


def test_the_pump_is_the_only_thread_that_writes_the_document(dash, runner):
    writers: set[str] = set()
    dash.doc.on_change(lambda event: writers.add(threading.current_thread().name))
    runner.predict.run(X)
    dash.controls["max_batch_size"].value = 8  # control changes go to the runner, not the doc
    dash.controls["reset"].click()
    wait_for(lambda: dash.pump.ticks > 5 and writers)
    assert writers == {"labserve-dashboard"}


def test_the_pump_stops_with_the_runner(runner):
    d = Dashboard(runner, example=X, hz=20)
    runner.stop()
    wait_for(lambda: not d.pump.running)


def test_the_pump_stops_with_its_server(runner):
    server = labserve.serve(runner)
    d = Dashboard(server, example=X, hz=20)
    assert list(d.methods) == ["sleep.predict"]
    server.stop()
    wait_for(lambda: not d.pump.running)


def _find(node: object, model_id: str) -> dict | None:
    """The object with this id in Bokeh's JSON document."""
    if isinstance(node, dict):
        if node.get("id") == model_id and "attributes" in node:
            return node
        children = list(node.values())
    elif isinstance(node, list):
        children = node
    else:
        return None
    for child in children:
        found = _find(child, model_id)
        if found is not None:
            return found
    return None


def test_a_new_view_or_a_reload_shows_current_data(dash, runner):
    first = dash.view().children[-1]
    runner.predict.run(X)
    wait_for(lambda: len(dash.charts.ticks.data["t"]) > 5)
    with dash.pump.lock:
        n_now = len(dash.charts.ticks.data["t"])
        # A page reload asks the kernel for the widget's state.
        state = json.loads(first.get_state()["render_bundle"])
    source = _find(state["docs_json"], dash.charts.ticks.id)
    assert source is not None
    entries = dict(source["attributes"]["data"]["entries"])
    assert len(entries["t"]) == n_now  # the rows of now, not those of the view's creation
    second = dash.view().children[-1]  # a second view is a new widget on the same document
    assert second is not first
    assert second.get_state()["render_bundle"] is not None


def test_bokehjs_travels_in_widget_state_not_in_the_notebook(dash, monkeypatch):
    # A reloaded page restores its widgets from the kernel: BokehJS shown as a widget reaches
    # it without a cell re-run, and the saved notebook holds only references to widgets.
    from labserve.widgets import bokehjs

    shown: list[object] = []
    monkeypatch.setattr("labserve.widgets.bokehjs.display", shown.append)
    bundle = dash._repr_mimebundle_()
    (carrier,) = shown  # before the charts' own output
    assert "application/vnd.jupyter.widget-view+json" in bundle
    # No state in a saved notebook (it said "(live)" before anything ran).
    assert bundle["text/plain"].endswith(": live charts when its cell runs>")
    assert not any("bokeh.min.js" in str(v) for v in bundle.values())
    script = carrier.outputs[0]["data"][bokehjs.LOAD_MIME]
    assert script.startswith("if (!(window.Bokeh && window.Bokeh.version ===")  # once a page
    assert "/* BEGIN bokeh.min.js */" in script and len(script) > 500_000
    assert carrier.layout.display == "none"
    assert len(repr(carrier)) < 100  # its text form in a saved notebook
    dash._repr_mimebundle_()
    # A new one with every display: a page reloaded and Run All at once knows no widget of
    # the kernel's until it has fetched them all, so an old carrier could not be drawn yet.
    assert len(shown) == 2 and shown[1] is not carrier
    assert shown[1].outputs[0]["data"][bokehjs.LOAD_MIME] is script  # the same script, once
    dash.close()
    assert carrier.comm is None and shown[1].comm is None  # closed with the dashboard


def test_save_html_writes_a_standalone_page_with_current_data(dash, runner, tmp_path):
    # The chart counts batches after its first tick: on a busy machine the pump's thread
    # can start after a request made at once, whose batch then precedes the chart.
    wait_for(lambda: len(dash.charts.ticks.data["t"]) > 0)
    runner.predict.run(X)
    wait_for(lambda: any(math.isfinite(x) for x in dash.charts.ticks.data["batch_max"]))
    path = tmp_path / "dash.html"
    dash.save_html(str(path))
    page = path.read_text()
    assert "cdn.bokeh.org" not in page  # BokehJS inline: opens offline
    assert "Bokeh" in page and "queue_requests" in page
    assert len(page) > 500_000


def test_live_series_turns_snapshots_into_rows(runner):
    series = LiveSeries()
    tick = series.update(runner.predict.stats())
    assert tick["t"] == [0.0]  # the first tick opens the chart
    assert math.isnan(tick["batch_mean"][0]) and math.isnan(tick["served_rps"][0])  # empty
    for _ in range(5):
        runner.predict.run(X)
    snap = runner.predict.stats()
    tick = series.update(snap)
    assert tick["batch_min"] == tick["batch_max"] == tick["batch_mean"] == [1.0]
    assert tick["max_batch_size"] == [float(snap.config.max_batch_size)]
    recent = series.recent
    assert recent is not None and recent.mean_batch == 1.0 and recent.rejected_pct == 0.0
    assert recent.served_rps == pytest.approx(5 / recent.span_s)
    runner.predict.reset_stats()
    tick = series.update(runner.predict.stats())
    assert math.isnan(tick["batch_mean"][0])  # a reset starts over instead of counting back


def test_a_finished_run_gives_the_same_rows():
    result = labserve.simulate(
        labserve.arrivals("poisson", rate_rps=1000), duration_s=2.0, seed=3, cost=(2.0, 0.1)
    )
    tick = result_rows(result, bin_s=0.1)
    served = int((result.outcome == 0).sum())
    assert sum(tick["served_rps"]) * 0.1 == pytest.approx(served)
    fired = sum(sum(tick[r]) for r in labserve.REASONS) * 0.1
    assert fired == pytest.approx(len(result.batch_items))
    assert tick["queue_requests"][-1] == 0  # everything was served by the end
    assert np.nanmax(tick["batch_max"]) == result.batch_items.max()
    assert np.nanmin(tick["batch_min"]) == result.batch_items.min()
    with pytest.raises(ValueError, match="bin_s"):
        result_rows(result, bin_s=0)


def test_plot_draws_a_finished_run():
    result = labserve.simulate(labserve.arrivals("constant", rate_rps=500), duration_s=1.0)
    widget = plot(result)
    state = json.loads(widget.get_state()["render_bundle"])
    assert state["render_items"]
    widget.close()


def test_ticks_are_on_one_clock_before_and_after_the_first_request(runner):
    series = LiveSeries()
    series.update(runner.predict.stats())  # no request yet: the driver has not started
    runner.predict.run(X)
    tick = series.update(runner.predict.stats())
    assert 0 <= tick["t"][0] < 60  # seconds since the first tick, not the clock's epoch


def _fragments_sent(widget_cls: type, patches: int) -> list[str]:
    """Stream ``patches`` ticks into charts shown by a widget; the comm fragments it sends."""
    charts = Charts(follow_s=None)  # no time window: a tick changes only the rows
    widget = widget_cls(charts.layout)
    sent: list[str] = []
    widget.send = lambda content, buffers=None: sent.append(content["payload"])
    for k in range(patches):
        charts.stream({c: [float(k)] for c in TICK_COLUMNS})
        if isinstance(widget, ChartWidget):
            _ack(widget, k + 1)  # a page that keeps up
    return sent  # (the widget is closed when collected; jupyter_bokeh's close() is not idempotent)


def _applied(fragments: list[str]) -> list[float]:
    """What a BokehJS-style receiver (Bokeh's own Python twin) applies: each patch's t."""
    receiver = Receiver(Protocol())
    out: list[float] = []
    for fragment in fragments:
        try:
            message = asyncio.run(receiver.consume(fragment))
        except ProtocolError:  # BokehJS does not check; it applies the wrong part or nothing
            continue
        if message is not None and "events" in message.content:
            (event,) = [e for e in message.content["events"] if e["kind"] == "ColumnsStreamed"]
            out += dict(event["data"]["entries"])["t"]
    return out


@pytest.mark.parametrize("missed", [0, 1, 2])
def test_a_view_that_starts_listening_mid_patch_applies_every_later_patch(missed):
    applied = _applied(_fragments_sent(ChartWidget, patches=5)[missed:])
    later = [1.0, 2.0, 3.0, 4.0]
    assert applied[-4:] == later and len(applied) == 5 - (missed > 0)


def test_plain_jupyter_bokeh_framing_goes_out_of_step_when_a_view_starts_mid_patch():
    # The failure ChartWidget's framing prevents (seen in the browser as charts that freeze).
    fragments = _fragments_sent(BokehModel, patches=5)
    assert _applied(fragments) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert _applied(fragments[1:])[-4:] != [1.0, 2.0, 3.0, 4.0]


def _ack(widget: ChartWidget, seq: int) -> None:
    """What the page sends back once it applied patch ``seq`` (BokehJS's echo of the change)."""
    model = widget._ack_model
    widget._sync_model(widget, {"event": "jsevent", "kind": "ModelChanged",
                                "model": {"id": model.id}, "attr": "name",
                                "new": f"labserve-ack:{seq}"}, [])  # fmt: skip


def _streaming_widget() -> tuple[Charts, ChartWidget, list[dict]]:
    charts = Charts(follow_s=None)  # no time window: a tick changes only the rows
    widget = ChartWidget(charts.layout)
    sent: list[dict] = []
    widget.send = lambda content, buffers=None: sent.append(json.loads(content["payload"]))
    return charts, widget, sent


def _tick(charts: Charts, t: float) -> None:
    charts.stream({**{c: [0.0] for c in TICK_COLUMNS}, "t": [t]})


def test_a_page_that_has_not_applied_gets_held_changes_merged_not_a_backlog():
    charts, widget, sent = _streaming_widget()
    for k in range(20):  # no view has said it applied anything
        _tick(charts, float(k))
    patches = sent[::3]  # each patch goes out three times
    n = MAX_IN_FLIGHT
    assert len(patches) == n  # in flight; the rest are held
    assert widget.updates == 20 and widget.merged == 20 - n
    assert patches[-1]["events"][-1]["new"] == f"labserve-ack:{n}"  # each patch is numbered
    _ack(widget, 1)  # the page applied the first: one more may go
    _tick(charts, 20.0)
    merged = sent[-1]["events"]
    streams = [e for e in merged if e["kind"] == "ColumnsStreamed"]
    assert len(streams) == 1  # the held ticks and the new one, as one stream
    assert dict(streams[0]["data"]["entries"])["t"] == [float(k) for k in range(n, 21)]
    assert merged[-1]["new"] == f"labserve-ack:{n + 1}"
    assert len(charts.ticks.data["t"]) == 21  # the kernel's document kept every row


def test_other_echoes_from_the_page_are_not_acknowledgements():
    charts, widget, sent = _streaming_widget()
    for k in range(3):
        _tick(charts, float(k))
    assert len(sent) == MAX_IN_FLIGHT * 3
    # A range the page moved while drawing, and the echo of a streamed column: not an ack.
    widget._sync_model(widget, {"event": "jsevent", "kind": "ModelChanged", "attr": "start",
                                "new": 1.0}, [])  # fmt: skip
    widget._sync_model(widget, {"event": "jsevent", "kind": "ColumnsStreamed"}, [])
    _tick(charts, 3.0)
    assert len(sent) == MAX_IN_FLIGHT * 3


def test_held_changes_go_out_after_a_silence_when_no_view_answers():
    charts, widget, sent = _streaming_widget()
    for k in range(10):
        _tick(charts, float(k))
    assert len(sent) == MAX_IN_FLIGHT * 3
    widget._last_sent -= 60  # no word from any page for a minute: no view is open
    _tick(charts, 10.0)
    assert len(sent) == (MAX_IN_FLIGHT + 1) * 3


def test_until_a_page_first_answers_held_changes_go_out_every_ack_timeout():
    # The first patches may reach the page before its view exists (Notebook 7's Run All):
    # no view answers those, so waiting the long silence would freeze the first view.
    charts, widget, sent = _streaming_widget()
    _tick(charts, 0.0)
    _tick(charts, 1.0)
    assert len(sent) == MAX_IN_FLIGHT * 3
    widget._last_sent -= ACK_TIMEOUT_S + 0.1
    _tick(charts, 2.0)
    assert len(sent) == (MAX_IN_FLIGHT + 1) * 3
    _ack(widget, 1)  # a view answered (each patch, in order): now the long silence applies
    _ack(widget, 2)
    _tick(charts, 3.0)
    n = len(sent)
    _tick(charts, 4.0)
    widget._last_sent -= ACK_TIMEOUT_S + 0.1
    _tick(charts, 5.0)
    assert len(sent) == n  # held, merged
    widget._last_sent -= SILENT_TIMEOUT_S
    _tick(charts, 6.0)
    assert len(sent) == n + 3


def test_a_page_that_reads_the_whole_state_releases_the_patches_in_flight():
    # A reloaded page (or a second tab) draws from the state as it is now: it never answers
    # the patches sent before, which must not hold the next ones back.
    charts, widget, sent = _streaming_widget()
    _tick(charts, 0.0)
    _tick(charts, 1.0)
    assert len(sent) == MAX_IN_FLIGHT * 3 and widget.merged == 1
    assert "render_bundle" in widget.get_state()  # what ipywidgets sends a page that asks
    _tick(charts, 2.0)
    assert len(sent) == (MAX_IN_FLIGHT + 1) * 3


def _rows_t(bundle: str) -> list[float]:
    """The time column of the ticks source in a serialized render bundle."""
    found: list[float] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") == "map" and isinstance(node.get("entries"), list):
                entries = dict(e for e in node["entries"] if isinstance(e, list) and len(e) == 2)
                if isinstance(entries.get("t"), list) and "ttft_p50" not in entries:
                    found.extend(entries["t"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(bundle))
    return found


def test_a_view_made_after_patches_reached_the_page_gets_the_whole_state_again():
    # On a loaded machine the page makes a chart's view seconds after the widget's state
    # arrived; patches in between find no view and are lost (an axis sized once from a cap
    # stayed at its first range in CI). The view's first answer, for a later patch, shows it.
    charts, widget, _ = _streaming_widget()
    states: list[dict] = []
    widget._send = lambda msg, buffers=None: states.append(msg)
    widget.get_state()  # the page opened the widget with the state as it was
    _tick(charts, 0.0)  # patch 1: no view yet
    widget._last_sent -= ACK_TIMEOUT_S + 0.1
    _tick(charts, 1.0)  # patch 2: the view exists now and applies it
    assert widget._sent == 2 and not states
    _ack(widget, 2)
    (update,) = states
    assert update["method"] == "update"
    assert _rows_t(update["state"]["render_bundle"]) == [0.0, 1.0]  # the document now
    _ack(widget, 3)  # later answers in order: nothing more to send
    assert len(states) == 1


def test_a_view_that_answers_the_first_patch_is_not_sent_the_state_again():
    charts, widget, _ = _streaming_widget()
    states: list[dict] = []
    widget._send = lambda msg, buffers=None: states.append(msg)
    widget.get_state()
    _tick(charts, 0.0)
    _ack(widget, 1)
    widget._last_sent -= ACK_TIMEOUT_S + 0.1
    _tick(charts, 1.0)
    _ack(widget, 2)
    assert widget._sent == 2 and states == []


class _Clock:
    """The widget's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _asks(patch: dict) -> list[str]:
    """The acknowledgement a patch asks for (the ack model's new name), if any."""
    return [e["new"] for e in patch["events"] if e.get("attr") == "name"]


def _calm_widget(tick_s: float = 0.2) -> tuple[Charts, ChartWidget, list[dict], _Clock, float]:
    """A widget whose page has acknowledged every patch within a few ms for CALM_S."""
    charts, widget, sent = _streaming_widget()
    clock = _Clock()
    widget._clock = clock
    t = 0.0
    while clock.now < 1000.0 + CALM_S + 2 * tick_s:
        _tick(charts, t)
        clock.now += 0.005
        _ack(widget, widget._sent)
        clock.now += tick_s - 0.005
        t += 1.0
    return charts, widget, sent, clock, t


def test_a_page_that_keeps_up_is_asked_for_an_acknowledgement_once_a_second():
    # Each answer is a kernel message that JupyterLab shows as busy, then idle: at 5 Hz
    # that flicker cost the page more than drawing its charts.
    charts, widget, sent, clock, t = _calm_widget()
    first = len(sent)
    for _ in range(25):  # five seconds at 5 Hz, each asked-for patch answered at once
        _tick(charts, t)
        if _asks(sent[-1]):
            _ack(widget, widget._sent)
        clock.now += 0.2
        t += 1.0
    patches = sent[first::3]
    assert len(patches) == 25 and widget.merged == 0  # every tick went out
    asked = [p for p in patches if _asks(p)]
    assert 5 * 0.2 / ACK_EVERY_S - 1 <= len(asked) <= 5 / ACK_EVERY_S + 1


def test_a_page_that_stops_answering_gets_changes_held_after_a_slow_ack():
    charts, widget, sent, clock, t = _calm_widget()
    for _ in range(round(ACK_EVERY_S / 0.2) + 1):  # ticks until one asks; then no answer
        _tick(charts, t)
        t += 1.0
        if _asks(sent[-1]):
            break
        clock.now += 0.2
    assert _asks(sent[-1])
    n = len(sent)
    clock.now += SLOW_ACK_S / 2
    _tick(charts, t)  # not yet late: goes out, asking for nothing
    assert len(sent) == n + 3 and not _asks(sent[-1])
    n = len(sent)
    clock.now += SLOW_ACK_S / 2
    for k in range(5):  # late: held and merged, as for a page that never kept up
        _tick(charts, t + 1.0 + k)
        clock.now += 0.2
    assert len(sent) == n and widget.merged == 5


def test_after_a_slow_acknowledgement_every_patch_asks_for_one_again():
    charts, widget, sent, clock, t = _calm_widget()
    for _ in range(round(ACK_EVERY_S / 0.1) + 1):  # ticks until one asks
        clock.now += 0.1
        _tick(charts, t)
        t += 1.0
        if _asks(sent[-1]):
            break
    assert _asks(sent[-1])
    clock.now += SLOW_ACK_S + 0.1
    _ack(widget, widget._sent)  # answered, but late: the page is falling behind
    n = len(sent)
    _tick(charts, t)
    assert len(sent) == n + 3 and _asks(sent[-1]) == [f"labserve-ack:{widget._sent}"]
    _tick(charts, t + 1.0)  # one patch in flight again: held
    assert len(sent) == n + 3 and widget.merged == 1


def test_the_cost_fit_is_drawn_only_over_the_data_and_ignores_a_stall():
    charts = Charts()
    items = [2.0, 4.0, 8.0] * 20
    ms = [2.0 + 0.1 * n for n in items]
    ms[5] = 136.0  # one stalled batch
    a, b = fit_cost(np.array(items), np.array(ms) / 1000.0)
    assert a == pytest.approx(2.0) and b == pytest.approx(0.1)  # the medians ignore it
    charts.show_fit(items, ms, a, b, cap=64.0)
    assert charts.fit_line.data["items"] == [2.0, 8.0]  # not 0..64
    assert charts.cost_y.end < 10  # the axis is not stretched to 136 ms
    assert "1 off-axis (max 136 ms)" in charts.figures["cost"].title.text


def test_one_batch_size_is_not_identifiable_and_says_so():
    charts = Charts()
    assert (
        fit_cost(np.array([4.0] * 10), np.full(10, 0.0024))
        == (pytest.approx(math.nan, nan_ok=True),) * 2
    )
    charts.show_fit([4.0] * 10, [2.4] * 10, 2.4, 0.0, cap=4.0)
    assert charts.fit_line.data["items"] == []
    assert "not identifiable" in charts.figures["cost"].title.text


def test_idle_charts_start_empty():
    charts = Charts()
    assert charts.fit_line.data["items"] == [] and charts.ticks.data["t"] == []
    assert "no batches yet" in charts.figures["cost"].title.text
    for name, fig in charts.figures.items():  # keys above the plots, not over the lines
        assert not list(fig.select(type=Legend)), name
    keys = [d.text for d in charts.layout.select({"type": Div})]
    assert len(keys) == 6 and "p99" in " ".join(keys) and "max_batch_size" in " ".join(keys)


def test_the_status_line_says_when_the_page_cannot_keep_up(dash, runner):
    view = dash.view().children[-1]  # a page that never says it applied a patch
    wait_for(lambda: view.merged > 5)
    wait_for(lambda: "dropping frames" in dash.status.value)
    _ack(view, view._sent)  # it catches up, and keeps up from then on
    view.send = lambda content, buffers=None: _ack(view, view._sent)
    wait_for(lambda: "dropping frames" not in dash.status.value)


def test_mean_batch_counts_only_batches_seen_when_more_fired_than_a_snapshot_keeps(runner):
    series = LiveSeries()
    series.update(runner.predict.stats())
    kept = len(runner.predict.stats().recent_batches) or 64
    for _ in range(3 * max(kept, 64)):  # one request at a time: batches of one
        runner.predict.run(X)
    series.update(runner.predict.stats())
    assert series.recent is not None and series.recent.mean_batch == 1.0  # not 64 / 192
