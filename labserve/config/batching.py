"""The batching config: one frozen, validated object per runner method, built from layers.

Each setting is validated once, where it enters: a :class:`BatchingLayer` (a decorator, a
config file section, Runner arguments, a ``configure()`` call) or a directly built
:class:`BatchingConfig`. Layers merge into a config without a second check. A live change
builds a whole new ``BatchingConfig`` and the queue swaps it in at the next batch boundary.

Adding a setting is a one-place change: declare it on :class:`BatchingConfig` as
``name: type = setting(default, rule)`` followed by its attribute docstring (units in the
name). Its rule (a :class:`~labserve.config.settings.Rule`: what it accepts, what the error
says it expected, how the value is normalised) comes from :mod:`labserve.config.settings`,
the one mechanism every config uses, or is written beside it. Everything else
follows from that declaration: :data:`SETTINGS`, the checks of every source (decorator, file,
``Runner(...)``, ``configure()``, CLI flags), :class:`BatchingLayer`, ``as_dict`` and the
snapshot's JSON. In a layer, None means "not set", so a setting that can be switched off
takes 0 for "none" (as ``latency_slo_ms`` does) rather than None.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from functools import cached_property
from typing import Any, TypeVar

from labserve.base.vocabulary import OVERLOAD_ACTIONS, STRATEGIES, OverloadAction, Strategy
from labserve.config.settings import (
    BOOLEAN,
    Rule,
    Settings,
    integer_at_least,
    is_finite_number,
    is_integer,
    number_at_least,
    one_of,
    setting,
)

__all__ = ["SETTINGS", "BatchingConfig", "BatchingLayer", "validate_field"]

_C = TypeVar("_C", bound="BatchingConfig")

_PERCENTILE = Rule(
    "a percentile between 0 and 100 (exclusive)",
    lambda v: is_finite_number(v) and 0.0 < v < 100.0,
    float,
)


def _is_buckets(value: Any) -> bool:
    if not isinstance(value, (list, tuple)) or len(value) > _MAX_BUCKETS:
        return False
    if not all(is_integer(v) and v >= 1 for v in value):
        return False
    return all(a < b for a, b in itertools.pairwise(value))


_MAX_BUCKETS = 64
_BUCKETS = Rule(
    f"a list of at most {_MAX_BUCKETS} increasing integers >= 1 (bucket bounds; [] for none)",
    _is_buckets,
    tuple,
)


@dataclasses.dataclass(frozen=True)
class BatchingConfig(Settings):
    """How one batchable method is batched. Frozen: change it with :meth:`replace`.

    >>> BatchingConfig(max_batch_size=64).replace(max_latency_ms=5).max_latency_ms
    5.0
    """

    enabled: bool = setting(True, BOOLEAN)
    """False turns batching off: every request runs alone (as ``strategy="off"``)."""
    strategy: Strategy = setting("adaptive", one_of(STRATEGIES))
    """How the queue decides when to fire: off, fixed, greedy or adaptive."""
    max_batch_size: int = setting(32, integer_at_least(1))
    """Most items (along the batch axis, not requests) in one model call."""
    max_latency_ms: float = setting(10.0, number_at_least(0.0))
    """Longest a request may wait in the queue before its batch fires, in milliseconds."""
    on_overload: OverloadAction = setting("wait", one_of(OVERLOAD_ACTIONS))
    """What happens to a request that cannot start within ``max_latency_ms`` for want of a
    free batch slot: ``"wait"`` (Ray Serve, Triton, TorchServe) keeps it queued until a
    slot frees; ``"reject"`` (BentoML) refuses it with OverloadError (HTTP 503), at
    admission when the cost model predicts it, else at its deadline."""
    max_queue_size: int = setting(10_000, integer_at_least(1))
    """Most requests waiting; the next one is refused at admission."""
    max_concurrent_batches: int = setting(1, integer_at_least(1))
    """Most batches running the model at once."""
    isolate_errors: bool = setting(False, BOOLEAN)
    """On a model exception, bisect the batch so that only the poisoned request fails."""
    latency_slo_ms: float = setting(0.0, number_at_least(0.0))
    """A latency target for a request's whole latency (queue plus model), in milliseconds,
    at the ``slo_percentile``-th percentile; 0: none. A goal, not a limit: with a target
    the ``adaptive`` strategy holds batches open to make them larger (less model time
    per request) while its live cost model predicts the target still holds."""
    slo_percentile: float = setting(99.0, _PERCENTILE)
    """The percentile of latency that ``latency_slo_ms`` is about (50 < p < 100 usually)."""
    request_timeout_ms: float = setting(60_000.0, number_at_least(0.0))
    """Longest a request may take from admission to its answer, queue plus model, in
    milliseconds (0: no limit). A limit, unlike ``max_latency_ms`` (the queue wait before a
    batch fires): past it the caller gets RequestTimeoutError (HTTP 504). Generous by
    default, so that nothing waits forever behind a model that hangs."""

    max_batch_tokens: int = setting(0, integer_at_least(0))
    """For a method with a ragged axis: most padded tokens (items x the batch's padded
    width) in one model call, beside ``max_batch_size``; 0: no budget. A request whose
    longest row alone exceeds it is refused at admission (TokenBudgetError, HTTP 400)."""
    length_buckets: tuple[int, ...] = setting((), _BUCKETS)
    """For a method with a ragged axis: bucket bounds on a request's length, e.g.
    ``[16, 32, 64]``. Requests share a batch only within a bucket (up to 16, 17 to 32, 33
    to 64, past 64), so a batch pads at most to its bucket's bound; every request still
    fires within ``max_latency_ms``. Empty: every length shares one queue."""
    padding: bool = setting(True, BOOLEAN)
    """For a method with a ragged axis: pad requests of different lengths into one batch.
    False: only requests of one length share a batch (exact-shape grouping, what a
    batcher without padding does)."""

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

    @cached_property
    def effective_strategy(self) -> Strategy:
        """The strategy in force: ``"off"`` when batching is disabled."""
        return self.strategy if self.enabled else "off"

    def replace(self: _C, **changes: Any) -> _C:
        """Return a validated copy with ``changes``; raises ConfigError and changes nothing.

        As in a layer, a change to None leaves that setting as it is.
        """
        return self.with_changes({k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_layers(
        cls: type[_C], *layers: BatchingLayer | Mapping[str, Any], base: _C | None = None
    ) -> _C:
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


SETTINGS: tuple[str, ...] = BatchingConfig.names()
"""The names of the batching settings, in declaration order."""


def validate_field(key: str, value: Any, *, source: str | None = None, path: str = "") -> Any:
    """Check one config value; return it normalised or raise ConfigError naming the rule."""
    return BatchingConfig.check(key, value, source=source, path=path)


_DEFAULTS = BatchingConfig()


class BatchingLayer:
    """Some batching settings from one source, each checked here; None means not set.

    Sources, lowest precedence first: the config file's global section, the decorator, the
    file's runner section, ``Runner(...)`` arguments, a live ``configure()``. ``path`` and
    ``source`` say where a bad value came from in the error (``"runners.scorer.batching."``,
    the file's name). Immutable; two layers are equal when they set the same values.

    >>> BatchingLayer(max_batch_size=64).settings()
    {'max_batch_size': 64}
    """

    __slots__ = ("_items", "path", "source")

    _items: tuple[tuple[str, Any], ...]
    path: str
    source: str | None

    def __init__(self, *, path: str = "", source: str | None = None, **settings: Any) -> None:
        self._check(settings, path, source)

    @classmethod
    def from_mapping(
        cls, settings: Mapping[str, Any], *, path: str = "", source: str | None = None
    ) -> BatchingLayer:
        """Build from ``{setting: value}``; ConfigError names an unknown key or a bad value."""
        layer = cls.__new__(cls)
        layer._check(settings, path, source)
        return layer

    def _check(self, settings: Mapping[str, Any], path: str, source: str | None) -> None:
        checked = {
            str(key): validate_field(str(key), value, source=source, path=path)
            for key, value in settings.items()
            if value is not None
        }
        items = tuple((name, checked[name]) for name in SETTINGS if name in checked)
        object.__setattr__(self, "_items", items)
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "source", source)

    def settings(self) -> dict[str, Any]:
        """The settings this layer sets, in declaration order."""
        return dict(self._items)

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    # Pickled to Ray's replicas: pickle's default for slots sets them through __setattr__.
    def __getstate__(self) -> tuple[Any, ...]:
        return (self._items, self.path, self.source)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(self.__slots__, state, strict=True):
            object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BatchingLayer):
            return NotImplemented
        return self._items == other._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={value!r}" for name, value in self._items)
        return f"BatchingLayer({inner})"
