"""A set of examples for the load generator: request k sends one of them, not always the same.

``load_test(..., examples=[a, b, c])`` sends ``examples[k % 3]`` as request k (in order,
cycling), so that a realistic mix of inputs (lengths, values, shapes a method groups apart)
is load-tested; ``examples=f`` sends ``f(k)``. Bodies made from a sequence are built once
each and reused; a function's are built per request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ExampleMix"]


class ExampleMix:
    """Request ``k``'s payload from a sequence of examples or a function of ``k``.

    Not thread-safe: the load loop's alone. Has the shape of a length mix for the senders:
    ``length(k)`` is the key a built body is kept under, ``reuse`` whether to keep it.
    """

    def __init__(self, examples: Sequence[Any] | Callable[[int], Any]) -> None:
        if callable(examples):
            self._make: Callable[[int], Any] = examples
            self.reuse = False
        else:
            if isinstance(examples, (str, bytes)) or not isinstance(examples, Sequence):
                raise TypeError(
                    "examples= takes a sequence of examples or a function of the request "
                    f"index, got {type(examples).__name__}"
                )
            if not examples:
                raise ValueError("examples= needs at least one example, got an empty sequence")
            items = list(examples)
            self._make = lambda k: items[k % len(items)]
            self.reuse = True
        self.size = None if callable(examples) else len(examples)
        self._make(0)  # a function that fails does so here, before the run starts

    def length(self, k: int) -> int:
        """The key request ``k``'s body is kept under: its example's index."""
        return k if self.size is None else k % self.size

    def payload(self, k: int) -> Any:
        """Request ``k``'s example."""
        return self._make(k)
