"""Calling a method's model on a batch: stack the inputs, call, check the count, split.

:class:`ModelCall` is the driver's model function bound to its codec (a padded method may
take its rows' lengths). It touches no queue state, so any thread may use it: worker
threads for a synchronous model, labserve's loop for an ``async def`` one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labserve.base.errors import BatchSizeMismatchError, LabServeError
from labserve.batching.containers import Codec
from labserve.batching.requests import Batch
from labserve.config.batching import BatchingConfig

__all__ = ["ModelCall", "should_isolate"]


class ModelCall:
    """One method's model function and codec. Pure: any thread."""

    __slots__ = ("_codec", "_name", "fn")

    def __init__(self, fn: Callable[..., Any], codec: Codec, name: str) -> None:
        self.fn = codec.bind(fn)  # a padded method may take its rows' lengths
        self._codec = codec
        self._name = name

    def start(self, batch: Batch) -> Any:
        """Call the model on ``batch``'s stacked inputs: its output (or its awaitable)."""
        return self.fn(*batch.stack(self._codec))

    def check_count(self, batch: Batch, output: Any) -> None:
        """Raise BatchSizeMismatchError unless ``output`` has one item per input item."""
        try:
            returned = self._codec.output_items(output)
        except LabServeError as exc:
            raise BatchSizeMismatchError(self._name, batch.items, -1) from exc
        if returned != batch.items:
            raise BatchSizeMismatchError(self._name, batch.items, returned)

    def split(self, batch: Batch, output: Any) -> list[Any]:
        """``output`` checked and split into each part's share."""
        self.check_count(batch, output)
        return batch.split(self._codec, output)

    def call(self, batch: Batch) -> list[Any]:
        """Stack, call the (synchronous) model, split."""
        return self.split(batch, self.start(batch))


def should_isolate(batch: Batch, exc: BaseException, config: BatchingConfig) -> bool:
    """True if a batch that raised ``exc`` is to be bisected (``isolate_errors``).

    Only an Exception, only with more than one request, and never for a wrong output
    count (every half would fail the same way).
    """
    return (
        isinstance(exc, Exception)
        and config.isolate_errors
        and len(batch.parts) > 1
        and not isinstance(exc, BatchSizeMismatchError)
    )
