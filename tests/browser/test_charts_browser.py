"""What the request dashboard's charts draw, in Chromium: a standalone page, no Jupyter.

The charts are filled in the kernel's way (``Charts.stream``, or a finished run's rows), saved
with BokehJS inline, and opened in Chromium; the test reads the tick positions BokehJS chose
and the pixels it painted. Chromium is found as ``test_dashboard_browser.py`` finds it (its
helpers are loaded from that file).
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
from typing import Any

import numpy as np
import pytest

import labserve

_HERE = pathlib.Path(__file__).parent
_spec = importlib.util.spec_from_file_location(
    "_dashboard_browser", _HERE / "test_dashboard_browser.py"
)
assert _spec is not None and _spec.loader is not None
lab_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab_helpers)

pytestmark = lab_helpers.pytestmark
SIZES = "Batch size (each tick's batches)"
LATENCY = "Latency of served requests (recorder window)"

# The plot view of the figure titled `title`: the screen positions (px from the canvas top)
# of its y axis's major and minor ticks, and the colours painted at data points [x, y].
READ_PLOT = """([title, points]) => {
  const views = [];
  const walk = (v) => { views.push(v); for (const c of v.child_views ?? []) walk(c); };
  for (const root of Object.values(Bokeh.index)) walk(root);
  const plot = views.find((v) => v.model.title && v.model.title.text === title);
  const axis = [...plot.renderer_views.values()].find((v) => v.model.type === "LogAxis");
  const y = (value) => plot.frame.y_scale.compute(value);
  const ticks = axis.tick_coords;
  const canvas = plot.canvas_view.primary.canvas;
  const ratio = canvas.width / plot.canvas_view.bbox.width;
  const context = canvas.getContext("2d");
  const colours = points.map(([px, py]) => {
    const sx = Math.round(plot.frame.x_scale.compute(px) * ratio);
    return Array.from(context.getImageData(sx, Math.round(y(py) * ratio), 1, 1).data);
  });
  return {major: ticks.major[1], at: ticks.major[1].map(y), minor: ticks.minor[1].map(y),
          colours};
}"""


def _row(t: float, **values: float) -> dict[str, list[float]]:
    from labserve.widgets.series import TICK_COLUMNS

    row = {c: [math.nan] for c in TICK_COLUMNS}
    row.update({"t": [t]}, **{k: [v] for k, v in values.items()})
    return row


def _draw(browser: Any, layout: Any, path: pathlib.Path) -> Any:
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    path.write_text(file_html(layout, INLINE, path.stem))
    page = browser.new_page(viewport={"width": 1100, "height": 800})
    page.goto(path.as_uri())
    page.wait_for_function("() => window.Bokeh && Object.keys(Bokeh.index).length > 0")
    page.wait_for_timeout(500)  # the first paint
    return page


def _assert_readable(plot: dict[str, Any], what: str) -> None:
    """Major ticks far enough apart for their labels (11 px), minor ticks not a smear."""
    gaps = np.abs(np.diff(plot["at"]))
    assert len(plot["at"]) >= 2 and gaps.min() >= 12, (what, plot["major"], plot["at"])
    minor = np.abs(np.diff(sorted(plot["minor"])))
    assert not len(minor) or minor.min() >= 3, (what, plot["minor"])


@pytest.fixture
def chromium() -> Any:
    from playwright.sync_api import sync_playwright

    lab_helpers.ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=lab_helpers.CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def test_log_axes_read_cleanly_before_any_batch_and_with_a_constant_value(chromium, tmp_path):
    from labserve.widgets.charts import Charts, charts_for_result

    # Live, before any batch: only the cap (64) and the wait cap (10 ms) are drawn.
    idle = Charts(follow_s=60.0)
    for k in range(20):
        idle.stream(_row(k / 5, max_batch_size=64.0, max_latency_ms=10.0, latency_bound=12.0))
    page = _draw(chromium, idle.layout, tmp_path / "idle.html")
    for title in (SIZES, LATENCY):
        _assert_readable(page.evaluate(READ_PLOT, [title, []]), f"live, no batch: {title}")
    page.screenshot(path=str(lab_helpers.ARTIFACTS / "charts-no-batch.png"))

    # A finished run whose batches all held 1 item under a cap of 4.
    run = labserve.simulate(np.arange(0.0, 2.0, 0.01), duration_s=2.0, cost=(1.0, 0.1),
                            strategy="fixed", max_batch_size=4, max_latency_ms=1)  # fmt: skip
    assert set(run.batch_items.tolist()) == {1}
    page = _draw(chromium, charts_for_result(run).layout, tmp_path / "run.html")
    for title in (SIZES, LATENCY):
        _assert_readable(page.evaluate(READ_PLOT, [title, []]), f"finished run: {title}")


def test_the_batch_size_band_breaks_where_no_batch_fired(chromium, tmp_path):
    from labserve.widgets.charts import Charts

    charts = Charts(follow_s=60.0, hz=5.0)
    for k in range(100):  # batches of 2-12 items, none from 6 s to 12 s
        busy = not 30 <= k < 60
        sizes = {"batch_min": 2.0, "batch_max": 12.0, "batch_mean": 6.0} if busy else {}
        charts.stream(_row(k / 5, max_batch_size=64.0, **sizes))
    page = _draw(chromium, charts.layout, tmp_path / "gap.html")
    # At 4 items (inside the band, off the mean line): busy stretches, then the idle gap.
    plot = page.evaluate(READ_PLOT, [SIZES, [[3.0, 4.0], [15.0, 4.0], [8.0, 4.0], [10.0, 4.0]]])
    page.screenshot(path=str(lab_helpers.ARTIFACTS / "charts-idle-gap.png"))
    busy_3s, busy_15s, gap_8s, gap_10s = (tuple(c[:3]) for c in plot["colours"])
    white = (255, 255, 255)
    assert busy_3s != white and busy_15s == busy_3s, plot["colours"]
    assert gap_8s == white and gap_10s == white, plot["colours"]
