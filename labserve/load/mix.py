"""A length mix for the load generator: each request its own length (``--input-len``).

Lengths come from the shared vocabulary (:mod:`labserve.base.lengths`), drawn from a seeded
generator in the order requests go out, so a seed fixes the trace. The request of length n
is the example resized along its ragged axis: cut to n, or its values repeated to n (a dict
of named arrays, such as ``input_ids`` and ``attention_mask``, is resized alike); or, with a
callable example, ``example(n)``. One payload per distinct length is built and reused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from labserve.base.lengths import LengthDist, parse_length

__all__ = ["LengthMix", "resize"]

_CHUNK = 1024  # lengths drawn at a time (a closed loop does not know how many it sends)


def resize(example: Any, length: int, axis: int = 1) -> Any:
    """``example`` with ``length`` values along ``axis`` (each array of a dict alike)."""
    if isinstance(example, Mapping):
        return {k: resize(v, length, axis) for k, v in example.items()}
    arr = np.asarray(example)
    if arr.ndim <= axis:
        raise ValueError(
            f"an example of shape {list(arr.shape)} has no ragged axis {axis} to resize"
        )
    have = arr.shape[axis]
    if have >= length:
        return np.take(arr, np.arange(length), axis=axis)
    reps = -(-length // have)
    tiled = np.concatenate([arr] * reps, axis=axis)
    return np.take(tiled, np.arange(length), axis=axis)


class LengthMix:
    """Request ``k``'s length and payload. Not thread-safe: the load loop's alone."""

    def __init__(
        self,
        dist: LengthDist | str | int,
        example: Any,
        *,
        seed: int = 0,
        axis: int = 1,
    ) -> None:
        self.dist = parse_length(dist, name="input_len")
        self._rng = np.random.default_rng([seed, 3])
        self._lengths = np.zeros(0, dtype=np.int64)
        self._make: Callable[[int], Any] = (
            example if callable(example) else (lambda n: resize(example, n, axis))
        )
        self._payloads: dict[int, Any] = {}
        self._make(1)  # a bad example fails here, before the run starts

    def length(self, k: int) -> int:
        """Request ``k``'s length (drawn in order, a chunk at a time)."""
        while k >= len(self._lengths):
            more = self.dist.sample(self._rng, _CHUNK)
            self._lengths = np.concatenate([self._lengths, more])
        return int(self._lengths[k])

    def payload(self, k: int) -> Any:
        """Request ``k``'s payload (one per distinct length, built once)."""
        n = self.length(k)
        payload = self._payloads.get(n)
        if payload is None:
            payload = self._payloads[n] = self._make(n)
        return payload
