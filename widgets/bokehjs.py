"""Load BokehJS into the notebook page inline, so charts draw offline (no CDN).

jupyter_bokeh's widget needs BokehJS already in the page. Displaying a chart or a
dashboard loads it once per kernel; :func:`load_bokehjs` loads it on purpose (run it in a
setup cell to have charts survive a page reload: the page reloads it from that output).
"""

from __future__ import annotations

import bokeh
from bokeh.resources import Resources

__all__ = ["load_bokehjs"]

LOAD_MIME = "application/vnd.bokehjs_load.v0+json"
"""The mime type jupyter_bokeh's JupyterLab extension runs as a script."""
_loaded = False


def load_bokehjs(force: bool = False) -> None:
    """Display BokehJS (inline, about 2 MB of script) unless this kernel already did.

    The output carries the script; its text form says which version was loaded.
    """
    global _loaded
    if _loaded and not force:
        return
    from IPython.display import display

    # The core library (and its WebGL and widgets parts) is all the charts need.
    resources = Resources(mode="inline", components=["bokeh", "bokeh-gl", "bokeh-widgets"])
    js = "\n".join(resources.js_raw)
    display({LOAD_MIME: js, "text/plain": f"BokehJS {bokeh.__version__} loaded"}, raw=True)
    _loaded = True
