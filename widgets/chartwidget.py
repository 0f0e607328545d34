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
import functools
import inspect
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec

import ipywidgets as w
from bokeh.core.json_encoder import serialize_json
from bokeh.core.serialization import Serializer
from bokeh.document.events import ColumnsStreamedEvent, ModelChangedEvent
from bokeh.protocol.messages.patch_doc import patch_doc
from IPython import get_ipython
from jupyter_bokeh import BokehModel

from .bokehjs import ACK_NAME, display_bokehjs

__all__ = ["ACK_NAME", "HOOKS", "ChartWidget", "in_a_widget", "one_patch_per_widget"]

P = ParamSpec("P")

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
    pending: dict[ChartWidget, list[Any]] = {}
    _batch.pending = pending
    try:
        yield
    finally:
        del _batch.pending
        for widget, events in pending.items():
            widget._send_patch(events)


MAX_IN_FLIGHT = 1
"""Patches asking for an acknowledgement, sent and not yet applied by the page, before new
changes are held (and merged)."""
ACK_EVERY_S = 1.0
"""A page that keeps up is asked to acknowledge a patch this often, not every patch. Each
answer is a kernel message, which the kernel announces busy, then idle; JupyterLab redraws its
busy indicators (and swaps its favicon) for each: at 5 Hz that cost the page more than its
charts (benchmarks/HISTORY.md)."""
SLOW_ACK_S = 0.15
"""An acknowledgement later than this (under a 5 Hz tick) says the page is not keeping up:
from then on every patch asks for one, and new changes are held while one is outstanding.
The same while a patch asking for one has waited this long."""
CALM_S = 2.0
"""Acknowledgements must have been quick for this long before patches stop asking for one
each (so also at the start, and after a page read the whole state)."""
ACK_TIMEOUT_S = 1.0
"""While a cell runs, the kernel's main thread cannot read the page's answers: with none for
this long, one patch goes out anyway (so the charts move, once a second, during a cell). The
same until a page first answers, and after a page (a reloaded one) read the whole state: the
first patches may reach a page before its view exists (Notebook 7 met that on every Run All),
and a view never answers a patch it did not get."""
SILENT_TIMEOUT_S = 10.0
"""Otherwise, with no answer for this long (no view open), one patch goes out anyway."""


class _CellWatch:
    """Whether a notebook cell is running, from IPython's pre/post_run_cell events."""

    def __init__(self) -> None:
        self.running = False
        self._hooked: object = None

    def hook(self) -> None:
        """Follow the current IPython shell's cells (idempotent; no-op outside IPython)."""
        shell = get_ipython()
        if shell is None or shell is self._hooked:
            return
        shell.events.register("pre_run_cell", self._pre)
        shell.events.register("post_run_cell", self._post)
        self._hooked = shell

    def _pre(self, *_: Any) -> None:
        self.running = True

    def _post(self, *_: Any) -> None:
        self.running = False


_cells = _CellWatch()


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
    _clock = staticmethod(time.monotonic)

    def __init__(self, model: Any, *, lock: Any = None, **kwargs: Any) -> None:
        """Show ``model``; ``lock``: held by the document's writer while it writes, if any.

        The state a new view or a reloaded page asks for is the document as it is now (read
        under the lock, if any), not as it was when the widget was made: streamed rows reach
        open views as patches, never jupyter_bokeh's saved render bundle.
        """
        self._flow = threading.Lock()
        self._held: list[Any] = []
        self._sent = 0  # patches sent (their sequence numbers)
        self._acked = 0  # the newest sequence number a page said it applied
        self._asked = 0  # the newest patch that asked for an acknowledgement
        self._asked_at = -math.inf
        self._calm_since: float | None = None  # acknowledgements all quick since then
        self._answered = False  # a page answered since the state was last read
        self._state_at = 0  # patches sent when the state was last read
        self._last_sent = 0.0
        self.updates = 0
        """Changes handed to the widget (a pump tick each)."""
        self.merged = 0
        """Of those, how many were held and went out merged into a later patch."""
        find = getattr(model, "select_one", None)
        self._ack_model = find({"name": ACK_NAME}) if find is not None else None
        self._writer_lock = lock
        self._shown: list[Any] = []  # the widgets each display of this one showed with it
        _cells.hook()
        super().__init__(model, **kwargs)

    @property
    def acknowledged(self) -> int:
        """The newest patch a page said it applied (0 until a view has drawn the charts).

        A page that keeps up is asked about one patch a second (see ACK_EVERY_S), so this
        may trail the patches sent by that much.
        """
        return self._acked

    def get_state(self, key: Any = None) -> dict[str, Any]:
        """The widget's state; its render bundle re-read from the live document."""
        state: dict[str, Any] = super().get_state(key)
        if "render_bundle" in state:
            with self._writing():
                state["render_bundle"] = serialize_json(self._model_to_traits(self._model))
        if "render_bundle" in state:
            # A page that reads the whole state (a reloaded page, a second tab) draws from the
            # document as it is now: it will not answer patches sent before, so they no
            # longer hold new ones back.
            with self._flow:
                self._acked = self._state_at = self._sent
                self._answered = False
                self._calm_since = None
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
        # Flow control: a patch may ask the page to acknowledge it (its sequence number, which
        # the page echoes once it has applied it: see ACK_NAME and _sync_model). While one is
        # outstanding, new changes are held, and go out merged when the page catches up: a
        # slow page draws less often, with the newest data, instead of falling further and
        # further behind. A page that has kept up for CALM_S is asked once every ACK_EVERY_S
        # instead, and changes are held only once an acknowledgement is SLOW_ACK_S late.
        with self._flow:
            self._held += events
            self.updates += 1
            now = self._clock()
            quick = _cells.running or not self._answered
            timeout = ACK_TIMEOUT_S if quick else SILENT_TIMEOUT_S
            calm = self._calm_since is not None and now - self._calm_since >= CALM_S
            waiting = self._asked > self._acked
            if (
                self._ack_model is not None
                and waiting
                and (not calm or now - self._asked_at >= SLOW_ACK_S)
            ):
                if now - self._last_sent < timeout:
                    self.merged += 1
                    return
                self._calm_since, calm = None, False  # no answer in time: this one asks
            events, self._held = _merged(self._held), []
            self._sent += 1
            self._last_sent = now
            seq = self._sent
            ask = self._ack_model is not None and (
                not calm or (not waiting and now - self._asked_at >= ACK_EVERY_S)
            )
            if ask:
                self._asked, self._asked_at = seq, now
        doc = events[0].document
        if ask and self._ack_model is not None:
            events.append(ModelChangedEvent(doc, self._ack_model, "name", f"{ACK_NAME}:{seq}"))
        # jupyter_bokeh sends a patch as three comm messages (header, metadata, content) that
        # BokehJS reassembles in order. A view that starts listening between two of them (a
        # chart displayed, or a page reloaded, while a pump streams) reads every later patch
        # out of step and stops updating for good. Here each message is one JSON object that
        # is all three at once, sent three times: whichever copy lands in the content slot,
        # every patch is applied exactly once. (Arrays would go inline, not as buffers, so a
        # message stays one fragment; the charts stream lists, cheaper here than arrays.)
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
        # BokehJS sends back each change it applied (and each view's pans, zooms and range
        # updates). Applying that here would make the kernel's main thread a second writer of
        # the document and double every streamed row: views are display-only. The echo of a
        # patch's sequence number says the page applied it.
        if content.get("event") != "jsevent" or content.get("kind") != "ModelChanged":
            return
        new = content.get("new")
        if content.get("attr") == "name" and isinstance(new, str) and new.startswith(ACK_NAME):
            try:
                seq = int(new.rpartition(":")[2])
            except ValueError:
                return
            with self._flow:
                now = self._clock()
                # Until a page answers, every patch asks, and a page answers in order: a first
                # answer past the first patch sent after the state says the view was made
                # after that patch reached the page, which then had no view to apply it (the
                # view listens from its creation; on a loaded machine the page may take
                # seconds to make it). Such a view shows the state with some changes lost for
                # good: an axis sized once from a cap stays at its first range.
                missed = not self._answered and seq > self._state_at + 1
                if seq == self._asked:  # how long the page took: is it keeping up?
                    if now - self._asked_at > SLOW_ACK_S:
                        self._calm_since = None
                    elif self._calm_since is None:
                        self._calm_since = now
                self._acked = max(self._acked, min(seq, self._sent))
                self._answered = True
            if missed:
                self._send_whole_state()

    def _send_whole_state(self) -> None:
        """Send the page the document as it is now: its views draw it again from scratch.

        Under the writer's lock, so no patch goes out between the state read and its message
        (a patch sent before it would be applied to the view's old document, then lost).
        """
        with self._writing():
            self.send_state("render_bundle")

    def _writing(self) -> contextlib.AbstractContextManager[Any]:
        """The document's writer lock, if it has a writer."""
        lock = self._writer_lock
        return lock if lock is not None else contextlib.nullcontext()

    def __repr__(self) -> str:
        # The default repr holds random document ids: a saved notebook output would change.
        return f"ChartWidget({type(self._model).__name__})"

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        # BokehJS first, in a hidden widget of its own, as a dashboard shows it: a reloaded
        # page or a second tab gets it from the kernel, and the saved notebook holds none.
        # The chart one widget deeper, as in a dashboard's box: a reloaded page restores all
        # its widgets at once, and a chart's view made at the top level was made before its
        # carrier's script had run (no BokehJS yet: "Failed to create view").
        box = w.VBox([self])
        self._shown += [display_bokehjs(), box]
        bundle = box._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):
            bundle["text/plain"] = repr(self)
        return bundle

    def close(self) -> None:
        """Close the widget and those its displays showed with it (idempotent)."""
        if not self._closed:
            self._closed = True
            for shown in self._shown:  # BokehJS stays in the pages that ran it
                shown.close()
            self._shown.clear()
            super().close()


def in_a_widget(
    build: Callable[P, Any],
) -> Callable[[Callable[[], None]], Callable[P, ChartWidget]]:
    """Make the decorated stub ``ChartWidget(build(...))``, keeping its name and docstring.

    The ``plot_*`` function takes ``build``'s parameters: they are declared once, on the
    ``*_figure`` function (the static plots of both kinds, ``plots.py`` and
    ``generation/plots.py``).
    """

    def wrap(stub: Callable[[], None]) -> Callable[P, ChartWidget]:
        @functools.wraps(stub)
        def plot(*args: P.args, **kwargs: P.kwargs) -> ChartWidget:
            return ChartWidget(build(*args, **kwargs))

        # help() and IDEs show build's parameters, and that it returns the ChartWidget.
        signature = inspect.signature(build).replace(return_annotation=ChartWidget.__name__)
        setattr(plot, "__signature__", signature)  # noqa: B010 (mypy: functions have no such field)
        return plot

    return wrap
