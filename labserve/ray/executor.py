"""A ``concurrent.futures.Executor`` that runs each call as a Ray task (for ``sweep``).

>>> rows = labserve.sweep(rates=[...], executor=RayExecutor())   # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

import ray

__all__ = ["RayExecutor"]

T = TypeVar("T")


def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return fn(*args, **kwargs)


class RayExecutor(concurrent.futures.Executor):
    """Submit calls as Ray tasks on the running cluster; futures are concurrent.futures ones.

    ``num_cpus`` is what each task reserves (fractional shares let tasks sit beside
    replicas on a small machine). Thread-safe (Ray's task submission is). ``shutdown``
    waits for, or cancels, the tasks this executor started; it does not stop Ray.
    """

    def __init__(self, num_cpus: float = 1.0, **options: Any) -> None:
        if not ray.is_initialized():
            raise RuntimeError("RayExecutor needs a running Ray: call ray.init() first")
        self._remote = ray.remote(_call).options(num_cpus=num_cpus, **options)
        self._refs: list[ray.ObjectRef[Any]] = []
        self._closed = False

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        """Run ``fn(*args, **kwargs)`` as a Ray task; its future settles with the result."""
        if self._closed:
            raise RuntimeError("cannot submit to a RayExecutor after shutdown()")
        ref = self._remote.remote(fn, args, kwargs)
        self._refs.append(ref)
        future: concurrent.futures.Future[T] = ref.future()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls; cancel the running ones (``cancel_futures``) or wait for them."""
        self._closed = True
        refs, self._refs = self._refs, []
        if cancel_futures:
            for ref in refs:
                ray.cancel(ref)
        elif wait and refs:
            ray.wait(refs, num_returns=len(refs))
