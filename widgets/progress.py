"""A notebook progress bar for ``labserve.sweep(progress=...)`` (the terminal's is tqdm's).

The core only calls ``progress(done, total)``; this is one such callable, drawn as an
ipywidgets bar with the count, the time taken and an estimate of the time left.
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any

import ipywidgets as w
from IPython.display import display as show_in_cell

__all__ = ["ProgressBar"]

_MIN_INTERVAL_S = 0.1
"""At most ten redraws a second (a large sweep calls once per point); the last always."""


class ProgressBar:
    """A progress bar to pass as ``progress=``: ``bar(done, total)`` after each point.

    Shown at once in the cell that makes it (``display=False`` to show it yourself: it is
    the last line of a cell, or ``IPython.display.display(bar)``). Thread-safe: a sweep
    fanned out over an executor may call it from any thread.

    >>> from labserve.widgets import ProgressBar                     # doctest: +SKIP
    >>> rows = labserve.sweep(rates=[1000, 4000], max_batch_size=[8, 64],
    ...                       progress=ProgressBar("simulating"))
    """

    def __init__(self, description: str = "sweep", *, unit: str = "point", display: bool = True):
        self.description = description
        self.unit = unit
        self.done = 0
        """Points done, as last reported."""
        self.total = 0
        """Points in all, as last reported (0 before the first call)."""
        self.bar = w.IntProgress(value=0, min=0, max=1, description=description,
                                 bar_style="info", layout=w.Layout(width="420px"))  # fmt: skip
        self.label = w.HTML(value="<code>waiting for the first point</code>")
        self.box = w.HBox([self.bar, self.label])
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._drawn_at = -float("inf")
        if display:
            show_in_cell(self)  # type: ignore[no-untyped-call]  # IPython's display is unannotated

    def __call__(self, done: int, total: int) -> None:
        """Report ``done`` of ``total`` points (what ``sweep(progress=...)`` calls)."""
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise ValueError(f"total must be an integer >= 1, got {total!r}")
        if isinstance(done, bool) or not isinstance(done, int) or not 0 <= done <= total:
            raise ValueError(f"done must be an integer in [0, {total}], got {done!r}")
        with self._lock:
            self.done, self.total = done, total
            now = time.monotonic()
            if done < total and now - self._drawn_at < _MIN_INTERVAL_S:
                return
            self._drawn_at = now
            self._draw(now - self._started)

    def _draw(self, elapsed_s: float) -> None:
        done, total, unit = self.done, self.total, self.unit
        self.bar.max = total
        self.bar.value = done
        if done == total:
            self.bar.bar_style = "success"
            text = f"{total:,} {unit}s in {elapsed_s:.1f} s"
        else:
            left = elapsed_s / done * (total - done) if done else float("nan")
            eta = f" · about {left:.0f} s left" if done else ""
            text = f"{done:,} / {total:,} {unit}s · {elapsed_s:.1f} s{eta}"
        self.label.value = f"<code>{html.escape(text)}</code>"

    def close(self) -> None:
        """Remove the bar from the page."""
        self.box.close()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = self.box._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):  # the box's own text holds the live label
            bundle["text/plain"] = repr(self)
        return bundle

    def __repr__(self) -> str:
        return f"<ProgressBar {self.description}>"
