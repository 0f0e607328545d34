"""Immutable snapshots of a runner method's state: what /stats, /metrics and the UI read.

The snapshot's JSON round trip lives here too: :meth:`Snapshot.as_dict` writes it and
:func:`snapshot_from_dict` reads it back, field by field from the declared types, so that a
new field needs no change to either.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

from labserve.base.errors import RemoteError
from labserve.config.batching import BatchingConfig

__all__ = ["BatchRecord", "CostFitView", "Percentiles", "Snapshot", "snapshot_from_dict"]


class Percentiles(NamedTuple):
    """Latency percentiles in milliseconds (NaN when there were no samples)."""

    p50: float
    p95: float
    p99: float
    p999: float


class BatchRecord(NamedTuple):
    """One fired batch."""

    start_s: float
    """When it fired (the runner's clock, seconds)."""
    duration_s: float
    """Model call time, seconds (including the hop to the worker thread)."""
    items: int
    """Items along the batch axis."""
    requests: int
    """Requests (or parts of split requests) in it."""
    reason: str
    """Why it fired: full, timeout, adaptive, idle or drain."""
    tokens: int = 0
    """Padded tokens computed: items x the batch's width on the ragged axis (0: none)."""
    padding_tokens: int = 0
    """Of those, padding: ``tokens`` less the rows' true lengths."""


class CostFitView(NamedTuple):
    """The adaptive strategy's cost model as fitted: a_ms + b_ms * items + c_ms * tokens."""

    a_ms: float
    b_ms: float
    samples: int
    min_items: int = 0
    """The smallest batch the fit saw (0 before any): the fit holds from here..."""
    max_items: int = 0
    """...to the largest. Equal: one batch size only, so the slope is unknown (taken as 0)."""
    c_ms: float = 0.0
    """Fitted cost per padded token (a method with a ragged axis; else 0)."""
    width: float = 0.0
    """Mean padded width of the batches fitted (tokens per item; 0: no ragged axis)."""


@dataclass(frozen=True, repr=False)
class Snapshot:
    """Everything about one runner method at one moment. Immutable; safe to share.

    Rates and ``*_window`` figures cover the last ``window_s`` seconds; ``*_overall``
    figures cover everything since start (or the last reset). Its repr is one short line
    (a notebook shows it); ``as_dict()`` has every field.
    """

    runner: str
    method: str
    time_s: float
    """The runner clock's time when taken."""
    window_s: float
    """Width of the sliding window, seconds."""
    config: BatchingConfig
    """The config in force (frozen)."""
    queue_requests: int
    """Requests waiting."""
    queue_items: int
    """Items waiting (along the batch axis)."""
    in_flight_batches: int
    """Batches running the model."""
    admitted: int
    """Requests admitted to the queue since start."""
    served: int
    """Requests answered with a result."""
    rejected: int
    """Admitted requests rejected for overload (could not start within max_latency_ms)."""
    failed: int
    """Requests failed by a model error or a bad model output."""
    cancelled: int
    """Requests withdrawn by their caller."""
    refused: int
    """Requests refused at admission (queue full or runner stopping); never admitted."""
    arrival_rate: float
    """Requests arriving per second (window)."""
    served_rate: float
    rejected_rate: float
    failed_rate: float
    latency_ms_window: Percentiles
    """Admission to result, served requests, in the window."""
    latency_ms_overall: Percentiles
    queue_wait_ms_window: Percentiles
    """Admission to the start of its batch, served requests, in the window."""
    queue_wait_ms_overall: Percentiles
    batches: int
    """Batches fired since start."""
    mean_batch_size: float
    """Mean items per batch in the window (NaN without batches)."""
    max_batch_size_seen: int
    batch_size_counts: dict[int, int]
    """Batches by items, since start."""
    fire_reasons: dict[str, int]
    """Batches by why they fired, since start."""
    recent_batches: tuple[BatchRecord, ...]
    """The last batches, oldest first."""
    cost_fit: CostFitView
    latency_buckets: tuple[tuple[float, int], ...] = ()
    """Cumulative (upper bound in seconds, served requests at or under it), since start."""
    latency_sum_s: float = 0.0
    queue_wait_buckets: tuple[tuple[float, int], ...] = ()
    queue_wait_sum_s: float = 0.0

    timeout: int = 0
    """Admitted requests answered with RequestTimeoutError (past request_timeout_ms)."""
    stuck_batches: int = 0
    """Running batches past request_timeout_ms (a model call that may never return)."""
    model_ms_per_request: float = math.nan
    """Model time per request (window): what batching saves, in milliseconds."""
    model_busy_fraction: float = math.nan
    """Model time / (window x max_concurrent_batches): how busy the batch slots were."""
    latency_slo_met: float = math.nan
    """Share of requests served in the window within ``latency_slo_ms`` (NaN: no target)."""
    latency_budget_ms: float = math.nan
    """What the adaptive strategy plans a request's latency to: the target less the margin
    it learnt from answered batches (NaN: no target, or another strategy)."""
    tokens_per_batch: float = math.nan
    """Mean padded tokens per batch (window); NaN without a ragged axis or batches."""
    padding_fraction: float = math.nan
    """Padding tokens / padded tokens of the window's batches: the compute padding wastes
    (NaN without a ragged axis or batches)."""
    tokens_total: int = 0
    """Padded tokens computed since start (0 without a ragged axis)."""
    padding_tokens_total: int = 0
    """Of those, padding, since start."""
    config_asked: BatchingConfig | None = None
    """What ``configure()`` last asked for while it is not yet in force (it applies at the
    next batch boundary); None when ``config`` is the latest."""

    @property
    def pending(self) -> int:
        """Admitted requests without an outcome yet (queued or in a running batch)."""
        done = self.served + self.rejected + self.failed + self.cancelled + self.timeout
        return self.admitted - done

    @property
    def ready(self) -> bool:
        """False while every batch slot is held by a stuck batch: new requests are refused."""
        return self.stuck_batches < self.config.max_concurrent_batches

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes None)."""

        def clean(value: Any) -> Any:
            if isinstance(value, float) and math.isnan(value):
                return None
            if isinstance(value, BatchingConfig):
                return value.as_dict()
            if isinstance(value, tuple) and hasattr(value, "_asdict"):
                return {k: clean(v) for k, v in value._asdict().items()}
            if isinstance(value, (list, tuple)):
                return [clean(v) for v in value]
            if isinstance(value, dict):
                return {str(k): clean(v) for k, v in value.items()}
            return value

        out = {f.name: clean(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out["pending"] = self.pending
        return out

    def __repr__(self) -> str:
        return f"<Snapshot {self}>"

    def __str__(self) -> str:
        lat = self.latency_ms_window
        asked = self.config_asked
        pending = ""
        if asked is not None:
            changed = {
                k: v for k, v in asked.as_dict().items() if self.config.as_dict().get(k) != v
            }
            said = ", ".join(f"{k}={v!r}" for k, v in changed.items()) or "as in force"
            pending = f" (pending, from the next batch: {said})"
        # No batch yet (or none served in the window): say so rather than print nan.
        batches = (
            f"{self.batches} batches, mean {self.mean_batch_size:.1f} items"
            if self.batches
            else "no batches yet"
        )
        latency = (
            f"p50 {lat.p50:.2f} ms, p99 {lat.p99:.2f} ms"
            if not math.isnan(lat.p50)
            else "no latency in the window"
        )
        return (
            f"{self.runner}.{self.method}: {self.served} served, {self.refused} refused, "
            f"{self.rejected} rejected, {self.timeout} timed out, {self.failed} failed, "
            f"{self.cancelled} cancelled | {batches} | {latency} | "
            f"queue {self.queue_requests} | {self.config.strategy}, "
            f"max_batch_size={self.config.max_batch_size}, "
            f"max_latency_ms={self.config.max_latency_ms:g}{pending}"
        )


def snapshot_from_dict(data: Mapping[str, Any]) -> Snapshot:
    """A :class:`Snapshot` from its JSON (``Snapshot.as_dict()``, ``/stats``): None is NaN.

    A field missing from ``data`` takes its default; ``pending`` (derived) is ignored.

    Raises:
        RemoteError: the JSON is not a snapshot (a field missing or of the wrong kind).
    """
    try:
        values: dict[str, Any] = {}
        for name, hint in _hints(Snapshot).items():
            if name in data:
                values[name] = _decode(hint, data[name])
        return Snapshot(**values)
    except (KeyError, TypeError, ValueError) as exc:
        raise RemoteError("/stats", None, "InputError", f"not a snapshot: {exc!r}") from None


@cache
def _hints(cls: type) -> dict[str, Any]:
    # The annotations are strings (postponed evaluation): resolve them once per class.
    return typing.get_type_hints(cls)


def _decode(hint: Any, value: Any) -> Any:
    """``value`` (as ``as_dict`` wrote it) back as the type ``hint`` declares."""
    if hint is float:
        return math.nan if value is None else float(value)
    if hint in (int, str):
        return hint(value)
    if hint is BatchingConfig:
        return BatchingConfig(**value)
    if isinstance(hint, type) and issubclass(hint, tuple):  # a NamedTuple record
        return _decode_record(hint, value)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:  # X | None
        (other,) = (a for a in args if a is not type(None))
        return None if value is None else _decode(other, value)
    if origin is dict:
        return {_decode(args[0], k): _decode(args[1], v) for k, v in value.items()}
    if origin is tuple and args[-1] is Ellipsis:
        return tuple(_decode(args[0], v) for v in value)
    if origin is tuple:
        return tuple(_decode(a, v) for a, v in zip(args, value, strict=True))
    raise TypeError(f"no JSON decoding for {hint!r}")


def _decode_record(cls: Any, value: Mapping[str, Any]) -> Any:
    """A NamedTuple from its dict; a missing field takes its default (KeyError if none)."""
    fields = {
        name: _decode(hint, value[name])
        for name, hint in _hints(cls).items()
        if name in value or name not in cls._field_defaults
    }
    return cls(**fields)
