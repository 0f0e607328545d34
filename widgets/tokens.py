"""Tokens per batch and the padding fraction, live: for a method with a ragged axis.

A padded method's batch costs its padded tokens (items x the batch's width), and padding is
the share of them that carried no caller's token. :class:`TokenSeries` turns successive
snapshots into chart columns over the last second (as the throughput chart's rates), from the
batches each snapshot newly records; a model slower than that (a batch of long texts on a CPU
can take seconds) shows its last batch's figures, for as long as ``hold_s``.
:func:`token_figure` draws them, tokens per batch on the left axis and the padding fraction on
the right; :func:`token_numbers` says them in a line. Plain numbers here, no widgets.
"""

from __future__ import annotations

import html
import math
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from bokeh.models import ColumnDataSource, LinearAxis, Range1d

import labserve

from .series import RATE_WINDOW_S, Rows

__all__ = ["TOKEN_COLUMNS", "TokenSeries", "TokensRecent", "has_ragged_axis", "token_figure",
           "token_numbers"]  # fmt: skip

TOKEN_COLUMNS: tuple[str, ...] = ("tokens_per_batch", "padding_pct")
"""Chart columns beside the dashboard's ticks: mean padded tokens per batch and padding
tokens / padded tokens (%), of the batches fired over the last second (or the last batch's,
when none fired in it but one did recently; NaN if none)."""


class TokensRecent(NamedTuple):
    """The batches fired over the last ``span_s`` seconds, in tokens."""

    span_s: float
    batches: int
    tokens: int
    """Padded tokens computed (items x each batch's width)."""
    padding_tokens: int
    """Of those, padding."""
    age_s: float = 0.0
    """0 when batches fired in the span; else the figures are the last batch's, fired this
    many seconds ago."""

    @property
    def tokens_per_batch(self) -> float:
        """Mean padded tokens per batch (NaN without batches)."""
        return self.tokens / self.batches if self.batches else math.nan

    @property
    def padding_pct(self) -> float:
        """Padding tokens / padded tokens, in % (NaN without tokens)."""
        return 100.0 * self.padding_tokens / self.tokens if self.tokens else math.nan


class TokenSeries:
    """Turns successive snapshots of one method into :data:`TOKEN_COLUMNS` rows.

    Counts the batches each snapshot adds to ``recent_batches`` (a batch older than the
    snapshot keeps is missed, as the batch-size chart misses it). Not thread-safe: one pump
    owns it.
    """

    def __init__(self, window_s: float = RATE_WINDOW_S, hold_s: float = 10.0) -> None:
        self.window_s = window_s
        self.hold_s = hold_s
        self.recent: TokensRecent | None = None
        """The last ``window_s`` seconds' batches (None before the first snapshot)."""
        self._prev_batches: int | None = None
        self._fired: deque[tuple[float, int, int]] = deque()  # (time_s, tokens, padding)
        self._last: tuple[float, int, int] | None = None

    def update(self, snap: labserve.Snapshot) -> Rows:
        """This tick's row (one value per column)."""
        prev = self._prev_batches
        if prev is None or snap.batches < prev:  # the first look, or the stats were reset
            self._fired.clear()
            self._last = None
            prev = snap.batches
        new = snap.batches - prev
        self._prev_batches = snap.batches
        for batch in snap.recent_batches[-new:] if new > 0 else ():
            self._last = (snap.time_s, batch.tokens, batch.padding_tokens)
            self._fired.append(self._last)
        while self._fired and snap.time_s - self._fired[0][0] >= self.window_s:
            self._fired.popleft()
        fired = list(self._fired)
        age = 0.0
        if not fired and self._last is not None and snap.time_s - self._last[0] < self.hold_s:
            fired, age = [self._last], snap.time_s - self._last[0]
        self.recent = TokensRecent(
            self.window_s,
            len(fired),
            sum(f[1] for f in fired),
            sum(f[2] for f in fired),
            age,
        )
        return {
            "tokens_per_batch": [self.recent.tokens_per_batch],
            "padding_pct": [self.recent.padding_pct],
        }


def has_ragged_axis(source: labserve.MethodSource) -> bool:
    """True for a method in this process declared with ``pad=`` (a URL's method: unknown)."""
    method = getattr(source, "runner_method", None)
    spec = getattr(method, "spec", None)
    return getattr(spec, "padding", None) is not None


def token_figure(timeline: Callable[..., Any], ticks: ColumnDataSource, colors: Any) -> Any:
    """The chart: padded tokens per batch (left axis) and the padding fraction (right, %).

    ``timeline(title, y_label, columns)`` makes a time figure on the dashboard's shared
    axes (its y axis follows ``columns``); ``ticks`` is the source holding the columns.
    """
    fig = timeline(
        f"Tokens per batch and padding (last {RATE_WINDOW_S:g} s)",
        "padded tokens per batch",
        ["tokens_per_batch"],
    )
    fig.line("t", "tokens_per_batch", source=ticks, color=colors[0], line_width=2,
             legend_label="padded tokens per batch")  # fmt: skip
    fig.extra_y_ranges = {"pct": Range1d(start=0, end=100)}
    fig.add_layout(LinearAxis(y_range_name="pct", axis_label="padding (%)"), "right")
    fig.line("t", "padding_pct", source=ticks, color=colors[3], line_width=2, line_dash="dashed",
             y_range_name="pct", legend_label="padding, % of padded tokens")  # fmt: skip
    return fig


def _fmt(x: float, spec: str, unit: str = "") -> str:
    return f"{x:{spec}}{unit}" if math.isfinite(x) else "-"


def token_numbers(recent: TokensRecent | None, config: labserve.BatchingConfig) -> str:
    """The dashboard's line of numbers, its tokens part (HTML): what padding costs now."""
    nan = math.nan
    per_batch = recent.tokens_per_batch if recent else nan
    padding = recent.padding_pct if recent else nan
    budget = f" of {config.max_batch_tokens:,}" if config.max_batch_tokens else ""
    if recent is not None and recent.age_s > 0:
        window = f"last batch, {recent.age_s:.1f} s ago"
    else:
        window = f"last {recent.span_s if recent else RATE_WINDOW_S:g} s"
    return (
        f"tokens/batch <b>{_fmt(per_batch, ',.0f')}</b>{html.escape(budget)} · padding "
        f"<b>{_fmt(padding, '.1f', '%')}</b> <i>({window})</i>"
    )
