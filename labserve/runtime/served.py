"""What every served method of a Runner has, whichever kind: the :class:`ServedMethod` Protocol.

A Runner serves two kinds of method: :class:`~labserve.runtime.runner.RunnerMethod`
(request batching, or a plain call) and
:class:`~labserve.runtime.generation.method.GenerativeMethod` (continuous batching). Code
that only names a method, reads or changes its settings, or reads or resets its figures
(``PATCH /config``, ``GET /config``, ``Runner.configure``) takes a :class:`ServedMethod` and
works with both. What differs stays on each class: calls (``run`` and a batch queue;
``stream`` and a step scheduler), the config's type and its snapshot's fields.
"""

from __future__ import annotations

from typing import Any, Protocol

from labserve.config.settings import Settings

__all__ = ["MethodStats", "ServedMethod"]


class MethodStats(Protocol):
    """What both kinds of snapshot have (``Snapshot``, ``GenerationSnapshot``). Immutable."""

    @property
    def runner(self) -> str:
        """The runner's name."""

    @property
    def method(self) -> str:
        """The method's name."""

    @property
    def time_s(self) -> float:
        """When it was taken, on the runner's clock (seconds)."""

    def as_dict(self) -> dict[str, Any]:
        """As plain JSON-ready values (``/stats``)."""


class ServedMethod(Protocol):
    """One served method of a Runner, of either kind. Every member is thread-safe."""

    @property
    def name(self) -> str:
        """The method's name on its runner (``runner.<name>``)."""

    @property
    def batchable(self) -> bool:
        """Whether calls are batched by a request queue (a RunnerMethod's kind)."""

    @property
    def generative(self) -> bool:
        """Whether calls are generations, batched step by step (a GenerativeMethod)."""

    @property
    def config(self) -> Settings:
        """The latest config asked for: a ``BatchingConfig`` or a ``GenerationConfig``."""

    def configure(self, **changes: Any) -> Settings:
        """Change settings live, checked first (ConfigError changes nothing); the new config.

        A method that is neither batchable nor generative has nothing to set (TypeError).
        """

    def stats(self) -> MethodStats:
        """An immutable snapshot of the method's figures now."""

    def reset_stats(self) -> None:
        """Forget what was recorded."""
