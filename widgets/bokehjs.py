"""Bring BokehJS to every page that shows a chart, inline, so charts draw offline (no CDN).

jupyter_bokeh's widget needs BokehJS already in the page, and sends none itself (its front-end
extension bundles none either). Every chart, a dashboard's or a static plot's, is displayed
after a hidden widget of its own that holds BokehJS (:func:`display_bokehjs`): the 2 MB script
lives in the kernel's widget state, so a page reloaded, or a second tab, gets it back with
the widgets, without re-running a cell, and the notebook file never holds it (only a
reference to the widget). This is the one way BokehJS reaches a page; :func:`load_bokehjs`
(a setup cell's) displays the same widget.
"""

from __future__ import annotations

import json
from typing import Any

import bokeh
from bokeh.resources import Resources
from IPython import get_ipython
from IPython.display import display

__all__ = ["STUB", "display_bokehjs", "load_bokehjs"]

LOAD_MIME = "application/vnd.bokehjs_load.v0+json"
"""The mime type jupyter_bokeh's JupyterLab extension runs as a script."""
STUB = "/* BEGIN bokeh.min.js */ /* not saved with the lesson: run this cell to load BokehJS */"
"""What a saved notebook keeps in place of BokehJS shown as an output (labserve's nbval
sanitizer matches both); labserve itself no longer shows it as one."""
ACK_NAME = "labserve-ack"
"""Name of the model in a chart document that carries each patch's sequence number.

A document that holds a model of that name (``Charts`` does) gets flow control: each patch
sets that model's ``name`` to ``"labserve-ack:<n>"`` on the page, and the page's echo of that
change says patch n was applied (see ``chartwidget.py``). The kernel's copy of the model never
changes. In such a document the page echoes nothing else (see the patches below)."""


_bundle_cache: dict[str, str] = {}


# Three patches to BokehJS's page-side work per frame, measured with a CDP profile and trace of
# a live dashboard in JupyterLab (benchmarks/HISTORY.md). BokehJS rewrites each renderer's
# position stylesheet on every paint; each rewrite invalidates the page's style, and BokehJS's
# next CSS read (it reads CSS variables for every text and fill colour) forces a style pass
# over JupyterLab's large page. (1) Skip rewrites that change nothing. (2) A glyph renderer's
# element is an empty box placed over its data, which moves on every streamed row: leave it
# where it is unless the renderer has a context menu (the one thing that element serves).
# (3) jupyter_bokeh's view sends the kernel every change to its document, including each one
# the kernel's own patch just made (a stream of rows, new axis ends); each is a kernel message
# that the kernel answers busy, then idle, and JupyterLab redraws its busy indicators (the
# favicon is fetched and decoded again) for each. In a document with a labserve-ack model,
# whose kernel side reads nothing but the ack (ChartWidget._sync_model), data changes other
# than the ack's reach no document listener; roots and titles still do.
# Each patch is a no-op if a BokehJS release renames what it patches.
_BOKEHJS_PATCHES = """
(function () {
  const ACK = ACK_NAME;
  try {
    const sheet = window.Bokeh.require("core/dom").InlineStyleSheet.prototype;
    const update = sheet._update;
    if (typeof update === "function" && !sheet._labserve_patched) {
      sheet._update = function (css) {
        if (this.el.textContent !== css) update.call(this, css);
      };
      sheet._labserve_patched = true;
    }
    const glyphs = window.Bokeh.require("models/renderers/glyph_renderer");
    const view = glyphs.GlyphRendererView.prototype;
    const position = view.update_position;
    if (typeof position === "function" && !view._labserve_patched) {
      view.update_position = function () {
        if (this.model.context_menu != null) position.call(this);
      };
      view._labserve_patched = true;
    }
    const doc = window.Bokeh.require("document/document").Document.prototype;
    const trigger = doc._trigger_on_change;
    if (typeof trigger === "function" && !doc._labserve_patched) {
      const echoes = new Set(["ModelChanged", "ColumnsStreamed", "ColumnsPatched",
                              "ColumnDataChanged"]);
      doc._trigger_on_change = function (event) {
        if (this._labserve_ack == null) {
          for (const m of this._all_models.values()) {
            if (typeof m.name === "string" && m.name.startsWith(ACK)) this._labserve_ack = m;
          }
        }
        const ack = this._labserve_ack;
        if (ack == null) return trigger.call(this, event);
        const keep = (e) => !echoes.has(e.kind) || e.model === ack;
        for (const e of Array.isArray(event.events) ? event.events : [event]) {
          if (keep(e)) trigger.call(this, e);
        }
      };
      doc._labserve_patched = true;
    }
  } catch (error) {
    console.warn("labserve: BokehJS patches not applied", error);
  }
})();
""".replace("ACK_NAME", json.dumps(ACK_NAME))


def _bundle() -> dict[str, str]:
    if not _bundle_cache:
        # The core library (and its WebGL and widgets parts) is all the charts need.
        resources = Resources(mode="inline", components=["bokeh", "bokeh-gl", "bokeh-widgets"])
        _bundle_cache[LOAD_MIME] = "\n".join([*resources.js_raw, _BOKEHJS_PATCHES])
        _bundle_cache["text/plain"] = f"BokehJS {bokeh.__version__} loaded"
    return _bundle_cache


_carrier_script: list[str] = []
_shown_by_cell: dict[str, tuple[str, list[Any]]] = {}
"""Cell id -> (the run's message id, the carriers that run displayed)."""


def display_bokehjs() -> Any:
    """Display a new hidden widget that brings BokehJS to the page, and return it.

    Call it just before displaying a chart (the page runs the script as it draws the
    widget, and jupyter_bokeh's views need BokehJS when they are made); close the widget
    with the chart. BokehJS travels in the widget's state, not in the notebook's outputs:
    a page gets it when it draws the widget, including a page reloaded (or a second tab)
    while the kernel lives, which restores its widgets from the kernel without re-running
    a cell; the saved notebook holds only a reference to the widget. The script does
    nothing on a page that has this version of BokehJS already. Show the chart one widget
    deeper than this one (in a box, as :class:`~labserve.widgets.ChartWidget` and the
    dashboards do): a reloaded page restores all its widgets at once, and a chart's view
    made at the top level was made before this widget's script had run.

    A new widget each time, not one per kernel: a page reloaded and then Run All at once
    knows the kernel's widgets only once it has fetched them all; until then a display of
    an existing widget fails ("Could not create a view for model id"), the page got no
    BokehJS, and every chart failed. A cell run again closes the carriers its earlier run
    displayed: the page that re-ran it replaced those outputs (BokehJS stays in the page),
    and every open carrier is 2 MB more for each reloaded page to fetch.

    Kernel main thread only (it displays an output of the running cell).
    """
    carrier = _new_carrier()
    _close_earlier_runs(carrier)
    display(carrier)  # type: ignore[no-untyped-call]  # unannotated in IPython
    return carrier


def _close_earlier_runs(carrier: Any) -> None:
    """Remember ``carrier`` as the running cell's; close those of the cell's earlier runs."""
    shell = get_ipython()
    get_parent = getattr(shell, "get_parent", None)  # ipykernel's shell has it
    parent = get_parent() if get_parent is not None else None
    if not isinstance(parent, dict):
        return
    cell = (parent.get("metadata") or {}).get("cellId")  # JupyterLab and Notebook 7 send it
    run = (parent.get("header") or {}).get("msg_id")
    if not isinstance(cell, str) or not isinstance(run, str):
        return
    last_run, carriers = _shown_by_cell.get(cell, (run, []))
    if last_run != run:
        for old in carriers:
            old.close()
        carriers = []
    _shown_by_cell[cell] = (run, [*carriers, carrier])


def _new_carrier() -> Any:
    import ipywidgets as w

    if not _carrier_script:  # made once: every carrier holds the same 2 MB string
        version = json.dumps(bokeh.__version__)
        guard = f"if (!(window.Bokeh && window.Bokeh.version === {version})) {{"
        _carrier_script.append(f"{guard}\n{_bundle()[LOAD_MIME]}\n}}")
    script = _carrier_script[0]
    output = {
        "output_type": "display_data",
        "data": {LOAD_MIME: script, "text/plain": _bundle()["text/plain"]},
        "metadata": {},
    }

    class BokehJS(w.Output):  # type: ignore[misc]
        def __repr__(self) -> str:  # the default would hold the whole script
            return _bundle()["text/plain"]

    return BokehJS(outputs=(output,), layout=w.Layout(display="none"))


def load_bokehjs(force: bool = False) -> None:
    """Display BokehJS (inline, works offline) in a hidden widget, as :func:`display_bokehjs`.

    labserve's charts each bring it themselves; this is for a setup cell written before they
    did, or for other jupyter_bokeh widgets. ``force`` is kept for old callers: every call
    displays it.
    """
    display_bokehjs()
