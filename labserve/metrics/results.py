"""RunResult: one result type for real and simulated runs, per request and per batch."""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labserve.base.vocabulary import (
    FAILED,
    OUTCOMES,
    REASONS,
    REFUSED,
    REJECTED,
    SERVED,
    TIMEOUT,
)

# Outcomes the summary's shares already count; any other kind seen adds an "outcomes" row.
_SHARED = frozenset({SERVED, REJECTED, REFUSED, FAILED, TIMEOUT})

__all__ = ["RunResult"]
_QS = (50.0, 95.0, 99.0, 99.9)
_TOP_ERRORS = 3  # the most common error messages the summary shows


@dataclass(frozen=True)
class RunResult:
    """What happened to every request and every batch of a run, real or simulated.

    Times are seconds from the start of the run. A request never started has NaN start
    and finish; ``outcome`` holds indexes into :data:`OUTCOMES`, ``reason`` into the
    batch fire reasons (full, timeout, adaptive, idle, drain).
    """

    arrival_s: np.ndarray
    start_s: np.ndarray
    finish_s: np.ndarray
    outcome: np.ndarray
    items: np.ndarray
    batch_start_s: np.ndarray
    batch_duration_s: np.ndarray
    batch_items: np.ndarray
    batch_requests: np.ndarray
    batch_reason: np.ndarray
    duration_s: float
    """The span the offered load covered (for rates)."""
    label: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    send_lag_s: np.ndarray | None = None
    """Real open-loop runs: how late each request was sent after its intended time."""
    sent_until_s: float = 0.0
    """Real open-loop runs: when the last request went out. A generator that fell behind
    sends past ``duration_s``; served rates are over the longer of the two."""
    server: dict[str, Any] | None = None
    """HTTP runs against a labserve server: the server's own view of the run, from its
    ``/stats`` before and after (counts, batches, mean/max batch, fire reasons, latency and
    queue-wait percentiles and means; see :func:`labserve.load.server_view.server_view`)."""
    batch_tokens: np.ndarray | None = None
    """Per batch: padded tokens computed (items x width; 0: the method has no ragged axis)."""
    batch_padding_tokens: np.ndarray | None = None
    """Per batch: padding tokens among them."""
    errors: dict[str, int] | None = None
    """Load runs: why requests got no result, each message with its count, most common first."""

    @property
    def served(self) -> np.ndarray:
        """Mask of the requests answered with a result."""
        return np.asarray(self.outcome == SERVED)

    @property
    def latency_s(self) -> np.ndarray:
        """Arrival to result, served requests."""
        return np.asarray((self.finish_s - self.arrival_s)[self.served])

    @property
    def queue_wait_s(self) -> np.ndarray:
        """Arrival to the start of the request's (first) batch, served requests."""
        return np.asarray((self.start_s - self.arrival_s)[self.served])

    def summary(self) -> dict[str, Any]:
        """Rates, outcome shares, latency and queue-wait percentiles, batch sizes, reasons.

        ``rejected_pct`` counts rejected and refused requests, ``failed_pct`` failed ones,
        ``timeout_pct`` those past their request timeout.
        ``model_ms_per_request`` and ``model_busy_pct`` say what the run cost in model time
        (busy: model time / (duration x ``max_concurrent_batches``)); with a latency target,
        ``slo_met_pct`` is the share of served requests within it.
        ``outcomes`` (requests by kind) appears when some request ended in a kind the
        shares do not count (connect_error, reset, client_error, cancelled); ``errors``
        (a load run's three most common error messages, with counts) when any had one.
        With a ragged axis, ``tokens_per_batch`` (padded) and ``padding_pct`` (padding
        tokens over padded tokens) say what padding cost.
        ``served_rps`` and ``goodput_items_ps`` are over ``duration_s``, or over the time
        the sends took when an open-loop generator fell behind (``sent_until_s``).
        Over HTTP against a labserve server, the batch figures and queue waits are the
        server's (``server_*`` keys add its served count and latency).
        """
        n = len(self.arrival_s)
        span = self.duration_s if self.duration_s > 0 else math.nan
        # Served over the time the sends took: a generator that fell behind schedule offered
        # the load over longer than planned, and what came back came back over that time.
        served_span = max(span, self.sent_until_s)
        served = int(self.served.sum())
        counts = np.bincount(self.outcome.astype(np.int64), minlength=len(OUTCOMES))
        out: dict[str, Any] = {
            "requests": n,
            "offered_rps": n / span,
            "served_rps": served / served_span,
            "goodput_items_ps": float(self.items[self.served].sum()) / served_span,
            "rejected_pct": 100.0 * float(counts[REJECTED] + counts[REFUSED]) / n if n else 0.0,
            "failed_pct": 100.0 * float(counts[FAILED]) / n if n else 0.0,
            "timeout_pct": 100.0 * float(counts[TIMEOUT]) / n if n else 0.0,
        }
        out.update(self._unshared(counts))
        server = self.server if self.server is not None and not len(self.batch_items) else None
        for name, values in (("latency", self.latency_s), ("queue_wait", self.queue_wait_s)):
            pcts = np.percentile(values, _QS) * 1000.0 if len(values) else [math.nan] * 4
            for q, v in zip(("p50", "p95", "p99", "p99_9"), pcts, strict=True):
                out[f"{name}_{q}_ms"] = float(v)
        if server is not None:
            # The client never sees queue waits: the server does.
            for q in ("p50", "p95", "p99", "p99_9"):
                out[f"queue_wait_{q}_ms"] = float(server.get(f"queue_wait_{q}_ms", math.nan))
        if self.send_lag_s is not None and len(self.send_lag_s):
            out["send_lag_p99_ms"] = float(np.percentile(self.send_lag_s, 99) * 1000.0)
            out["send_lag_max_ms"] = float(self.send_lag_s.max() * 1000.0)
        # Unknown (NaN) when the run saw no batches (a load over HTTP sees none itself).
        model_s = float(self.batch_duration_s.sum()) if len(self.batch_duration_s) else math.nan
        slots = int(self.config.get("max_concurrent_batches", 1))
        out["model_ms_per_request"] = 1000.0 * model_s / served if served else math.nan
        out["model_busy_pct"] = 100.0 * model_s / (span * slots)
        target_ms = float(self.config.get("latency_slo_ms", 0.0))
        if target_ms > 0:
            out["slo_met_pct"] = 100.0 * float(np.mean(self.latency_s * 1000.0 <= target_ms))
        if server is not None:
            for key in ("batches", "mean_batch", "max_batch", "fire_reasons"):
                out[key] = server[key]
            for key in ("tokens_per_batch", "padding_pct"):  # a method with a ragged axis
                if key in server:
                    out[key] = server[key]
            out["server_served"] = server["served"]
            out["server_latency_p50_ms"] = server["latency_p50_ms"]
            out["server_latency_p99_ms"] = server["latency_p99_ms"]
            return out
        batches = len(self.batch_items)
        out["batches"] = batches
        out["mean_batch"] = float(self.batch_items.mean()) if batches else math.nan
        out["max_batch"] = int(self.batch_items.max()) if batches else 0
        reasons = np.bincount(self.batch_reason.astype(np.int64), minlength=len(REASONS))
        out["fire_reasons"] = {r: int(c) for r, c in zip(REASONS, reasons, strict=True) if c}
        out.update(self._token_summary())
        return out

    def _unshared(self, counts: np.ndarray) -> dict[str, Any]:
        """Requests by kind when some kind is not among the shares; the top error messages."""
        out: dict[str, Any] = {}
        if any(c for code, c in enumerate(counts) if code not in _SHARED):
            out["outcomes"] = {OUTCOMES[code]: int(c) for code, c in enumerate(counts) if c}
        if self.errors:
            out["errors"] = dict(list(self.errors.items())[:_TOP_ERRORS])
        return out

    def _token_summary(self) -> dict[str, float]:
        """Tokens per batch and the padding share, for a method with a ragged axis."""
        tokens = self.batch_tokens
        if tokens is None or not len(tokens) or not tokens.sum():
            return {}
        padding = self.batch_padding_tokens
        wasted = float(padding.sum()) if padding is not None else math.nan
        return {
            "tokens_per_batch": float(tokens.mean()),
            "padding_pct": 100.0 * wasted / float(tokens.sum()),
        }

    def table(self) -> str:
        """The summary as a readable two-column table."""
        rows = []
        for key, value in self.summary().items():
            if isinstance(value, float) and math.isnan(value):
                text = f"- ({self._no_figure(key)})"
            elif isinstance(value, float):
                text = f"{value:,.2f}"
            elif key == "errors":
                text = "; ".join(f"{n:,} x {message}" for message, n in value.items())
            elif isinstance(value, dict):
                text = ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
            else:
                text = f"{value:,}"
            rows.append((key, text))
        width = max(len(k) for k, _ in rows)
        head = f"{self.label}\n" if self.label else ""
        return head + "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)

    def _no_figure(self, key: str) -> str:
        """Why the summary has no figure (NaN) for ``key``: said instead of ``nan``."""
        if key.startswith("model_") and not len(self.batch_duration_s):
            return "not seen here: the batches ran in the server"
        if key.startswith(("latency_", "queue_wait_", "slo_", "model_")) and not self.served.any():
            return "nothing was served"
        if key.startswith("queue_wait_"):
            return "not seen: a client sees no queue waits"
        return "no samples"

    def __str__(self) -> str:
        return self.table()

    def to_csv(self, path: str | os.PathLike[str]) -> None:
        """Write one row per request (arrival, start, finish, outcome, items)."""
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["arrival_s", "start_s", "finish_s", "outcome", "items"])
            for a, s, fin, o, k in zip(
                self.arrival_s, self.start_s, self.finish_s, self.outcome, self.items, strict=True
            ):
                writer.writerow([repr(float(a)), repr(float(s)), repr(float(fin)), OUTCOMES[o], k])

    def to_pandas(self) -> Any:
        """The per-request table as a pandas DataFrame (pandas is not a dependency)."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("RunResult.to_pandas() needs pandas: pip install pandas") from exc
        return pd.DataFrame(
            {
                "arrival_s": self.arrival_s,
                "start_s": self.start_s,
                "finish_s": self.finish_s,
                "outcome": [OUTCOMES[o] for o in self.outcome],
                "items": self.items,
            }
        )
