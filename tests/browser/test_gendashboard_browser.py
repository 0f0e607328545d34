"""The generation dashboard in a real browser: JupyterLab runs it, Chromium drives it.

A notebook serves TinyLM in the kernel and shows ``GenerationDashboard(runner)``; the test
starts the load from the page and watches the charts' data move (read from BokehJS in the
page), drags ``max_num_seqs`` and sees the runner's config (``GET /config``) and the charts
follow, changes it from outside (``PATCH /config``) and sees the slider follow, then saves and
reloads (live charts, no cell re-run), and reloads and runs everything at once (live charts).
JupyterLab is started as ``test_dashboard_browser.py`` starts it (its helpers are loaded from
that file).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import time
import urllib.request
from typing import Any

import pytest

_HERE = pathlib.Path(__file__).parent
_spec = importlib.util.spec_from_file_location(
    "_dashboard_browser", _HERE / "test_dashboard_browser.py"
)
assert _spec is not None and _spec.loader is not None
lab_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab_helpers)

ARTIFACTS = lab_helpers.ARTIFACTS
KERNEL_READY = lab_helpers.KERNEL_READY
_wait = lab_helpers._wait

# The columns of the chart source the kernel wrote last (the largest last ``clock_s``): after a
# reload and a re-run the page may still hold the old view's document, frozen at its rollover.
READ_NEWEST = """() => {
  const columns = (data) => typeof data.get === "function"
    ? Array.from(data.entries()) : Object.entries(data);
  let best = null;
  for (const doc of (window.Bokeh && window.Bokeh.documents) || []) {
    for (const m of doc.all_models) {
      if (!m.data) continue;
      const cols = Object.fromEntries(columns(m.data));
      const clock = cols["clock_s"];
      if (!clock || !clock.length) continue;
      const last = clock[clock.length - 1];
      if (best === null || last > best.last) best = {last, cols};
    }
  }
  if (best === null) return null;
  const out = {};
  for (const [k, v] of Object.entries(best.cols)) out[k] = Array.from(v.slice(-25));
  out.newest_s = best.last;
  out.rows = best.cols["clock_s"].length;
  return out;
}"""


def newest(page: Any) -> dict[str, Any]:
    """The newest chart source: its last 25 values of each column, ``rows``, ``newest_s``."""
    return page.evaluate(READ_NEWEST) or {"rows": 0, "newest_s": 0.0}  # type: ignore[no-any-return]


def last_values(page: Any, column: str) -> list[float]:
    """``column``'s last values in the newest chart source (NaN and null left out)."""
    values = newest(page).get(column, [])
    return [v for v in values if v is not None and v == v]


pytestmark = lab_helpers.pytestmark

CELLS = [
    "import json\n"
    "import labserve\n"
    "from labserve.lab.demo import TinyLM\n"
    "from labserve.widgets import GenerationDashboard",
    'runner = labserve.Runner(TinyLM(), name="lm")\n'
    "server = labserve.serve(runner)\n"
    'with open("server.json", "w") as f:\n'
    '    json.dump({"url": server.url, "token": server.token}, f)',
    'dash = GenerationDashboard(runner, rate=20, input_len="lognormal:32:128",\n'
    '                           output_len="lognormal:96:256")\n'
    "dash",
    'print("ready")',
]


def _config(server: dict[str, str]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{server['url']}/config", headers={"Authorization": f"Bearer {server['token']}"}
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        return json.load(reply)["lm"]["generate"]  # type: ignore[no-any-return]


def _patch(server: dict[str, str], **changes: Any) -> None:
    body = json.dumps({"runner": "lm", "method": "generate", **changes}).encode()
    request = urllib.request.Request(
        f"{server['url']}/config",
        data=body,
        method="PATCH",
        headers={"Authorization": f"Bearer {server['token']}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5):
        pass


def _charts_live(page: Any, console: list[str], what: str) -> None:
    _wait(lambda: page.locator(".bk-Figure, .bk-figure").count() >= 6, f"{what}: charts")
    then = newest(page)["newest_s"]
    _wait(lambda: newest(page)["newest_s"] > then + 2, f"{what}: rows streaming", timeout=30)
    assert page.get_by_text("Could not create a view").count() == 0, what
    # A reloaded page asks the kernel for every widget it had; those a re-run closed
    # meanwhile (the replaced dashboard's) are "not found": the page says so and goes on.
    errors = [m for m in console if m.startswith("error") and "Comm not found" not in m]
    assert not errors, (what, errors)


def _reload_and_run_all(page: Any, console: list[str]) -> None:
    """Save, reload with the kernel alive: live charts. Reload and Run All at once: live."""
    dirty = "() => window.jupyterapp.shell.currentWidget.context.model.dirty"
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    _wait(lambda: not page.evaluate(dirty), "the save")
    page.reload()
    page.wait_for_function(KERNEL_READY, timeout=90_000)
    _charts_live(page, console, "reloaded, no cell re-run")
    # The hard case: Run All before the reloaded page has fetched the kernel's widgets.
    page.reload()
    page.wait_for_function(KERNEL_READY, timeout=90_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    _wait(lambda: page.locator(".jp-OutputArea-output", has_text="ready").count(), "re-run")
    _charts_live(page, console, "reloaded and Run All at once")
    page.get_by_role("button", name="start load").click()
    _wait(lambda: max(last_values(page, "decode_per_step") or [0]) > 0, "load after re-run")
    page.screenshot(path=str(ARTIFACTS / "gendashboard-reloaded.png"), full_page=True)


@pytest.fixture
def lab(tmp_path: pathlib.Path) -> Any:
    with lab_helpers.run_lab(tmp_path, CELLS) as served:
        yield served


def test_the_generation_dashboard_moves_under_load_and_its_knob_takes_effect(lab):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=lab_helpers.CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 1500})
        console: list[str] = []
        page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
        try:
            page.goto(f"{lab['base']}{lab['path']}dashboard.ipynb?token={lab['token']}&reset")
            page.wait_for_function(KERNEL_READY, timeout=90_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            server_file = lab["dir"] / "server.json"
            _wait(server_file.exists, "the notebook to start the server", timeout=90)
            server = json.loads(server_file.read_text())
            # Run All ran the cell after the dashboard: the charts are still there.
            _wait(lambda: page.locator(".jp-OutputArea-output", has_text="ready").count(), "ready")
            _wait(lambda: page.locator(".bk-Figure, .bk-figure").count() >= 6, "six figures")

            # Start the length mix from the page: sequences run, steps carry tokens.
            page.get_by_role("button", name="start load").click()
            _wait(lambda: max(last_values(page, "num_running") or [0]) > 0, "sequences running")
            _wait(lambda: max(last_values(page, "decode_per_step") or [0]) > 0, "decode tokens")
            _wait(lambda: max(last_values(page, "ttft_p50") or [0]) > 0, "TTFT percentiles")
            _wait(lambda: page.get_by_text("sent · running").count(), "the load's status")

            # Drag max_num_seqs to 2 (option 1 of 1, 2, 4, ..., 1024): the runner follows at
            # its next step, and so do the cap line and the running sequences.
            lab_helpers._drag_slider_to(page, "max_num_seqs", index=1, steps=11)
            _wait(lambda: _config(server)["max_num_seqs"] == 2, "/config to say 2")
            _wait(lambda: last_values(page, "max_num_seqs")[-1:] == [2], "the cap line at 2")
            # Running sequences are not preempted by a lower cap: they drain as they finish
            # (on a loaded machine that took more than 2 s from 32), then stay under it.
            _wait(lambda: 0 < max(last_values(page, "num_running")[-8:] or [0]) <= 2,
                  "the running sequences to drain under the new cap")  # fmt: skip
            then = newest(page)["newest_s"]
            _wait(lambda: newest(page)["newest_s"] > then + 2, "rows under the new cap")
            assert 0 < max(last_values(page, "num_running")[-8:]) <= 2
            time.sleep(2)
            page.screenshot(path=str(ARTIFACTS / "gendashboard-cap-2.png"), full_page=True)

            # Another client changes it (PATCH /config): the slider and the line follow.
            _patch(server, max_num_seqs=64)
            readout = page.locator(".widget-slider", has_text="max_num_seqs").locator(
                ".widget-readout"
            )
            _wait(lambda: readout.inner_text().strip() == "64", "the slider to show 64")
            _wait(lambda: last_values(page, "max_num_seqs")[-1:] == [64], "the cap line at 64")
            time.sleep(2)
            page.screenshot(path=str(ARTIFACTS / "gendashboard.png"), full_page=True)

            _reload_and_run_all(page, console)
        except BaseException:
            print("\n".join(console[-60:]))
            page.screenshot(path=str(ARTIFACTS / "gendashboard-failure.png"), full_page=True)
            raise
        finally:
            browser.close()
