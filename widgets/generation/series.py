"""Chart rows from a generative method's live snapshots: plain numbers, no widgets, no Bokeh.

The generation dashboard's pump turns each :class:`labserve.GenerationSnapshot` into one row
with :class:`GenerationSeries`. What each column covers is said where it is defined: the
state now (running, waiting, KV blocks), the steps that ended since the last row (tokens
per step), the last second (preemptions), or the snapshot's sliding window (percentiles,
throughput, goodput). A value with nothing behind it is NaN, drawn as a gap: a row never
repeats an old step as a new one.
"""

from __future__ import annotations

import math
import time
from collections import deque

import numpy as np

import labserve

__all__ = ["GEN_COLUMNS", "GenerationSeries", "Rows"]

RATE_WINDOW_S = 1.0
"""The window of the preemption count: the last second, from the snapshots' counter."""

GEN_COLUMNS: tuple[str, ...] = (
    "t",
    "ttft_p50",
    "ttft_p99",
    "itl_p50",
    "itl_p99",
    "tpot_p99",
    "ttft_slo_ms",
    "tpot_slo_ms",
    "num_running",
    "num_waiting",
    "max_num_seqs",
    "preempted",
    "prefill_per_step",
    "decode_per_step",
    "max_num_batched_tokens",
    "steps",
    "kv_blocks_used",
    "num_kv_blocks",
    "requests_per_s",
    "goodput",
    "output_tokens_per_s",
    "prefix_hit_pct",
    "prefill_saved_per_s",
    "kv_blocks_cached",
    "clock_s",
)
"""One row per pump tick. Latencies in ms, rates per second.

``ttft_*``, ``itl_*``, ``tpot_p99`` (NaN while nothing was served in it), ``requests_per_s``,
``goodput`` (NaN without a target), ``output_tokens_per_s``: over the snapshot's window.
``num_running``, ``num_waiting``, ``kv_blocks_used``: now. ``prefill_per_step``,
``decode_per_step``: mean tokens of the steps that ended since the last row (NaN if none);
``steps``: how many (of those the snapshot still holds). ``preempted``: preemptions in the
last second. ``*_slo_ms``, ``max_num_*``: the settings in force (NaN: no target);
``num_kv_blocks``: the KV pool's blocks (for a model that stores K/V in labserve's blocks,
the blocks it holds, sized at start; else the setting; NaN: no limit). ``prefix_hit_pct``:
prompt tokens found in the prefix cache over those looked up, in percent, over the window
(NaN: no lookup there); ``prefill_saved_per_s``: those found (prefill not computed) per
second over the window; ``kv_blocks_cached``: blocks in the prefix cache now (NaN while
caching is off, so its line stops). ``clock_s``: the
wall-clock time of the row (Unix seconds), so that a
page can tell how old the newest row it drew is."""

Rows = dict[str, list[float]]


def _nan_if_zero(x: float) -> float:
    return float(x) if x else math.nan


class GenerationSeries:
    """Turns successive snapshots of one generative method into chart rows.

    Not thread-safe: one pump owns it. Times are seconds since the first snapshot seen.
    """

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._t0: float | None = None
        self._last_step_end = -math.inf
        self._preemptions: deque[tuple[float, int]] = deque()
        self._prev: labserve.GenerationSnapshot | None = None
        self.preempted_recent = math.nan
        """Preemptions over the last ``window_s`` (NaN before two snapshots)."""

    def _reset_seen(self, snap: labserve.GenerationSnapshot) -> bool:
        prev = self._prev
        if prev is None:
            return False
        served = sum(snap.outcomes.values()) < sum(prev.outcomes.values())
        return served or snap.num_preemptions < prev.num_preemptions

    def update(self, snap: labserve.GenerationSnapshot) -> Rows:
        """The row for this snapshot."""
        if self._t0 is None:
            self._t0 = snap.time_s
        if self._reset_seen(snap):  # the stats were reset: count from here
            self._preemptions.clear()
            self._last_step_end = -math.inf
        self._prev = snap
        steps = snap.steps
        new = steps.end_s > self._last_step_end
        if len(steps):
            self._last_step_end = max(self._last_step_end, float(steps.end_s[-1]))
        n_new = int(new.sum())
        prefill = float(steps.num_prefill_tokens[new].mean()) if n_new else math.nan
        decode = float(steps.num_decode_tokens[new].mean()) if n_new else math.nan

        history = self._preemptions
        history.append((snap.time_s, snap.num_preemptions))
        while len(history) > 2 and snap.time_s - history[1][0] >= self.window_s:
            history.popleft()
        then_s, then = history[0]
        self.preempted_recent = (
            float(snap.num_preemptions - then) if snap.time_s > then_s else math.nan
        )

        p = snap.percentiles_ms
        cfg = snap.config
        nan = math.nan

        def q(metric: str, which: str) -> float:
            return float(p.get(metric, {}).get(which, nan))

        values = {
            "t": snap.time_s - self._t0,
            "ttft_p50": q("ttft", "p50"),
            "ttft_p99": q("ttft", "p99"),
            "itl_p50": q("itl", "p50"),
            "itl_p99": q("itl", "p99"),
            "tpot_p99": q("tpot", "p99"),
            "ttft_slo_ms": _nan_if_zero(cfg.ttft_slo_ms),
            "tpot_slo_ms": _nan_if_zero(cfg.tpot_slo_ms),
            "num_running": snap.num_running,
            "num_waiting": snap.num_waiting,
            "max_num_seqs": cfg.max_num_seqs,
            "preempted": self.preempted_recent,
            "prefill_per_step": prefill,
            "decode_per_step": decode,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "steps": n_new,
            "kv_blocks_used": snap.kv_blocks_used,
            # The pool a model that stores K/V in labserve's blocks allocated, or the budget.
            "num_kv_blocks": _nan_if_zero(snap.kv_blocks_total or cfg.num_kv_blocks),
            "requests_per_s": snap.requests_per_s,
            # Without a target every served request is good: no goodput line then.
            "goodput": snap.goodput if (cfg.ttft_slo_ms or cfg.tpot_slo_ms) else nan,
            "output_tokens_per_s": snap.output_tokens_per_s,
            "prefix_hit_pct": 100.0 * snap.prefix_cache_hit_rate,
            "prefill_saved_per_s": snap.prefill_tokens_saved_per_s,
            "kv_blocks_cached": snap.kv_blocks_cached if cfg.enable_prefix_caching else nan,
            "clock_s": time.time(),
        }
        return {c: [float(np.float64(values[c]))] for c in GEN_COLUMNS}
