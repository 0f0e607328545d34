"""Chart rows from live snapshots or a finished run: plain numbers, no widgets, no Bokeh.

The dashboard's pump turns each new :class:`labserve.Snapshot` into rows with
:class:`LiveSeries`; :func:`result_rows` turns a :class:`labserve.RunResult` into the same
rows, so one set of charts shows both.
"""

from __future__ import annotations

import math
import time
from collections import deque

import numpy as np

import labserve

__all__ = ["BATCH_COLUMNS", "TICK_COLUMNS", "LiveSeries", "Rows", "fit_cost", "result_rows"]

REASONS: tuple[str, ...] = labserve.REASONS
TICK_COLUMNS: tuple[str, ...] = (
    "t",
    "queue_requests",
    "queue_items",
    "p50",
    "p95",
    "p99",
    "latency_bound",
    "served_rps",
    "rejected_rps",
    "failed_rps",
    "max_batch_size",
    *REASONS,
    "clock_s",
)
"""One row per pump tick (or per time bin of a finished run). Latencies in ms; rates per s.

``clock_s``: the wall-clock time the tick was taken (Unix seconds; NaN for a finished run), so
that a page can tell how old the newest row it drew is."""
BATCH_COLUMNS: tuple[str, ...] = ("t", "items", "rolling_mean", "duration_ms")
"""One row per fired batch."""
ROLLING = 20
"""Batches in the batch-size chart's rolling mean."""

Rows = dict[str, list[float]]


def _empty(columns: tuple[str, ...]) -> Rows:
    return {c: [] for c in columns}


def latency_bound_ms(
    max_latency_ms: float, max_batch_size: float, a_ms: float, b_ms: float
) -> float:
    """The wait cap plus the fitted time of a full batch: a served request's worst case."""
    a = a_ms if math.isfinite(a_ms) else 0.0
    b = b_ms if math.isfinite(b_ms) else 0.0
    return float(max_latency_ms) + a + b * float(max_batch_size)


class LiveSeries:
    """Turns successive snapshots of one runner method into new chart rows.

    Not thread-safe: one pump owns it. Times are seconds since the first snapshot seen.
    """

    def __init__(self) -> None:
        self._t0: float | None = None
        self._prev: labserve.Snapshot | None = None
        self._recent: deque[int] = deque(maxlen=ROLLING)

    def update(self, snap: labserve.Snapshot) -> tuple[Rows, Rows]:
        """Rows for this tick and for the batches fired since the last one."""
        if self._t0 is None:
            self._t0 = snap.time_s
        prev = self._prev
        if prev is not None and (snap.batches < prev.batches or snap.admitted < prev.admitted):
            prev = None  # the stats were reset: count from here
            self._recent.clear()
        self._prev = snap
        t = snap.time_s - self._t0
        tick = _empty(TICK_COLUMNS)
        lat = snap.latency_ms_window
        fit = snap.cost_fit
        values = {
            "t": t,
            "queue_requests": snap.queue_requests,
            "queue_items": snap.queue_items,
            "p50": lat.p50,  # NaN while nothing was served
            "p95": lat.p95,
            "p99": lat.p99,
            "latency_bound": latency_bound_ms(
                snap.config.max_latency_ms, snap.config.max_batch_size, fit.a_ms, fit.b_ms
            ),
            "served_rps": snap.served_rate,
            "rejected_rps": snap.rejected_rate,
            "failed_rps": snap.failed_rate,
            "max_batch_size": snap.config.max_batch_size,
            "clock_s": time.time(),
        }
        dt = snap.time_s - prev.time_s if prev is not None else 0.0
        for reason in REASONS:
            fired = snap.fire_reasons.get(reason, 0)
            before = prev.fire_reasons.get(reason, 0) if prev is not None else fired
            values[reason] = (fired - before) / dt if dt > 0 else 0.0
        for c in TICK_COLUMNS:
            tick[c].append(float(values[c]))
        batches = _empty(BATCH_COLUMNS)
        new = snap.batches - (prev.batches if prev is not None else 0)
        if prev is None:
            new = 0  # the first tick (or a reset) starts the chart; older batches are history
        for b in snap.recent_batches[-new:] if new > 0 else ():
            self._recent.append(b.items)
            batches["t"].append(b.start_s - self._t0)
            batches["items"].append(float(b.items))
            batches["rolling_mean"].append(sum(self._recent) / len(self._recent))
            batches["duration_ms"].append(b.duration_s * 1000.0)
        return tick, batches


def result_rows(result: labserve.RunResult, bin_s: float | None = None) -> tuple[Rows, Rows]:
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

    # Queue depth at each bin's end: arrived and not yet started (or rejected unstarted).
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

    tick = _empty(TICK_COLUMNS)
    tick["t"] = t.tolist()
    tick["queue_requests"] = (n_in - n_out).astype(float).tolist()
    tick["queue_items"] = (arr_cum[n_in] - left_cum[n_out]).tolist()
    latency_ms = (finish - result.arrival_s) * 1000.0
    which = np.clip(np.floor(np.nan_to_num(finish, nan=-1.0) / bin_s).astype(np.int64), -1, n_bins)
    for column in ("p50", "p95", "p99"):
        tick[column] = [math.nan] * n_bins
    for outcome, column in ((0, "served_rps"), (1, "rejected_rps"), (2, "failed_rps")):
        mask = (result.outcome == outcome) & (which >= 0) & (which < n_bins)
        tick[column] = (np.bincount(which[mask], minlength=n_bins)[:n_bins] / bin_s).tolist()
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
    tick["latency_bound"] = [bound] * n_bins
    tick["max_batch_size"] = [cap] * n_bins
    tick["clock_s"] = [math.nan] * n_bins
    fired_bin = np.clip(np.floor(result.batch_start_s / bin_s).astype(np.int64), 0, n_bins - 1)
    for code, reason in enumerate(REASONS):
        mask = result.batch_reason == code
        tick[reason] = (np.bincount(fired_bin[mask], minlength=n_bins) / bin_s).tolist()

    batches = _empty(BATCH_COLUMNS)
    b_items = result.batch_items.astype(float)
    batches["t"] = result.batch_start_s.astype(float).tolist()
    batches["items"] = b_items.tolist()
    csum = np.concatenate([[0.0], np.cumsum(b_items)])
    idx = np.arange(len(b_items))
    lo = np.maximum(idx + 1 - ROLLING, 0)
    batches["rolling_mean"] = ((csum[idx + 1] - csum[lo]) / (idx + 1 - lo)).tolist()
    batches["duration_ms"] = (result.batch_duration_s * 1000.0).tolist()
    return tick, batches


def fit_cost(items: np.ndarray, duration_s: np.ndarray) -> tuple[float, float]:
    """Least-squares batch_ms = a + b * items over a run's batches (NaN when underdetermined)."""
    if len(items) < 2 or np.ptp(items) == 0:
        if len(items):
            return float(np.median(duration_s) * 1000.0), 0.0
        return math.nan, math.nan
    b, a = np.polyfit(items.astype(float), duration_s * 1000.0, 1)
    return float(a), float(b)
