"""The batching config: one frozen, validated object per runner method, built from layers.

Each setting is validated once, where it enters: a :class:`BatchingLayer` (a decorator, a
config file section, Runner arguments, a ``configure()`` call) or a directly built
:class:`BatchingConfig`. Layers merge into a config without a second check. A live change
builds a whole new ``BatchingConfig`` and the queue swaps it in at the next batch boundary.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any

from labserve.base.errors import ConfigError
from labserve.base.vocabulary import OVERLOAD_ACTIONS, STRATEGIES, OverloadAction, Strategy

__all__ = ["BatchingConfig", "BatchingLayer", "validate_field"]


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


def _percentile(key: str, value: Any, source: str | None) -> float:
    number = _number_at_least(key, value, 0.0, source)
    if not 0.0 < number < 100.0:
        raise ConfigError(key, value, "a percentile between 0 and 100 (exclusive)", source=source)
    return number


_Rule = Callable[[str, Any, "str | None"], Any]
_RULES: dict[str, _Rule] = {
    "enabled": _bool,
    "strategy": lambda k, v, s: _choice(k, v, STRATEGIES, s),
    "max_batch_size": lambda k, v, s: _int_at_least(k, v, 1, s),
    "max_latency_ms": lambda k, v, s: _number_at_least(k, v, 0.0, s),
    "on_overload": lambda k, v, s: _choice(k, v, OVERLOAD_ACTIONS, s),
    "max_queue_size": lambda k, v, s: _int_at_least(k, v, 1, s),
    "max_concurrent_batches": lambda k, v, s: _int_at_least(k, v, 1, s),
    "isolate_errors": _bool,
    "latency_slo_ms": lambda k, v, s: _number_at_least(k, v, 0.0, s),
    "slo_percentile": _percentile,
    "request_timeout_ms": lambda k, v, s: _number_at_least(k, v, 0.0, s),
}
"""Each setting's rule, in the order of BatchingConfig's fields."""


def validate_field(key: str, value: Any, *, source: str | None = None, path: str = "") -> Any:
    """Check one config value; return it normalised or raise ConfigError naming the rule."""
    rule = _RULES.get(key)
    if rule is None:
        allowed = ", ".join(_RULES)
        raise ConfigError(
            f"{path}{key}", value, f"a known setting (one of: {allowed})", source=source
        )
    return rule(f"{path}{key}", value, source)


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
    on_overload: OverloadAction = "wait"
    """What happens to a request that cannot start within ``max_latency_ms`` for want of a
    free batch slot: ``"wait"`` (Ray Serve, Triton, TorchServe) keeps it queued until a
    slot frees; ``"reject"`` (BentoML) refuses it with OverloadError (HTTP 503), at
    admission when the cost model predicts it, else at its deadline."""
    max_queue_size: int = 10_000
    """Most requests waiting; the next one is refused at admission."""
    max_concurrent_batches: int = 1
    """Most batches running the model at once."""
    isolate_errors: bool = False
    """On a model exception, bisect the batch so that only the poisoned request fails."""
    latency_slo_ms: float = 0.0
    """A latency target for a request's whole latency (queue plus model), in milliseconds,
    at the ``slo_percentile``-th percentile; 0: none. A goal, not a limit: with a target
    the ``adaptive`` strategy holds batches open to make them larger (less model time
    per request) while its live cost model predicts the target still holds."""
    slo_percentile: float = 99.0
    """The percentile of latency that ``latency_slo_ms`` is about (50 < p < 100 usually)."""
    request_timeout_ms: float = 60_000.0
    """Longest a request may take from admission to its answer, queue plus model, in
    milliseconds (0: no limit). A limit, unlike ``max_latency_ms`` (the queue wait before a
    batch fires): past it the caller gets RequestTimeoutError (HTTP 504). Generous by
    default, so that nothing waits forever behind a model that hangs."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, validate_field(f.name, getattr(self, f.name)))

    @cached_property
    def max_latency_s(self) -> float:
        """``max_latency_ms`` in seconds: the unit the batching core works in."""
        return self.max_latency_ms / 1000.0

    @cached_property
    def request_timeout_s(self) -> float:
        """``request_timeout_ms`` in seconds (0: no limit)."""
        return self.request_timeout_ms / 1000.0

    @cached_property
    def latency_slo_s(self) -> float:
        """``latency_slo_ms`` in seconds (0: no target)."""
        return self.latency_slo_ms / 1000.0

    @cached_property
    def retry_after_s(self) -> float:
        """What a refused caller is told to wait before retrying: the wait cap, at least 1 ms."""
        return max(self.max_latency_s, 0.001)

    @property
    def effective_strategy(self) -> Strategy:
        """The strategy in force: ``"off"`` when batching is disabled."""
        return self.strategy if self.enabled else "off"

    def replace(self, **changes: Any) -> BatchingConfig:
        """Return a validated copy with ``changes``; raises ConfigError and changes nothing."""
        return self.from_layers(BatchingLayer.from_mapping(changes), base=self)

    def as_dict(self) -> dict[str, Any]:
        """The settings as a plain dict (for JSON, YAML and snapshots)."""
        return {name: getattr(self, name) for name in SETTINGS}

    @classmethod
    def from_layers(
        cls, *layers: BatchingLayer | Mapping[str, Any], base: BatchingConfig | None = None
    ) -> BatchingConfig:
        """Merge layers over ``base`` (the defaults), later layers winning over earlier ones.

        A plain mapping is checked as it becomes a :class:`BatchingLayer`; a layer's values
        (and ``base``'s) were checked when it was built, and none is checked again here.
        """
        merged = (base if base is not None else _DEFAULTS).as_dict()
        for layer in layers:
            if not isinstance(layer, BatchingLayer):
                layer = BatchingLayer.from_mapping(layer)
            merged.update(layer.settings())
        config = object.__new__(cls)
        for name, value in merged.items():
            object.__setattr__(config, name, value)
        return config


SETTINGS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(BatchingConfig))
"""The names of the batching settings, in declaration order."""
_DEFAULTS = BatchingConfig()


@dataclasses.dataclass(frozen=True)
class BatchingLayer:
    """Some batching settings from one source, each checked here; None means not set.

    Sources, lowest precedence first: the config file's global section, the decorator, the
    file's runner section, ``Runner(...)`` arguments, a live ``configure()``. ``path`` and
    ``source`` say where a bad value came from in the error (``"runners.scorer.batching."``,
    the file's name).

    >>> BatchingLayer(max_batch_size=64).settings()
    {'max_batch_size': 64}
    """

    enabled: bool | None = None
    strategy: Strategy | None = None
    max_batch_size: int | None = None
    max_latency_ms: float | None = None
    on_overload: OverloadAction | None = None
    max_queue_size: int | None = None
    max_concurrent_batches: int | None = None
    isolate_errors: bool | None = None
    latency_slo_ms: float | None = None
    slo_percentile: float | None = None
    request_timeout_ms: float | None = None
    path: str = dataclasses.field(default="", repr=False, compare=False)
    source: str | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in SETTINGS:
            value = getattr(self, name)
            if value is not None:
                checked = validate_field(name, value, source=self.source, path=self.path)
                object.__setattr__(self, name, checked)

    @classmethod
    def from_mapping(
        cls, settings: Mapping[str, Any], *, path: str = "", source: str | None = None
    ) -> BatchingLayer:
        """Build from ``{setting: value}``; ConfigError names an unknown key or a bad value."""
        for key, value in settings.items():
            if key not in SETTINGS:
                validate_field(str(key), value, source=source, path=path)  # raises: unknown
        return cls(**settings, path=path, source=source)

    def settings(self) -> dict[str, Any]:
        """The settings this layer sets, in declaration order."""
        return {name: v for name in SETTINGS if (v := getattr(self, name)) is not None}
