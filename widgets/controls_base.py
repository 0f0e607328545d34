"""What both dashboards' settings forms share: the chosen method, the live config, refusals.

:class:`ControlsBase` owns the method dropdown, the reset button, the rule that showing a
config never configures, following a change made elsewhere, and a refusal shown next to the
control that asked (the control goes back to what holds). A form
(:class:`~labserve.widgets.controls.BatchingControls`,
:class:`~labserve.widgets.generation.controls.GenerationControls`) adds its knobs: how they
are laid out, set from a config, and read from a typed box.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import ipywidgets as w

import labserve

__all__ = ["ERROR_WIDTH", "ControlsBase", "Tunable", "control_layout", "error_html"]

ERROR_WIDTH = "240px"
"""The widest a refusal next to a control grows before it wraps."""

C = TypeVar("C")
"""The config a form shows: ``labserve.BatchingConfig`` or ``labserve.GenerationConfig``."""
C_co = TypeVar("C_co", covariant=True)


class Tunable(Protocol[C_co]):
    """What a form needs of a method's source (``MethodSource``, ``GenerationSource``)."""

    name: str
    resettable: bool

    @property
    def config(self) -> C_co:
        """The config asked for."""
        ...

    def configure(self, **changes: Any) -> C_co:
        """Change settings; a refusal changes nothing."""
        ...

    def reset_stats(self) -> None:
        """Start the figures over (only when ``resettable``)."""
        ...


S = TypeVar("S", bound=Tunable[Any])


def error_html(message: str) -> str:
    """A refusal shown next to a control."""
    return f"<span style='color:#c00'>{html.escape(message)}</span>"


def control_layout() -> w.Layout:
    """One per control: hiding one control must not hide the others."""
    return w.Layout(width="330px")


class ControlsBase(Generic[S, C]):
    """Controls over the config of one of ``methods`` (a name -> its source).

    ``on_method()`` runs after another method is chosen, ``on_reset()`` after its figures
    were reset (or, for a source that cannot reset, after the button asked the charts to
    start over). Thread-safety: :meth:`show_config` and :meth:`follow` may be called from
    any thread (the pump calls :meth:`follow`); the widgets' callbacks run on the kernel's
    thread. Showing a config never configures.

    A subclass builds its knobs, a ``"reset"`` button, :attr:`errors` and :attr:`box` in
    :meth:`_build` (after the ``"method"`` dropdown); it defines :meth:`_show` and
    :meth:`_on_setting`, and says in :attr:`_INTS` which typed boxes hold integers.
    """

    _STYLE: ClassVar[dict[str, str]]
    """The labels' width: the longest setting's name whole."""

    _COUNTS: ClassVar[str] = "counts"
    """What the reset button's tooltip calls the figures a remote server keeps."""
    _INTS: ClassVar[frozenset[str]] = frozenset()
    """Settings typed as integers; the rest are read as floats."""
    _FLOAT_KIND: ClassVar[str] = "a number"
    """How a refusal names what a float box wants."""

    def __init__(
        self,
        methods: dict[str, S],
        first: str,
        *,
        on_method: Callable[[], None] = lambda: None,
        on_reset: Callable[[], None] = lambda: None,
    ) -> None:
        self.methods = methods
        self._on_method_chosen = on_method
        self._on_reset_done = on_reset
        self._lock = threading.RLock()
        self._showing = threading.local()  # True on the thread that is setting the widgets
        self.shown: C | None = None
        """The config the controls show."""
        self.widgets: dict[str, Any] = {}
        self.widgets["method"] = w.Dropdown(options=list(methods), value=first,
                                            description="method", layout=control_layout(),
                                            style=self._STYLE)  # fmt: skip
        self.errors: dict[str, w.HTML] = {}
        """Where each setting's refusal shows (``"config"``: the dropdowns' and reset's)."""
        self.box = self._build()
        self._reset_label()
        self.widgets["method"].observe(lambda _: self._on_method(), names="value")
        self.widgets["reset"].on_click(lambda _: self._on_reset())
        self.show_config(self.method.config)

    @property
    def method(self) -> S:
        """The source of the method chosen."""
        return self.methods[self.widgets["method"].value]

    def _reset_label(self) -> None:
        button = self.widgets["reset"]
        if self.method.resettable:
            button.description, button.tooltip = "reset statistics", ""
        else:  # a remote server's figures are its own: the charts start over
            button.description = "clear charts"
            button.tooltip = f"this server's {self._COUNTS} cannot be reset from here"

    def _build(self) -> w.VBox:
        """Make the knobs, the reset button and the error lines; the form's box."""
        raise NotImplementedError

    def _show(self, config: C) -> None:
        """Set every knob to ``config`` (called with the echo turned off)."""
        raise NotImplementedError

    def _on_setting(self, key: str, value: Any) -> None:
        """A knob moved (its echo included: check :meth:`_acting`)."""
        raise NotImplementedError

    def show_config(self, config: C) -> None:
        """Set every control to ``config`` without acting on it (thread-safe)."""
        with self._lock:
            self._showing.on = True
            try:
                self._show(config)
                self.shown = config
            finally:
                self._showing.on = False

    def follow(self, config: C | None = None) -> None:
        """Show the method's config if it changed elsewhere (thread-safe; cheap when not).

        ``config``: the one asked for, as the pump's last view saw it (the source is asked
        again only when it differs from what is shown). The config asked, not a
        snapshot's: a change applies at the next batch or step (an idle method has none),
        but the controls show what was asked at once.
        """
        with self._lock:
            if config is None or config != self.shown:
                config = self.method.config  # asked again: the view may predate a change
            if config != self.shown:
                self.show_config(config)

    def _acting(self) -> bool:
        """False while this thread is only showing a config (the widgets' echo)."""
        return not getattr(self._showing, "on", False)

    def _configure(self, error_key: str, **changes: Any) -> None:
        with self._lock:
            try:
                config = self.method.configure(**changes)
            except (labserve.LabServeError, ValueError, TypeError) as exc:
                self.errors[error_key].value = error_html(str(exc))
                self.show_config(self.method.config)  # the controls show what is in force
                return
            self.errors[error_key].value = ""
            self.show_config(config)

    def _on_text(self, key: str, text: str) -> None:
        if not self._acting():
            return
        whole = key in self._INTS
        try:
            value: Any = int(text) if whole else float(text)
        except ValueError:
            kind = "an integer" if whole else self._FLOAT_KIND
            self.errors[key].value = error_html(f"{key} must be {kind}, got {text!r}")
            self.show_config(self.method.config)
            return
        self._configure(key, **{key: value})

    def _on_method(self) -> None:
        self._reset_label()
        self.show_config(self.method.config)
        self._on_method_chosen()

    def _on_reset(self) -> None:
        if self.method.resettable:
            try:
                self.method.reset_stats()
            except Exception as exc:  # shown next to the button (a remote that failed)
                self.errors["config"].value = error_html(f"reset failed: {exc}")
                return
        self.errors["config"].value = ""
        self._on_reset_done()
