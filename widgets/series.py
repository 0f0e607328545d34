"""Chart rows from live snapshots or a finished run: plain numbers, no widgets, no Bokeh.

The dashboard's pump turns each new :class:`labserve.Snapshot` into rows with
:class:`LiveSeries`; :func:`result_rows` turns a :class:`labserve.RunResult` into the same
rows, so one set of charts shows both.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import NamedTuple

import numpy as np

import labserve

__all__ = [
    "RATE_WINDOW_S",
    "TICK_COLUMNS",
    "Counters",
    "LiveSeries",
    "Recent",
    "Rows",
    "fit_cost",
    "result_rows",
]

REASONS: tuple[str, ...] = labserve.REASONS
RATE_WINDOW_S = 1.0
"""The window of what moves (served rates and those of each kind of request not served, why
batches fired, mean batch, model busy): a second, derived here from the snapshots' counters.
Latency percentiles use the recorder's own window (``Snapshot.window_s``, 10 s by default),
which /stats and /metrics share."""
TICK_COLUMNS: tuple[str, ...] = (
    "t",
    "queue_requests",
    "queue_items",
    "batch_min",
    "batch_mean",
    "batch_max",
    "p50",
    "p95",
    "p99",
    "latency_bound",
    "served_rps",
    "refused_rps",
    "rejected_rps",
    "timeout_rps",
    "failed_rps",
    "max_batch_size",
    "max_latency_ms",
    "latency_slo_ms",
    *REASONS,
    "clock_s",
)
"""One row per pump tick (or per time bin of a finished run). Latencies in ms; rates per s.

``batch_*``: items per batch of the batches fired since the last row (NaN if none).
``refused_rps`` (never admitted: queue full or runner stopping), ``rejected_rps`` (admitted,
then refused for overload), ``timeout_rps`` and ``failed_rps``: requests that got no result,
by kind, the kinds of :data:`labserve.OUTCOMES` that /metrics counts.
``clock_s``: the wall-clock time the tick was taken (Unix seconds; NaN for a finished run), so
that a page can tell how old the newest row it drew is."""

Rows = dict[str, list[float]]

_RATE_OUTCOMES = (
    ("served", "served_rps"),
    ("refused", "refused_rps"),
    ("rejected", "rejected_rps"),
    ("timeout", "timeout_rps"),
    ("failed", "failed_rps"),
)


def _empty(columns: tuple[str, ...]) -> Rows:
    return {c: [] for c in columns}


def latency_bound_ms(
    max_latency_ms: float, max_batch_size: float, a_ms: float, b_ms: float
) -> float:
    """The wait cap plus the fitted time of a full batch: a served request's worst case."""
    a = a_ms if math.isfinite(a_ms) else 0.0
    b = b_ms if math.isfinite(b_ms) else 0.0
    return float(max_latency_ms) + a + b * float(max_batch_size)


class Counters(NamedTuple):
    """A snapshot's running totals, what short-window rates are derived from."""

    time_s: float
    served: int
    rejected: int
    failed: int
    refused: int
    timeout: int
    cancelled: int
    batches: int
    seen: int
    """Of the batches, those still in the snapshots' recent records when pulled."""
    items: int
    """Items in the batches seen."""
    busy_s: float
    """Model time of the batches seen, seconds."""
    reasons: tuple[int, ...]


class Recent(NamedTuple):
    """What moved over the last ``span_s`` seconds (NaN where nothing happened)."""

    span_s: float
    served_rps: float
    rejected_rps: float
    failed_rps: float
    reasons_per_s: tuple[float, ...]
    mean_batch: float
    rejected_pct: float
    """Rejected and refused requests, % of those that ended: ``RunResult.summary()``'s
    ``rejected_pct``."""
    busy_pct: float
    """Share of the span the model was running a batch (from the batches' durations)."""
    refused_rps: float = math.nan
    timeout_rps: float = math.nan
    refused_pct: float = math.nan
    """Of ``rejected_pct``, those never admitted (queue full): the rest met their deadline."""
    failed_pct: float = math.nan
    timeout_pct: float = math.nan


class LiveSeries:
    """Turns successive snapshots of one runner method into new chart rows.

    Not thread-safe: one pump owns it. Times are seconds since the first snapshot seen.
    """

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self.recent: Recent | None = None
        """What moved over the last ``window_s`` (None before two snapshots)."""
        self._t0: float | None = None
        self._prev: labserve.Snapshot | None = None
        self._history: deque[Counters] = deque()
        self._busy_s = 0.0
        self._items = 0
        self._seen = 0

    def update(self, snap: labserve.Snapshot) -> Rows:
        """The row for this tick."""
        if self._t0 is None:
            self._t0 = snap.time_s
        prev = self._prev
        if prev is not None and (snap.batches < prev.batches or snap.admitted < prev.admitted):
            prev = None  # the stats were reset: count from here
            self._history.clear()
        self._prev = snap
        new = snap.batches - prev.batches if prev is not None else 0
        fired = snap.recent_batches[-new:] if new > 0 else ()
        sizes = [b.items for b in fired]
        self._items += sum(sizes)
        self._seen += len(sizes)
        self._busy_s += sum(b.duration_s for b in fired)
        now = Counters(
            snap.time_s, snap.served, snap.rejected, snap.failed, snap.refused, snap.timeout,
            snap.cancelled, snap.batches, self._seen,
            self._items, self._busy_s, tuple(snap.fire_reasons.get(r, 0) for r in REASONS),
        )  # fmt: skip
        self._history.append(now)
        while len(self._history) > 2 and now.time_s - self._history[1].time_s >= self.window_s:
            self._history.popleft()
        self.recent = _recent(self._history[0], now)
        lat = snap.latency_ms_window
        fit = snap.cost_fit
        recent = self.recent
        nan = math.nan
        values = {
            "t": snap.time_s - self._t0,
            "queue_requests": snap.queue_requests,
            "queue_items": snap.queue_items,
            "batch_min": min(sizes) if sizes else nan,
            "batch_mean": sum(sizes) / len(sizes) if sizes else nan,
            "batch_max": max(sizes) if sizes else nan,
            "p50": lat.p50,  # NaN while nothing was served
            "p95": lat.p95,
            "p99": lat.p99,
            "latency_bound": latency_bound_ms(
                snap.config.max_latency_ms, snap.config.max_batch_size, fit.a_ms, fit.b_ms
            ),
            "served_rps": recent.served_rps if recent else nan,
            "refused_rps": recent.refused_rps if recent else nan,
            "rejected_rps": recent.rejected_rps if recent else nan,
            "timeout_rps": recent.timeout_rps if recent else nan,
            "failed_rps": recent.failed_rps if recent else nan,
            "max_batch_size": snap.config.max_batch_size,
            "max_latency_ms": snap.config.max_latency_ms,
            "latency_slo_ms": snap.config.latency_slo_ms or nan,  # no target: no line
            "clock_s": time.time(),
        }
        for k, reason in enumerate(REASONS):
            values[reason] = recent.reasons_per_s[k] if recent else nan
        return {c: [float(values[c])] for c in TICK_COLUMNS}


def _recent(then: Counters, now: Counters) -> Recent | None:
    span = now.time_s - then.time_s
    if span <= 0:
        return None
    served = now.served - then.served
    rejected = now.rejected - then.rejected
    failed = now.failed - then.failed
    refused = now.refused - then.refused
    timeout = now.timeout - then.timeout
    batches = now.batches - then.batches
    seen = now.seen - then.seen  # fewer than batches when more fired than a snapshot keeps
    # Every request that ended, whatever its kind: RunResult.summary()'s denominator.
    ended = served + rejected + failed + refused + timeout + now.cancelled - then.cancelled

    def pct(count: int) -> float:
        return 100.0 * count / ended if ended else math.nan

    return Recent(
        span_s=span,
        served_rps=served / span,
        rejected_rps=rejected / span,
        failed_rps=failed / span,
        reasons_per_s=tuple((b - a) / span for a, b in zip(then.reasons, now.reasons, strict=True)),
        mean_batch=(now.items - then.items) / seen if seen else math.nan,
        rejected_pct=pct(rejected + refused),
        busy_pct=min(100.0 * (now.busy_s - then.busy_s) * batches / seen / span, 100.0)
        if seen
        else 0.0,
        refused_rps=refused / span,
        timeout_rps=timeout / span,
        refused_pct=pct(refused),
        failed_pct=pct(failed),
        timeout_pct=pct(timeout),
    )


def result_rows(result: labserve.RunResult, bin_s: float | None = None) -> Rows:
    """The rows :class:`LiveSeries` would have produced, from a finished run.

    Time is cut into bins of ``bin_s`` seconds (default: about 200 bins over the run);
    each bin's latency percentiles cover the requests that finished in it.
    """
    span = float(result.duration_s)
    if bin_s is None:
        bin_s = max(span / 200.0, 1e-3)
    if not (math.isfinite(bin_s) and bin_s > 0):
        raise ValueError(f"bin_s must be a finite number > 0, got {bin_s!r}")
    finish = result.finish_s
    end = max(span, float(np.nanmax(finish)) if np.isfinite(finish).any() else 0.0)
    n_bins = max(math.ceil(end / bin_s), 1)
    edges = np.arange(n_bins + 1) * bin_s
    t = edges[1:]
    config = dict(result.config)
    cap = float(config.get("max_batch_size", np.nan))
    a_ms, b_ms = fit_cost(result.batch_items, result.batch_duration_s)
    bound = (
        latency_bound_ms(config["max_latency_ms"], cap, a_ms, b_ms)
        if "max_latency_ms" in config
        else math.nan
    )

    tick = _empty(TICK_COLUMNS)
    tick["t"] = t.tolist()
    _queue_depth(tick, result, t)
    _latency_percentiles(tick, result, bin_s, n_bins)
    _outcome_rates(tick, result, bin_s, n_bins)
    tick["latency_bound"] = [bound] * n_bins
    tick["max_batch_size"] = [cap] * n_bins
    tick["max_latency_ms"] = [float(config.get("max_latency_ms", math.nan))] * n_bins
    tick["latency_slo_ms"] = [float(config.get("latency_slo_ms", 0.0)) or math.nan] * n_bins
    tick["clock_s"] = [math.nan] * n_bins
    _batch_columns(tick, result, bin_s, n_bins)
    return tick


def _queue_depth(tick: Rows, result: labserve.RunResult, t: np.ndarray) -> None:
    """Queue depth at each bin's end: arrived and not yet started (or rejected unstarted)."""
    finish = result.finish_s
    items = result.items.astype(float)
    arr_order = np.argsort(result.arrival_s, kind="stable")
    arr_sorted = result.arrival_s[arr_order]
    arr_cum = np.concatenate([[0.0], np.cumsum(items[arr_order])])
    left = np.where(np.isfinite(result.start_s), result.start_s, finish)
    left = np.where(np.isfinite(left), left, np.inf)
    left_order = np.argsort(left, kind="stable")
    left_cum = np.concatenate([[0.0], np.cumsum(items[left_order])])
    n_in = np.searchsorted(arr_sorted, t, side="right")
    n_out = np.searchsorted(left[left_order], t, side="right")
    tick["queue_requests"] = (n_in - n_out).astype(float).tolist()
    tick["queue_items"] = (arr_cum[n_in] - left_cum[n_out]).tolist()


def _latency_percentiles(tick: Rows, result: labserve.RunResult, bin_s: float, n_bins: int) -> None:
    """Each bin's p50/p95/p99 over the served requests that finished in it."""
    finish = result.finish_s
    latency_ms = (finish - result.arrival_s) * 1000.0
    which = np.clip(np.floor(np.nan_to_num(finish, nan=-1.0) / bin_s).astype(np.int64), -1, n_bins)
    for column in ("p50", "p95", "p99"):
        tick[column] = [math.nan] * n_bins
    served = (result.outcome == 0) & (which >= 0) & (which < n_bins)
    order = np.argsort(which[served], kind="stable")
    bins_sorted = which[served][order]
    lat_sorted = latency_ms[served][order]
    bounds = np.searchsorted(bins_sorted, np.arange(n_bins + 1))
    for k in range(n_bins):
        chunk = lat_sorted[bounds[k] : bounds[k + 1]]
        if len(chunk):
            p50, p95, p99 = np.percentile(chunk, [50, 95, 99])
            tick["p50"][k], tick["p95"][k], tick["p99"][k] = float(p50), float(p95), float(p99)


def _outcome_rates(tick: Rows, result: labserve.RunResult, bin_s: float, n_bins: int) -> None:
    """Each outcome's rate per bin, counted when the request ended.

    A request that got no result may have no finish time (refused at admission): it is
    counted when it arrived.
    """
    finish = result.finish_s
    ended = np.where(np.isfinite(finish), finish, result.arrival_s)
    ended_bin = np.clip(np.floor(ended / bin_s).astype(np.int64), 0, n_bins - 1)
    for outcome, column in _RATE_OUTCOMES:
        mask = result.outcome == labserve.OUTCOMES.index(outcome)
        tick[column] = (np.bincount(ended_bin[mask], minlength=n_bins)[:n_bins] / bin_s).tolist()


def _batch_columns(tick: Rows, result: labserve.RunResult, bin_s: float, n_bins: int) -> None:
    """Fire reasons' rates and the batch sizes (mean, min, max) of the batches fired per bin."""
    fired_bin = np.clip(np.floor(result.batch_start_s / bin_s).astype(np.int64), 0, n_bins - 1)
    for code, reason in enumerate(REASONS):
        mask = result.batch_reason == code
        tick[reason] = (np.bincount(fired_bin[mask], minlength=n_bins) / bin_s).tolist()
    b_items = result.batch_items.astype(float)
    count = np.bincount(fired_bin, minlength=n_bins)[:n_bins]
    total = np.bincount(fired_bin, weights=b_items, minlength=n_bins)[:n_bins]
    low = np.full(n_bins, np.inf)
    high = np.full(n_bins, -np.inf)
    np.minimum.at(low, fired_bin, b_items)
    np.maximum.at(high, fired_bin, b_items)
    none = count == 0
    with np.errstate(invalid="ignore", divide="ignore"):
        tick["batch_mean"] = np.where(none, np.nan, total / count).tolist()
    tick["batch_min"] = np.where(none, np.nan, low).tolist()
    tick["batch_max"] = np.where(none, np.nan, high).tolist()


def fit_cost(items: np.ndarray, duration_s: np.ndarray) -> tuple[float, float]:
    """A robust fit of batch_ms = a + b * items: least squares on each size's median time.

    A stalled batch moves its size's median little, not the line. NaN, NaN when the line is
    not identifiable: fewer than two distinct batch sizes.
    """
    items = np.asarray(items, dtype=float)
    ms = np.asarray(duration_s, dtype=float) * 1000.0
    keep = np.isfinite(items) & np.isfinite(ms)
    items, ms = items[keep], ms[keep]
    sizes, which, counts = np.unique(items, return_inverse=True, return_counts=True)
    if len(sizes) < 2:
        return math.nan, math.nan
    order = np.argsort(which, kind="stable")
    groups = np.split(ms[order], np.cumsum(counts)[:-1])
    medians = np.array([float(np.median(g)) for g in groups])
    b, a = np.polyfit(sizes, medians, 1, w=np.sqrt(counts))
    return float(a), float(b)
