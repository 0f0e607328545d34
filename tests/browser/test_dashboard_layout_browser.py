"""Both dashboards on a narrow JupyterLab page: every label whole, every status line seen.

A padded model with a latency target (the request dashboard's longest labels) and TinyLM
with ``max_num_seqs=256`` (the generation dashboard's) in a 1100 px wide page beside the
file browser, driven as ``test_dashboard_browser.py`` drives it (its helpers are loaded
from that file). Labels were cut ("max_num_batched_tok...", "latency target ..."), the
status box hid its last line, and the sequences chart's axis ran to 300 for a cap of 256.
"""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Any

_HERE = pathlib.Path(__file__).parent
_spec = importlib.util.spec_from_file_location(
    "_dashboard_browser", _HERE / "test_dashboard_browser.py"
)
assert _spec is not None and _spec.loader is not None
lab_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab_helpers)

pytestmark = lab_helpers.pytestmark
ARTIFACTS = lab_helpers.ARTIFACTS
_wait = lab_helpers._wait

CELLS = [
    "import time\n"
    "import numpy as np\n"
    "import labserve\n"
    "from labserve.lab.demo import TinyLM\n"
    "from labserve.widgets import Dashboard, GenerationDashboard\n"
    "\n"
    "class Tokens(labserve.Runnable):\n"
    "    @labserve.method(batchable=True, max_batch_size=64, max_latency_ms=20,\n"
    "                     pad=labserve.Padding(axis=1, pad_value=0, lengths_arg=None))\n"
    "    def encode(self, ids):\n"
    "        time.sleep((0.7 + 0.01 * ids.size) / 1000.0)\n"
    "        return np.asarray(ids.sum(axis=1, keepdims=True))\n"
    "\n"
    "runner = labserve.Runner(Tokens, name='tok', latency_slo_ms=100)\n"
    "dash = Dashboard(runner, example=lambda n: np.ones((1, max(2, int(n))), np.int64))\n"
    "dash",
    "lm = labserve.Runner(TinyLM, name='tinylm', max_num_seqs=256)\n"
    "gdash = GenerationDashboard(lm, rate=20, input_len='32', output_len='128')\n"
    "gdash",
    'print("ready")',
]

# Elements in the notebook's outputs whose text is cut (an ellipsis, or hidden overflow),
# and the status lines (widget HTML holding <code>) whose text does not all show.
CUT = """() => {
  const cut = [];
  for (const el of document.querySelectorAll('.jp-OutputArea-output *')) {
    const style = getComputedStyle(el);
    const clips = style.textOverflow === 'ellipsis' || style.overflowX === 'hidden'
      || style.overflowY === 'hidden';
    const text = (el.innerText || '').trim().slice(0, 80);
    if (!clips || !text || el.clientWidth === 0) continue;
    if (el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1) {
      cut.push(text);
    }
  }
  for (const area of document.querySelectorAll('.jp-OutputArea-output')) {
    const right = area.getBoundingClientRect().right;
    for (const code of area.querySelectorAll('.widget-html code')) {
      const box = code.getBoundingClientRect();
      const shown = code.closest('.widget-html').getBoundingClientRect();
      if (box.right > right + 1 || box.bottom > shown.bottom + 1) {
        cut.push(code.innerText.slice(0, 80));
      }
    }
  }
  return cut;
}"""

# The y range's end of the figure titled `title`.
Y_END = """(title) => {
  for (const doc of window.Bokeh.documents) {
    for (const m of doc.all_models) {
      if (m.title && m.title.text === title) return m.y_range.end;
    }
  }
  return null;
}"""


def test_labels_and_status_lines_show_whole_on_a_narrow_page(tmp_path: pathlib.Path) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with lab_helpers.run_lab(tmp_path, CELLS) as lab, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=lab_helpers.CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 1000})
            page.goto(f"{lab['base']}{lab['path']}dashboard.ipynb?token={lab['token']}&reset")
            page.wait_for_function(lab_helpers.KERNEL_READY, timeout=90_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            ready = page.locator(".jp-OutputArea-output", has_text="ready")
            _wait(ready.count, "Run All", timeout=120)
            _wait(lambda: page.locator(".bk-Figure, .bk-figure").count() >= 12, "12 charts")
            # Both status lines filled in (their settings lines are the longest).
            _wait(lambda: page.get_by_text("tok.encode: ").count(), "the status lines")
            _wait(lambda: page.get_by_text("tinylm.generate: ").count(), "the status lines")
            page.wait_for_timeout(1500)
            page.screenshot(path=str(ARTIFACTS / "dashboards-narrow.png"), full_page=True)
            cut: list[Any] = page.evaluate(CUT)
            assert cut == [], cut
            # The axis is sized from the cap once the first snapshot reaches the chart (on a
            # loaded machine that can be after the status lines): wait for it, then judge.
            title = "Sequences (now; preempted: last 1 s)"
            _wait(lambda: (page.evaluate(Y_END, title) or 0) > 256, "the y axis sized from the cap")
            end = page.evaluate(Y_END, title)
            assert 256 < end < 280, end  # the cap of 256 inside, no room to 300
        finally:
            browser.close()
