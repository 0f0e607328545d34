"""Load BokehJS into the notebook page inline, so charts draw offline (no CDN).

jupyter_bokeh's widget needs BokehJS already in the page, and sends none itself. A dashboard
brings it with each display (:func:`show_bokehjs`), so a page reloaded, or a second tab, while
the kernel lives gets working charts when the cells run again; once a page has drawn the
charts, that 2 MB output becomes a stub, so the notebook file stays small. Other charts load it
once per kernel (:func:`load_bokehjs`, also for a setup cell).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import bokeh
from bokeh.resources import Resources

__all__ = ["STUB", "load_bokehjs", "show_bokehjs"]

LOAD_MIME = "application/vnd.bokehjs_load.v0+json"
"""The mime type jupyter_bokeh's JupyterLab extension runs as a script."""
STUB = "/* BEGIN bokeh.min.js */ /* not saved with the lesson: run this cell to load BokehJS */"
"""What a saved notebook keeps in place of BokehJS (labserve's nbval sanitizer matches both)."""
_loaded = False


_bundle_cache: dict[str, str] = {}


def _bundle() -> dict[str, str]:
    if not _bundle_cache:
        # The core library (and its WebGL and widgets parts) is all the charts need.
        resources = Resources(mode="inline", components=["bokeh", "bokeh-gl", "bokeh-widgets"])
        _bundle_cache[LOAD_MIME] = "\n".join(resources.js_raw)
        _bundle_cache["text/plain"] = f"BokehJS {bokeh.__version__} loaded"
    return _bundle_cache


def show_bokehjs() -> Callable[[], None]:
    """Display BokehJS now, even if this kernel did before; return what stubs that output.

    A page reloaded (or a second tab) while the kernel lives has no BokehJS, and jupyter_bokeh
    sends it once per kernel: so a dashboard brings its own each time it is displayed. Once a
    page has drawn its charts, call the returned function (thread-safe, idempotent): it
    replaces the 2 MB output with a short stub, so the notebook file stays small, and the
    page keeps the BokehJS it already ran.
    """
    global _loaded
    from IPython.display import display

    handle = display(_bundle(), raw=True, display_id=True)
    _loaded = True
    done = threading.Event()

    def stub() -> None:
        if handle is not None and not done.is_set():
            done.set()
            handle.update({LOAD_MIME: STUB, "text/plain": _bundle()["text/plain"]}, raw=True)

    return stub


def load_bokehjs(force: bool = False) -> None:
    """Display BokehJS (inline, about 2 MB of script) unless this kernel already did.

    The output carries the script; its text form says which version was loaded.
    """
    global _loaded
    if _loaded and not force:
        return
    from IPython.display import display

    display(_bundle(), raw=True)
    _loaded = True
