"""The token controls: length buckets, the token budget and padding, for a ragged axis.

They act on the chosen method's source at its next batch (``configure()``, or ``PATCH
/config`` for a server by URL), as the batching controls do: a bad value is refused with its
reason beside the control, which goes back to what holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as w

import labserve

from .controls_base import control_layout, error_html
from .tokens import TokensRecent, token_numbers

__all__ = ["TokenControls", "format_buckets", "parse_buckets"]

_STYLE = {"description_width": "125px"}  # "max_batch_tokens" whole


def format_buckets(buckets: tuple[int, ...]) -> str:
    """``(16, 32, 64)`` as the text box shows it: ``"16, 32, 64"`` (``""``: none)."""
    return ", ".join(str(b) for b in buckets)


def parse_buckets(text: str) -> list[int]:
    """The text box's bucket bounds: integers separated by commas or spaces (``""``: none).

    Raises:
        ValueError: a part is not an integer (the config checks the rest: order, >= 1).
    """
    parts = text.replace(",", " ").split()
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ValueError(
            f"length_buckets must be integers separated by commas, got {text!r}"
        ) from None


class TokenControls:
    """``length_buckets``, ``max_batch_tokens`` and ``padding`` of ``method()``'s source.

    Thread-safety: :meth:`show_config` and :meth:`follow` may be called from any thread
    (the pump's tick calls :meth:`follow`); the widgets' callbacks run on the kernel's
    thread. Showing a config never configures.
    """

    def __init__(self, method: Callable[[], labserve.MethodSource]) -> None:
        self._method = method
        self._lock = threading.RLock()
        self._showing = threading.local()
        self.shown: labserve.BatchingConfig | None = None
        """The config the controls show."""
        c: dict[str, Any] = {}
        c["length_buckets"] = w.Text(description="length_buckets", placeholder="e.g. 16, 32, 64",
                                     layout=control_layout(), style=_STYLE,
                                     continuous_update=False)  # fmt: skip
        c["max_batch_tokens"] = w.Text(description="max_batch_tokens", placeholder="0: none",
                                       layout=control_layout(), style=_STYLE,
                                       continuous_update=False)  # fmt: skip
        c["padding"] = w.Checkbox(description="pad lengths to share a batch", indent=False)
        self.widgets = c
        self.errors = {k: w.HTML(layout=w.Layout(min_width="10px")) for k in c}
        for key in c:
            c[key].observe(lambda ch, key=key: self._on_change(key, ch["new"]), "value")
        self.readout = w.HTML(value=token_numbers(None, method().config))
        """Tokens per batch and padding now, beside the knobs that move them."""
        self.box = w.VBox(
            [w.HTML("<b>ragged axis</b>: padding, buckets, token budget")]
            + [w.HBox([c[k], self.errors[k]]) for k in c]
            + [self.readout]
        )
        self.show_config(method().config)

    def show_config(self, config: labserve.BatchingConfig) -> None:
        """Set every control to ``config`` without acting on it (thread-safe)."""
        c = self.widgets
        with self._lock:
            self._showing.on = True
            try:
                c["length_buckets"].value = format_buckets(config.length_buckets)
                c["max_batch_tokens"].value = str(config.max_batch_tokens)
                c["padding"].value = config.padding
                self.shown = config
            finally:
                self._showing.on = False

    def follow(self, config: labserve.BatchingConfig | None = None) -> None:
        """Show the method's config if it changed elsewhere (thread-safe; cheap when not)."""
        with self._lock:
            if config is None or config != self.shown:
                config = self._method().config
            if config != self.shown:
                self.show_config(config)

    def show_tokens(self, recent: TokensRecent | None, config: labserve.BatchingConfig) -> None:
        """Show the last second's tokens per batch and padding (thread-safe)."""
        text = f"<code>{token_numbers(recent, config)}</code>"
        if text != self.readout.value:
            self.readout.value = text

    def _on_change(self, key: str, value: Any) -> None:
        if getattr(self._showing, "on", False):
            return  # the widgets' echo of show_config
        try:
            if key == "length_buckets":
                value = parse_buckets(value)
            elif key == "max_batch_tokens":
                value = int(value) if value.strip() else 0
            with self._lock:
                config = self._method().configure(**{key: value})
        except ValueError as exc:
            message = str(exc)
            if key == "max_batch_tokens" and "invalid literal" in message:
                message = f"max_batch_tokens must be an integer, got {value!r}"
            self._refused(key, message)
            return
        except (labserve.LabServeError, TypeError) as exc:
            self._refused(key, str(exc))
            return
        self.errors[key].value = ""
        self.show_config(config)

    def _refused(self, key: str, message: str) -> None:
        self.errors[key].value = error_html(message)
        self.show_config(self._method().config)  # the controls show what is in force
