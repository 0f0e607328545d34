"""The jupyter_bokeh widget the charts travel in: one writer, one patch per tick, flow control.

jupyter_bokeh's :class:`BokehModel` is built for a document that the page edits too. Here a
pump thread is the document's only writer and the page only draws, so :class:`ChartWidget`
overrides three of its hooks: ``_document_patched`` (how a change goes to the page),
``_sync_model`` (what the page sends back) and ``_model_to_traits`` (the state a new view or
a reloaded page starts from). They are private to jupyter_bokeh: pyproject pins the versions
they were tested with, and ``tests/widgets/test_jupyter_bokeh_hooks.py`` fails, naming the
hook, if an upgrade changes them.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

from bokeh.core.json_encoder import serialize_json
from bokeh.core.serialization import Serializer
from bokeh.document.events import ColumnsStreamedEvent
from bokeh.protocol.messages.patch_doc import patch_doc
from jupyter_bokeh import BokehModel

from .bokehjs import load_bokehjs

__all__ = ["HOOKS", "ChartWidget", "one_patch_per_widget"]

HOOKS: dict[str, tuple[str, ...]] = {
    "_document_patched": ("self", "event"),
    "_sync_model": ("self", "_model", "content", "_buffers"),
    "_model_to_traits": ("cls", "model"),
}
"""jupyter_bokeh's private hooks ChartWidget overrides or calls, with their parameters."""

_batch = threading.local()


@contextlib.contextmanager
def one_patch_per_widget() -> Iterator[None]:
    """Send a ChartWidget's document changes made in this block (on this thread) as one patch.

    A pump tick then costs the page one message instead of four.
    """
    _batch.pending = pending = {}
    try:
        yield
    finally:
        del _batch.pending
        for widget, events in pending.items():
            widget._send_patch(events)


_MAX_UNACKED = 8
"""Changes sent but not yet drawn by the page before more are held back (and merged)."""
_ACK_TIMEOUT_S = 3.0
"""With no word from the page for this long (no view open), send anyway."""


def _merged(events: list[Any]) -> list[Any]:
    """Held changes as few as possible: streams into one source become one stream."""
    out: list[Any] = []
    for event in events:
        last = next((o for o in reversed(out) if getattr(o, "model", None) is event.model), None)
        if (
            isinstance(event, ColumnsStreamedEvent)
            and isinstance(last, ColumnsStreamedEvent)
            and last.rollover == event.rollover
            and set(last.data) == set(event.data)
        ):
            keep = event.rollover or None
            data = {k: (list(last.data[k]) + list(event.data[k]))[-keep if keep else 0 :]
                    for k in event.data}  # fmt: skip
            merged = ColumnsStreamedEvent(
                event.document, event.model, event.attr, data, event.rollover, event.setter
            )
            out[out.index(last)] = merged
        else:
            out.append(event)
    return out


class ChartWidget(BokehModel):  # type: ignore[misc]
    """jupyter_bokeh's widget for display-only charts that a pump thread streams into.

    What it changes, each found in a real browser: a patch reaches the page in a framing no
    view can read out of step; nothing the page sends back changes the document (the pump
    stays its only writer); a tick's changes travel as one patch; a page that draws slower
    than the pump streams gets fewer, merged patches instead of a growing backlog;
    ``close()`` may be called twice (jupyter_bokeh's raises KeyError the second time, and
    ipywidgets calls it again when the widget is collected).
    """

    _closed = False

    def __init__(self, model: Any, *, lock: Any = None, **kwargs: Any) -> None:
        """Show ``model``; ``lock``: held by the document's writer while it writes, if any.

        With a lock, the state a new view or a reloaded page asks for is the document as it
        is now (read under the lock), not as it was when the widget was made: streamed rows
        reach open views as patches, never jupyter_bokeh's saved render bundle.
        """
        self._flow = threading.Lock()
        self._held: list[Any] = []
        self._unacked = 0
        self._last_heard = time.monotonic()
        self._writer_lock = lock
        super().__init__(model, **kwargs)

    def get_state(self, key: Any = None) -> dict[str, Any]:
        """The widget's state; its render bundle re-read from the live document."""
        state: dict[str, Any] = super().get_state(key)
        if "render_bundle" in state and self._writer_lock is not None:
            with self._writer_lock:
                state["render_bundle"] = serialize_json(self._model_to_traits(self._model))
        return state

    def _document_patched(self, event: Any) -> None:
        if event.setter is self:
            return
        pending = getattr(_batch, "pending", None)
        if pending is not None:
            pending.setdefault(self, []).append(event)
        else:
            self._send_patch([event])

    def _send_patch(self, events: list[Any]) -> None:
        # Flow control: BokehJS sends back each change it has applied (see _sync_model), so
        # the changes sent and not yet drawn are known. Past a few, hold the new ones and
        # send them merged once the page catches up: a slow page draws less often instead of
        # falling further and further behind the live numbers.
        with self._flow:
            self._held += events
            now = time.monotonic()
            if self._unacked >= _MAX_UNACKED and now - self._last_heard < _ACK_TIMEOUT_S:
                return
            if self._unacked >= _MAX_UNACKED:  # no word for a while: no view is drawing
                self._unacked = 0
                self._last_heard = now
            events, self._held = _merged(self._held), []
            self._unacked += len(events)
        # jupyter_bokeh sends a patch as three comm messages (header, metadata, content) that
        # BokehJS reassembles in order. A view that starts listening between two of them (a
        # chart displayed, or a page reloaded, while a pump streams) reads every later patch
        # out of step and stops updating for good. Here each message is one JSON object that
        # is all three at once, sent three times: whichever copy lands in the content slot,
        # every patch is applied exactly once. (Arrays would go inline, not as buffers, so a
        # message stays one fragment; the charts stream lists, cheaper here than arrays.)
        doc = events[0].document
        # References: the changed models only (the page has them all already); passing every
        # model of the document costs a dict of ~300 entries per tick.
        touched = {e.model for e in events if getattr(e, "model", None) is not None}
        serializer = Serializer(references=touched, deferred=False)
        content = {"events": serializer.encode(events)}
        doc.models.flush_synced(lambda model: not serializer.has_ref(model))
        whole = json.dumps({**patch_doc.create_header(), "num_buffers": 0, **content})
        for _ in range(3):
            self.send({"msg": "patch", "payload": whole})

    def _sync_model(self, _model: Any, content: dict[str, Any], _buffers: list[Any]) -> None:
        # BokehJS sends back each change it applied (and each view's pans and zooms). Applying
        # that here would make the kernel's main thread a second writer of the document and
        # double every streamed row: views are display-only. It does say the page has drawn.
        if content.get("event") == "jsevent":
            with self._flow:
                self._unacked = max(self._unacked - 1, 0)
                self._last_heard = time.monotonic()

    def __repr__(self) -> str:
        # The default repr holds random document ids: a saved notebook output would change.
        return f"ChartWidget({type(self._model).__name__})"

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        load_bokehjs()
        return super()._repr_mimebundle_(**kwargs)

    def close(self) -> None:
        """Close the widget (idempotent)."""
        if not self._closed:
            self._closed = True
            super().close()
