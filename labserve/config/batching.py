"""The batching config: one frozen, validated object per runner method.

A live change builds a whole new ``BatchingConfig`` (validated before anything changes)
and the queue swaps it in at the next batch boundary.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from labserve.base.errors import ConfigError
from labserve.base.vocabulary import OVERLOAD_ACTIONS, STRATEGIES, OverloadAction, Strategy

__all__ = ["BatchingConfig", "validate_field"]


def _int_at_least(key: str, value: Any, low: int, source: str | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(key, value, f"an integer >= {low}", source=source)
    return value


def _number_at_least(key: str, value: Any, low: float, source: str | None) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < low:
        raise ConfigError(key, value, f"a finite number >= {low:g}", source=source)
    return float(value)


def _choice(key: str, value: Any, choices: tuple[str, ...], source: str | None) -> str:
    if value not in choices:
        raise ConfigError(key, value, "one of " + ", ".join(map(repr, choices)), source=source)
    return str(value)


def _bool(key: str, value: Any, source: str | None) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, value, "true or false", source=source)
    return value


def validate_field(key: str, value: Any, *, source: str | None = None, path: str = "") -> Any:
    """Check one config value; return it normalised or raise ConfigError naming the rule."""
    name = f"{path}{key}"
    if key == "enabled":
        return _bool(name, value, source)
    if key == "strategy":
        return _choice(name, value, STRATEGIES, source)
    if key == "max_batch_size":
        return _int_at_least(name, value, 1, source)
    if key == "max_latency_ms":
        return _number_at_least(name, value, 0.0, source)
    if key == "on_overload":
        return _choice(name, value, OVERLOAD_ACTIONS, source)
    if key == "max_queue_size":
        return _int_at_least(name, value, 1, source)
    if key == "max_concurrent_batches":
        return _int_at_least(name, value, 1, source)
    if key == "isolate_errors":
        return _bool(name, value, source)
    allowed = ", ".join(f.name for f in dataclasses.fields(BatchingConfig))
    raise ConfigError(name, value, f"a known setting (one of: {allowed})", source=source)


@dataclasses.dataclass(frozen=True)
class BatchingConfig:
    """How one batchable method is batched. Frozen: change it with :meth:`replace`.

    >>> BatchingConfig(max_batch_size=64).replace(max_latency_ms=5).max_latency_ms
    5.0
    """

    enabled: bool = True
    """False turns batching off: every request runs alone (as ``strategy="off"``)."""
    strategy: Strategy = "adaptive"
    """How the queue decides when to fire: off, fixed, greedy or adaptive."""
    max_batch_size: int = 32
    """Most items (along the batch axis, not requests) in one model call."""
    max_latency_ms: float = 10.0
    """Longest a request may wait in the queue before its batch fires, in milliseconds."""
    on_overload: OverloadAction = "reject"
    """What happens to a request still queued at its deadline with no free batch slot."""
    max_queue_size: int = 10_000
    """Most requests waiting; the next one is refused at admission."""
    max_concurrent_batches: int = 1
    """Most batches running the model at once."""
    isolate_errors: bool = False
    """On a model exception, bisect the batch so that only the poisoned request fails."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, validate_field(f.name, getattr(self, f.name)))

    @property
    def max_latency_s(self) -> float:
        """``max_latency_ms`` in seconds."""
        return self.max_latency_ms / 1000.0

    @property
    def effective_strategy(self) -> Strategy:
        """The strategy in force: ``"off"`` when batching is disabled."""
        return self.strategy if self.enabled else "off"

    def replace(self, **changes: Any) -> BatchingConfig:
        """Return a validated copy with ``changes``; raises ConfigError and changes nothing."""
        for key, value in changes.items():
            validate_field(key, value)
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The settings as a plain dict (for JSON, YAML and snapshots)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_layers(cls, *layers: Mapping[str, Any]) -> BatchingConfig:
        """Build from partial settings, later layers winning over earlier ones."""
        merged: dict[str, Any] = {}
        for layer in layers:
            merged.update(layer)
        return cls(**merged)
