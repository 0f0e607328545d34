"""The dashboard in a real browser: JupyterLab runs a dashboard notebook, Chromium drives it.

Playwright drives Debian's Chromium (``/usr/bin/chromium``; Playwright cannot download its own
browser here). The test reads the chart data from BokehJS in the page and the server's config
from its ``/config`` route, and saves a screenshot in ``test-artifacts/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import nbformat
import pytest

CHROMIUM = os.environ.get("LABSERVE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = pathlib.Path(__file__).parents[2] / "test-artifacts"

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"Chromium not found at {CHROMIUM}: apt-get install -y chromium (.ci/run does)",
)

NOTEBOOK_CELLS = [
    "import json\n"
    "import numpy as np\n"
    "import labserve\n"
    "from labserve.lab.demo import SleepModel\n"
    "from labserve.widgets import Dashboard",  # it brings BokehJS itself
    'runner = labserve.Runner(SleepModel(a_ms=2.0, b_ms=0.05), name="sleep")\n'
    "server = labserve.serve(runner)\n"
    'with open("server.json", "w") as f:\n'
    '    json.dump({"url": server.url, "token": server.token}, f)',
    # The default 5 Hz: when the page cannot draw that often, the kernel sends fewer, merged
    # updates (flow control on the page's acknowledgements), so it never falls behind.
    "dash = Dashboard(server, example=np.ones((1, 4)))\ndash",
    # A later cell that runs with Run All: it must leave the dashboard live.
    'print("ready")',
]

# Every ColumnDataSource in the page's Bokeh documents that has a column named `column`,
# as {rows, last}: how the charts' data looks from the browser's side.
READ_SOURCE = """(column) => {
  const out = [];
  for (const doc of (window.Bokeh && window.Bokeh.documents) || []) {
    for (const m of doc.all_models) {
      const data = m.data;
      if (data && typeof data.get === "function" ? data.has(column) : data && column in data) {
        const col = typeof data.get === "function" ? data.get(column) : data[column];
        out.push({rows: col.length, values: Array.from(col.slice(-25))});
      }
    }
  }
  return out;
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@contextlib.contextmanager
def run_lab(
    folder: pathlib.Path, cells: list[str] = NOTEBOOK_CELLS, app: str = "lab"
) -> Iterator[dict[str, Any]]:
    """JupyterLab (or Notebook 7: ``app="notebook"``) serving ``cells`` from ``folder``.

    The notebook opens at ``{base}{path}dashboard.ipynb``.
    """
    if app not in ("lab", "notebook"):
        raise ValueError(f"app must be 'lab' or 'notebook', got {app!r}")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, folder / "dashboard.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTERLAB_WORKSPACES_DIR=str(folder / "workspaces"))
    module, app_class = {"lab": ("jupyterlab", "LabApp")}.get(
        app, ("notebook", "JupyterNotebookApp")
    )
    cmd = [
        sys.executable, "-m", module, "--no-browser", f"--port={port}",
        "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={folder}", f"--{app_class}.expose_app_in_browser=True",
    ]  # fmt: skip
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(folder / "jupyterlab.log", "wb")  # closed at teardown
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                return True
        except OSError:
            return False

    try:
        _wait(up, "Jupyter to start", timeout=90)
        path = "/lab/tree/" if app == "lab" else "/notebooks/"
        yield {"base": base, "token": token, "dir": folder, "path": path}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def lab(tmp_path: pathlib.Path) -> Iterator[dict[str, Any]]:
    """JupyterLab serving a dashboard notebook from a temporary folder."""
    with run_lab(tmp_path) as served:
        yield served


# How old the newest row the page has drawn is, in seconds (the ticks carry their wall-clock
# time in clock_s); null before the first row.
STALENESS = """() => {
  let newest = null;
  for (const doc of (window.Bokeh && window.Bokeh.documents) || []) {
    for (const m of doc.all_models) {
      const data = m.data;
      if (!data) continue;
      const col = typeof data.get === "function" ? data.get("clock_s") : data["clock_s"];
      if (col && col.length) newest = Math.max(newest ?? -Infinity, col[col.length - 1]);
    }
  }
  return newest === null ? null : Date.now() / 1000 - newest;
}"""


# For two seconds: the streams applied to the dashboard's ticks source, and what its
# document's listeners (jupyter_bokeh's view sends each to the kernel) were told.
ECHOES = """async () => {
  let ticks = null, doc = null;
  for (const d of (window.Bokeh && window.Bokeh.documents) || []) {
    for (const m of d.all_models) {
      const data = m.data;
      if (data && (typeof data.get === "function" ? data.has("clock_s") : "clock_s" in data)) {
        ticks = m;
        doc = d;
      }
    }
  }
  const seen = [];
  let streams = 0;
  const listener = (e) => {
    const name = e.model && typeof e.model.name === "string" ? e.model.name.split(":")[0] : "";
    seen.push(`${e.kind} ${e.attr || ""} ${name}`);
  };
  const counted = () => { streams += 1; };
  doc.on_change(listener);
  ticks.streaming.connect(counted);
  await new Promise((resolve) => setTimeout(resolve, 2000));
  doc.remove_on_change(listener);
  ticks.streaming.disconnect(counted);
  return {streams, seen};
}"""


KERNEL_READY = (
    "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
    " && window.jupyterapp.shell.currentWidget.sessionContext"
    " && window.jupyterapp.shell.currentWidget.sessionContext.session"
    " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
)

# Characters of BokehJS in the dashboard cell's outputs as the notebook would save them.
BOKEHJS_OUTPUT_CHARS = """() => {
  const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
  let chars = 0;
  for (let i = 0; i < cells.length; i++) {
    const cell = cells.get(i);
    if (!cell.outputs) continue;
    for (const out of cell.outputs.toJSON()) {
      const js = out.data && out.data["application/vnd.bokehjs_load.v0+json"];
      if (js) chars += js.length;
    }
  }
  return chars;
}"""


def open_dashboard(pw: Any, lab: dict[str, Any]) -> tuple[Any, Any, dict[str, str], list[str]]:
    """Chromium on the lab's notebook, Run All done, the charts drawn: browser, page, server."""
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1500, "height": 1400})
    console: list[str] = []
    page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
    page.goto(f"{lab['base']}{lab['path']}dashboard.ipynb?token={lab['token']}&reset")
    page.wait_for_function(KERNEL_READY, timeout=90_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    server_file = lab["dir"] / "server.json"
    _wait(server_file.exists, "the notebook to start the server", timeout=90)
    server = json.loads(server_file.read_text())
    page.locator(".widget-slider", has_text="max_batch_size").wait_for(timeout=60_000)
    page.locator("canvas").first.wait_for(timeout=60_000)
    _wait(lambda: page.locator(".bk-Figure, .bk-figure").count() >= 6, "six figures")
    return browser, page, server, console


@contextlib.contextmanager
def dashboard_page(
    pw: Any, lab: dict[str, Any], failure: str
) -> Iterator[tuple[Any, Any, dict[str, str], list[str]]]:
    """:func:`open_dashboard`; on a failure, the page's console and a screenshot ``failure``."""
    browser, page, server, console = open_dashboard(pw, lab)
    try:
        yield browser, page, server, console
    except BaseException:
        print("\n".join(console[-60:]))
        page.screenshot(path=str(ARTIFACTS / f"{failure}.png"), full_page=True)
        raise
    finally:
        browser.close()


def rows(page: Any, column: str = "queue_requests") -> int:
    """Rows in the page's largest data source holding ``column``."""
    return max((s["rows"] for s in page.evaluate(READ_SOURCE, column)), default=0)


def newest_rows(page: Any, column: str = "queue_requests") -> int:
    """Rows in the newest data source holding ``column`` (the page's latest dashboard).

    After a re-run the replaced dashboard's documents stay in the page, stopped, with all the
    rows they had: the newest is the one that streams.
    """
    sources = page.evaluate(READ_SOURCE, column)
    return int(sources[-1]["rows"]) if sources else 0


def last_values(page: Any, column: str) -> list[float]:
    """``column``'s values in the page's largest data source holding it."""
    sources = page.evaluate(READ_SOURCE, column)
    return max(sources, key=lambda s: s["rows"])["values"] if sources else []  # type: ignore[no-any-return]


def start_load(page: Any, rate: int) -> None:
    """Type a rate into the load column and press start (the load runs until stopped)."""
    field = page.locator(".widget-text", has_text="rate (req/s)").locator("input")
    field.fill(str(rate))
    field.press("Enter")
    page.get_by_role("button", name="start load").click()


def _patch_config(server: dict[str, str], **changes: Any) -> None:
    body = json.dumps({"runner": "sleep", "method": "predict", **changes}).encode()
    request = urllib.request.Request(
        f"{server['url']}/config",
        data=body,
        method="PATCH",
        headers={"Authorization": f"Bearer {server['token']}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5):
        pass


def _get_config(server: dict[str, str]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{server['url']}/config", headers={"Authorization": f"Bearer {server['token']}"}
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        return json.load(reply)["sleep"]["predict"]  # type: ignore[no-any-return]


def _drag_slider_to(page: Any, label: str, index: int, steps: int) -> None:
    """Drag a selection slider's handle to the position of option ``index`` (of ``steps``)."""
    slider = page.locator(".widget-slider", has_text=label)
    track = slider.locator(".noUi-target").bounding_box()
    handle = slider.locator(".noUi-handle").bounding_box()
    assert track is not None and handle is not None
    x0, y = handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2
    x1 = track["x"] + track["width"] * index / (steps - 1)
    page.mouse.move(x0, y)
    page.mouse.down()
    page.mouse.move(x1, y, steps=8)
    page.mouse.up()


def _save(page: Any) -> None:
    """Save the notebook and wait until the save is done."""
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    _wait(lambda: not page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.context.model.dirty"), "the save")  # fmt: skip


def assert_reload_keeps_live_charts(
    page: Any, lab: dict[str, Any], console: list[str], shot: str
) -> None:
    """Save, reload with the kernel alive: live charts, without and then with a re-run."""

    def live(what: str) -> None:
        _wait(lambda: page.locator(".bk-Figure, .bk-figure").count() >= 6, f"{what}: charts")
        n = newest_rows(page)
        _wait(lambda: newest_rows(page) > n + 5, f"{what}: rows streaming", timeout=30)
        assert page.get_by_text("Could not create a view").count() == 0, what
        errors = [m for m in console if m.startswith("error")]
        assert not errors, (what, errors)

    _save(page)
    saved = (lab["dir"] / "dashboard.ipynb").stat().st_size
    assert saved < 50_000, saved  # no BokehJS in the file
    page.reload()
    page.wait_for_function(KERNEL_READY, timeout=90_000)
    live("reloaded, no cell re-run")  # BokehJS and the charts come back from the kernel
    page.screenshot(path=str(ARTIFACTS / f"{shot}.png"), full_page=True)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    _wait(lambda: page.locator(".jp-OutputArea-output", has_text="ready").count(), "re-run")
    live("reloaded and re-run")


def test_the_dashboard_renders_streams_and_its_slider_configures_the_server(lab):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        with dashboard_page(pw, lab, "dashboard-failure") as (_browser, page, server, console):
            # Run All ran the cell after the dashboard: the charts are still there.
            _wait(lambda: page.locator(".jp-OutputArea-output", has_text="ready").count(), "ready")
            assert page.locator(".bk-Figure, .bk-figure").count() >= 6

            # Start a Poisson load from the page; the charts' data grows while it runs.
            start_load(page, 400)
            before = rows(page, "queue_requests")
            _wait(lambda: rows(page, "queue_requests") > before + 10, "ticks to keep streaming")
            _wait(lambda: max(last_values(page, "batch_max"), default=0) > 0, "batches to show")
            # The page applies the kernel's streams without sending them back: its document
            # tells its listeners of nothing but the acknowledgements (labserve's BokehJS patch).
            echoes = page.evaluate(ECHOES)
            assert echoes["streams"] >= 3, echoes
            assert set(echoes["seen"]) <= {"ModelChanged name labserve-ack"}, echoes

            # Drag max_batch_size to 4 (option 2 of 1, 2, 4, ..., 1024): the server follows,
            # and the batch-size chart's cap line and new batches follow the server.
            _drag_slider_to(page, "max_batch_size", index=2, steps=11)
            _wait(lambda: _get_config(server)["max_batch_size"] == 4, "/config to say 4")
            _wait(lambda: last_values(page, "max_batch_size")[-1:] == [4], "the cap line to show 4")
            n = rows(page, "queue_requests")
            _wait(lambda: rows(page, "queue_requests") > n + 10, "ticks under the new cap")
            assert 0 < max(last_values(page, "batch_max")[-5:]) <= 4

            # Another client changes the cap (PATCH /config): the slider follows.
            _patch_config(server, max_batch_size=64)
            readout = page.locator(".widget-slider", has_text="max_batch_size").locator(
                ".widget-readout"
            )
            _wait(lambda: readout.inner_text().strip() == "64", "the slider to show 64")
            _wait(
                lambda: last_values(page, "max_batch_size")[-1:] == [64], "the cap line to show 64"
            )
            time.sleep(2)  # let the charts show a couple of seconds under the new cap
            shot = ARTIFACTS / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 20_000
            # BokehJS travels in a widget's state, not in the outputs the notebook saves.
            assert page.evaluate(BOKEHJS_OUTPUT_CHARS) == 0
            assert_reload_keeps_live_charts(page, lab, console, "dashboard-reloaded")


def test_the_dashboard_streams_in_notebook_7_after_a_reload_run_all_and_in_a_second_browser(
    tmp_path,
):
    """The same dashboard in Jupyter Notebook 7 (``/notebooks/<path>``): Run All, live charts;
    after a reload (with and without a re-run), in a second tab, after a reload and Run All at
    once, and after a second browser's Run All (issue 25's sequence, as in JupyterLab)."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with run_lab(tmp_path, app="notebook") as nb7, sync_playwright() as pw:
        with dashboard_page(pw, nb7, "notebook7-failure") as (browser, page, server, console):
            _wait(lambda: page.locator(".jp-OutputArea-output", has_text="ready").count(), "ready")
            assert page.locator("canvas").count() >= 6
            start_load(page, 400)
            # The first view streams (it once waited for a patch sent before it existed).
            _wait(lambda: rows(page) > 10, "the first view to stream", timeout=20)
            _wait(lambda: max(last_values(page, "batch_max"), default=0) > 0, "batches to show")
            _patch_config(server, max_batch_size=8)  # another client: the slider follows
            readout = page.locator(".widget-slider", has_text="max_batch_size").locator(
                ".widget-readout"
            )
            _wait(lambda: readout.inner_text().strip() == "8", "the slider to show 8")
            _wait(lambda: last_values(page, "max_batch_size")[-1:] == [8], "the cap line to show 8")
            assert page.evaluate(BOKEHJS_OUTPUT_CHARS) == 0
            page.screenshot(path=str(ARTIFACTS / "notebook7.png"), full_page=True)
            assert_reload_keeps_live_charts(page, nb7, console, "notebook7-reloaded")

            # A second tab on the same notebook, the kernel alive: live charts there too. Saved
            # first: the file saved before the re-run shows the dashboard the re-run replaced
            # (closed: no ghost keeps it streaming), as a saved notebook would.
            _save(page)
            second = browser.new_page(viewport={"width": 1500, "height": 1400})
            second.goto(f"{nb7['base']}{nb7['path']}dashboard.ipynb?token={nb7['token']}")
            second.wait_for_function(KERNEL_READY, timeout=90_000)
            _wait(lambda: second.locator(".bk-Figure, .bk-figure").count() >= 6, "tab 2 charts")
            n = rows(second)
            _wait(lambda: rows(second) > n + 5, "tab 2 rows streaming", timeout=30)
            assert second.get_by_text("Could not create a view").count() == 0
            second.screenshot(path=str(ARTIFACTS / "notebook7-second-tab.png"), full_page=True)
            second.close()
            reload_run_all_and_a_second_browser(pw, nb7, page, console, "notebook7")


def measure_staleness(page: Any, seconds: float) -> list[float]:
    """The age of the newest row on screen, sampled once a second for ``seconds``."""
    samples: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        age = page.evaluate(STALENESS)
        if age is not None:
            samples.append(float(age))
        time.sleep(1.0)
    return samples


def test_a_slow_page_stays_close_to_now(lab):
    """Chromium's CPU throttled 4x: flow control keeps the newest data on screen recent."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        with dashboard_page(pw, lab, "dashboard-failure") as (_browser, page, _server, _console):
            start_load(page, 1000)
            _wait(lambda: page.evaluate(STALENESS) is not None, "rows on screen")
            cdp = page.context.new_cdp_session(page)
            cdp.send("Emulation.setCPUThrottlingRate", {"rate": 4})
            time.sleep(5)  # the page slows down; what it had queued drains
            samples = measure_staleness(page, 20.0)
            print("staleness (s), once a second at 4x throttle:", [round(x, 2) for x in samples])
            third = max(len(samples) // 3, 1)
            first, last = samples[:third], samples[-third:]
            # Does not grow: the last third is no older than the first (plus slack)...
            assert sum(last) / len(last) <= sum(first) / len(first) + 1.0, samples
            # ...and ends under a generous bound (a functional check, not a benchmark).
            assert max(last) < 5.0, samples
            page.screenshot(path=str(ARTIFACTS / "dashboard-throttled.png"), full_page=True)


def test_lesson_05_run_all_then_its_four_steps(tmp_path):
    """Lesson 05 as a new user meets it: Run All, then the four steps; a screenshot of each."""
    from playwright.sync_api import sync_playwright

    lesson = pathlib.Path(__file__).parents[2] / "notebooks" / "05-interactive-tuning.ipynb"
    nb = nbformat.read(lesson, as_version=4)
    with run_lab(tmp_path, [c.source for c in nb.cells if c.cell_type == "code"]) as lab:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            try:
                page.goto(f"{lab['base']}/lab/tree/dashboard.ipynb?token={lab['token']}&reset")
                page.wait_for_function(KERNEL_READY, timeout=90_000)
                page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
                # Run All ends with the save_html cell: the dashboard is still live after it.
                _wait(lambda: page.get_by_text("opens offline: True").count(), "Run All", 180)
                _wait(lambda: page.locator(".bk-Figure, .bk-figure").count() >= 6, "charts")
                page.locator(".jp-OutputArea-output").filter(
                    has=page.locator(".bk-Figure")
                ).first.scroll_into_view_if_needed()

                ARTIFACTS.mkdir(exist_ok=True)
                start_load(page, 2500)
                _wait(
                    lambda: _last(page, "served_rps") and max(_last(page, "served_rps")) > 1000,
                    "load",
                )
                for step in (_step_cap_4, _step_cap_64, _step_target_15, _step_off, _step_refused):
                    step(page)
            finally:
                browser.close()


def _last(page: Any, column: str, n: int = 5) -> list[float]:
    values = last_values(page, column)
    return [v for v in values[-n:] if v is not None and v == v]


def _shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"lesson05-{name}.png"), full_page=True)


def _step_cap_4(page: Any) -> None:
    """1. max_batch_size 4: batches on the cap; the queue grows ('wait'), then with 'reject'
    the requests that cannot start in time are refused."""
    overload = page.locator(".widget-dropdown", has_text="on_overload").locator("select")
    _drag_slider_to(page, "max_batch_size", index=2, steps=11)
    _wait(lambda: _last(page, "max_batch_size")[-1:] == [4], "cap 4")
    _wait(
        lambda: _last(page, "queue_requests") and max(_last(page, "queue_requests")) > 50,
        "queue",
    )
    overload.select_option("reject")
    _wait(
        lambda: _last(page, "rejected_rps") and min(_last(page, "rejected_rps", 3)) > 0,
        "rejects",
    )
    time.sleep(1)  # past the rows that still hold batches fired before the change
    assert max(_last(page, "batch_max")) <= 4
    time.sleep(3)
    _shot(page, "1-cap-4")


def _step_cap_64(page: Any) -> None:
    """2. back to 64 and 'wait': nothing rejected within a few seconds."""
    overload = page.locator(".widget-dropdown", has_text="on_overload").locator("select")
    _drag_slider_to(page, "max_batch_size", index=6, steps=11)
    overload.select_option("wait")
    _wait(lambda: _last(page, "max_batch_size")[-1:] == [64], "cap 64")
    _wait(lambda: _last(page, "rejected_rps", 3) == [0.0] * 3, "no rejects", 20)
    time.sleep(2)
    _shot(page, "2-cap-64")


def _step_target_15(page: Any) -> None:
    """3. a latency target of 15 ms reaches the runner and the chart draws its line.

    (How much the batches grow depends on this machine's spare time: not asserted.)
    """
    target = page.locator(".widget-text", has_text="latency target ms").locator("input")
    target.fill("15")
    target.press("Enter")
    _wait(lambda: _last(page, "latency_slo_ms")[-1:] == [15.0], "the target line")
    time.sleep(2)
    _shot(page, "3-target-15")
    target.fill("0")
    target.press("Enter")


def _step_off(page: Any) -> None:
    """4. strategy off: only `idle` fires, every batch is one request."""
    page.locator(".widget-dropdown", has_text="strategy").locator("select").select_option("off")
    _wait(lambda: _last(page, "batch_max", 3) == [1.0] * 3, "batches of one", 20)
    # The target's held batches ('adaptive') leave the last second's rates too.
    _wait(lambda: _last(page, "adaptive", 3) == [0.0] * 3, "no held batches", 20)
    time.sleep(2)
    _shot(page, "4-off")


def _step_refused(page: Any) -> None:
    """5. a 0 typed next to max_batch_size is refused with its reason; nothing changes."""
    box = page.locator(".widget-slider", has_text="max_batch_size").locator(
        "xpath=following-sibling::*[1]//input"
    )
    box.fill("0")
    box.press("Enter")
    _wait(lambda: page.get_by_text("max_batch_size must be an integer >= 1").count(), "why")
    _shot(page, "5-refused")


def _run_all(page: Any) -> None:
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")


def _live_charts(page: Any, console: list[str], what: str) -> None:
    """Six figures, rows streaming into them, no failed view, no error in the console."""
    try:
        _wait(lambda: page.locator(".bk-Figure, .bk-figure").count() >= 6, f"{what}: six charts")
    except AssertionError:
        # Say why a view failed: JupyterLab shows it behind "Click to show javascript error".
        for button in page.get_by_text("Click to show javascript error").all():
            button.click()
        print("\n".join(page.locator(".jp-OutputArea-output").all_inner_texts()))
        raise
    n = newest_rows(page)
    _wait(lambda: newest_rows(page) > n + 5, f"{what}: rows streaming", timeout=30)
    assert page.get_by_text("Could not create a view").count() == 0, what
    # A reloaded page asks the kernel for every widget it had; those the re-run closed
    # meanwhile (the replaced dashboard's) are "not found": the page says so and goes on.
    errors = [m for m in console if m.startswith("error") and "Comm not found" not in m]
    assert not errors, (what, errors)


def _new_server(lab: dict[str, Any], old_url: str) -> dict[str, str]:
    """The server the re-run notebook started (its server.json rewritten with a new URL)."""
    path = lab["dir"] / "server.json"

    def written() -> dict[str, str] | None:
        try:
            server = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return server if server["url"] != old_url else None

    return _wait(written, "the re-run to start a new server", timeout=120)  # type: ignore[no-any-return]


def _closed(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2):
            return False
    except OSError:
        return True


def reload_run_all_and_a_second_browser(
    pw: Any, lab: dict[str, Any], page: Any, console: list[str], shot: str
) -> None:
    """Reload and Run All at once; then a second browser's Run All: six live charts each
    time, and the server each Run All replaced closed (no ghost). Screenshot ``shot``-*."""
    server = json.loads((lab["dir"] / "server.json").read_text())  # the one running now
    # Reload and Run All at once, without waiting for the old charts to come back.
    page.reload()
    page.wait_for_function(KERNEL_READY, timeout=90_000)
    _run_all(page)
    second = _new_server(lab, server["url"])
    _live_charts(page, console, "reloaded, Run All at once")
    # No ghost: re-creating the runner closed the old server (its load stopped).
    _wait(lambda: _closed(server["url"]), "the old server to close")
    page.screenshot(path=str(ARTIFACTS / f"{shot}-reload-run-all.png"), full_page=True)

    # A second browser on the same notebook: its Run All gives six live charts too.
    other = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    try:
        page2 = other.new_page(viewport={"width": 1500, "height": 1400})
        console2: list[str] = []
        page2.on("console", lambda msg: console2.append(f"{msg.type}: {msg.text}"))
        page2.goto(f"{lab['base']}{lab['path']}dashboard.ipynb?token={lab['token']}")
        page2.wait_for_function(KERNEL_READY, timeout=90_000)
        _run_all(page2)
        _new_server(lab, second["url"])
        _live_charts(page2, console2, "a second browser's Run All")
        _wait(lambda: _closed(second["url"]), "the first browser's server to close")
        page2.screenshot(path=str(ARTIFACTS / f"{shot}-second-browser.png"))
    finally:
        other.close()


def test_refusals_show_and_reload_run_all_and_a_second_browser_leave_no_ghost(lab):
    """Issue 25 as a new user met it: refusals on the page; reload and Run All at once; a
    second browser's Run All; each time six live charts, and the old server gone."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        with dashboard_page(pw, lab, "first-hour-failure") as (_browser, page, server, console):
            _wait(lambda: page.locator(".jp-OutputArea-output", has_text="ready").count(), "ready")
            # A queue of 8 and one item per call, far past capacity: requests are refused at
            # admission, and the page says so in the numbers line and on the throughput chart.
            _patch_config(server, strategy="off", max_batch_size=1, max_queue_size=8)
            start_load(page, 3000)
            _wait(lambda: max(last_values(page, "refused_rps")[-3:], default=0) > 0, "refusals")
            numbers = page.get_by_text("req/s served")
            _wait(lambda: numbers.count(), "the numbers line")
            _wait(
                lambda: re.search(r"\(refused [1-9][0-9.]*%\)", numbers.first.inner_text()),
                "the numbers line to show a refused share above 0",
            )
            page.screenshot(path=str(ARTIFACTS / "first-hour-refusals.png"), full_page=True)
            reload_run_all_and_a_second_browser(pw, lab, page, console, "first-hour")
