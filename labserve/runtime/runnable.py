"""Marking model methods: ``Runnable`` and the ``@method`` decorator (BentoML's names)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, overload

from labserve.batching.containers import TensorSpec
from labserve.batching.padding import Padding
from labserve.config.batching import BatchingLayer
from labserve.config.generation import GenerationConfig

__all__ = ["MethodSpec", "Runnable", "method"]

F = TypeVar("F", bound=Callable[..., Any])

_ATTR = "__labserve_method__"


@dataclass(frozen=True)
class MethodSpec:
    """How a Runnable method is served, as declared by its decorator."""

    name: str
    batchable: bool = False
    batch_dim: int | tuple[int, int] = 0
    is_async: bool = False
    batching: BatchingLayer = field(default_factory=BatchingLayer)
    """Batching settings given to the decorator (the decorator's layer of the config)."""
    input_spec: tuple[TensorSpec, ...] | None = None
    output_spec: tuple[TensorSpec, ...] | None = None
    padding: Padding | None = None
    """The ragged axis and how it is padded (``pad=`` on the decorator), or None."""
    generation: GenerationConfig | None = None
    """A generative method's scheduling settings as declared (None: not generative)."""

    @property
    def generative(self) -> bool:
        """Whether the method advances sequences one step per call (continuous batching)."""
        return self.generation is not None


@overload
def method(fn: F, /) -> F: ...
@overload
def method(
    fn: None = None,
    /,
    *,
    batchable: bool = False,
    batch_dim: int | tuple[int, int] = 0,
    input_spec: TensorSpec | Sequence[TensorSpec] | None = None,
    output_spec: TensorSpec | Sequence[TensorSpec] | None = None,
    pad: Padding | int | None = None,
    generative: bool = False,
    **batching: Any,
) -> Callable[[F], F]: ...
def method(
    fn: F | None = None,
    /,
    *,
    batchable: bool = False,
    batch_dim: int | tuple[int, int] = 0,
    input_spec: TensorSpec | Sequence[TensorSpec] | None = None,
    output_spec: TensorSpec | Sequence[TensorSpec] | None = None,
    pad: Padding | int | None = None,
    generative: bool = False,
    **batching: Any,
) -> F | Callable[[F], F]:
    """Mark a Runnable method to be served, batchable or not.

    ``batch_dim`` is the batch axis of inputs and outputs, or ``(input_dim, output_dim)``.
    ``batching`` takes any BatchingConfig setting (``max_batch_size``,
    ``max_latency_ms``, ``strategy``, ...): the decorator's layer of the config, which a
    config file's runner section and the Runner's arguments override. ``input_spec``
    declares each positional argument per item (dtype and shape without the batch axis):
    a request that does not match fails alone at admission. ``pad`` declares a ragged axis
    (a :class:`~labserve.Padding`, or just its axis): requests of different lengths on it
    share a batch, padded, and the model gets each row's true length (see Padding).

    ``generative=True`` marks a method that advances a batch of sequences by one step
    (continuous batching; see :mod:`labserve.runtime.generation.method`): it takes a
    :class:`~labserve.generation.batch.SeqBatch` and returns next-token logits; ``batching``
    then takes GenerationConfig settings (``max_num_seqs``, ``max_num_batched_tokens``, ...).

    >>> import labserve, numpy as np
    >>> class Doubler(labserve.Runnable):
    ...     @labserve.method(batchable=True, batch_dim=0, max_batch_size=32, max_latency_ms=10)
    ...     def predict(self, x: np.ndarray) -> np.ndarray:
    ...         return x * 2
    """
    generation = GenerationConfig().replace(**batching) if generative else None
    layer = (
        BatchingLayer()
        if generative
        else BatchingLayer.from_mapping(batching, path="@labserve.method ")
    )

    def mark(f: F) -> F:
        spec = MethodSpec(
            name=f.__name__,
            batchable=batchable,
            batch_dim=batch_dim,
            is_async=inspect.iscoroutinefunction(f),
            batching=layer,
            input_spec=_specs(input_spec),
            output_spec=_specs(output_spec),
            padding=_padding(pad),
            generation=generation,
        )
        setattr(f, _ATTR, spec)
        return f

    return mark(fn) if fn is not None else mark


def _specs(spec: TensorSpec | Sequence[TensorSpec] | None) -> tuple[TensorSpec, ...] | None:
    if spec is None:
        return None
    if isinstance(spec, TensorSpec):
        return (spec,)
    specs = tuple(spec)
    if not all(isinstance(s, TensorSpec) for s in specs):
        raise TypeError(f"input_spec/output_spec must be TensorSpec(s), got {spec!r}")
    return specs


def _padding(pad: Padding | int | None) -> Padding | None:
    if pad is None or isinstance(pad, Padding):
        return pad
    if isinstance(pad, int) and not isinstance(pad, bool):
        return Padding(axis=pad)
    raise TypeError(f"pad must be a Padding, an axis (int) or None, got {pad!r}")


class Runnable:
    """Base class of a served model: its ``@labserve.method``-marked methods are served.

    Instantiated once by the Runner (or hand the Runner an instance you built).
    """

    methods: ClassVar[dict[str, MethodSpec]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        found: dict[str, MethodSpec] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                spec = getattr(value, _ATTR, None)
                if isinstance(spec, MethodSpec):
                    found[name] = spec
        cls.methods = found
