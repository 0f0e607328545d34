"""What the batch-size chart's min-max band costs Chromium to paint: a bar per tick or a varea.

    .venv/bin/python benchmarks/chart_paint.py [--rounds 5] [--paints 300]

The band is a bar per tick (``vbar``) so that it breaks where no batch fired; it was one
``varea`` polygon, which bridged those gaps. This builds the dashboard's charts with a full
60 s window at 5 Hz (330 rows, one tick in five without batches), once as they are and once
with the band drawn as a varea (the old chart), saves each as a standalone page, and times
``paints`` synchronous repaints of the batch-size plot in Debian's Chromium, alternating the
two pages for ``rounds`` rounds. Prints one JSON row per page per round (ms per repaint).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import tempfile

from bokeh.embed import file_html
from bokeh.resources import INLINE
from labserve.widgets.charts import Charts
from labserve.widgets.series import TICK_COLUMNS
from playwright.sync_api import sync_playwright

# Repaint the batch-size plot `n` times (every renderer invalidated), ms per repaint.
REPAINT = """(n) => {
  const views = [];
  const walk = (v) => { views.push(v); for (const c of v.child_views ?? []) walk(c); };
  for (const root of Object.values(Bokeh.index)) walk(root);
  const plot = views.find((v) => v.model.title && v.model.title.text.startsWith("Batch size"));
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    plot.invalidate_painters(...plot.renderer_views.keys());
    plot.paint();
  }
  return (performance.now() - t0) / n;
}"""


def page(band: str, folder: pathlib.Path) -> pathlib.Path:
    """A page of the charts over a full window, the band drawn as ``band``."""
    charts = Charts(follow_s=60.0, hz=5.0)
    for k in range(330):
        row = {c: [math.nan] for c in TICK_COLUMNS}
        row.update(t=[k / 5], max_batch_size=[64.0])
        if k % 5:
            row.update(batch_min=[2.0 + k % 3], batch_max=[12.0 + k % 7], batch_mean=[6.0])
        charts.stream(row)
    if band == "varea":
        fig = charts.figures["batch_size"]
        fig.renderers.remove(charts.band)
        fig.varea("t", "batch_min", "batch_max", source=charts.ticks, fill_alpha=0.25)
    path = folder / f"{band}.html"
    path.write_text(file_html(charts.layout, INLINE, band))
    return path


def main() -> None:
    """Time both pages, alternating."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of both pages")
    parser.add_argument("--paints", type=int, default=300, help="repaints timed per round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        pages = {band: page(band, pathlib.Path(tmp)) for band in ("vbar", "varea")}
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            for r in range(args.rounds):
                for band, path in pages.items():
                    tab = browser.new_page(viewport={"width": 1100, "height": 800})
                    tab.goto(path.as_uri())
                    tab.wait_for_function("() => window.Bokeh && Object.keys(Bokeh.index).length")
                    tab.evaluate(REPAINT, 20)  # warm
                    ms = tab.evaluate(REPAINT, args.paints)
                    print(json.dumps({"round": r, "band": band, "ms_per_repaint": round(ms, 3)}))
                    tab.close()
        finally:
            browser.close()


if __name__ == "__main__":
    main()
