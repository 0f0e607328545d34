"""A finished batch's outcomes: each caller's result, rejoined if split, or its own error.

Two pure steps of :class:`~labserve.batching.queue.BatchQueue`'s ``complete`` and ``fail``:
:func:`results` hands each request of a batch (or half of one) its slice of the outputs,
rejoining a request that was split across batches once its last part is in; :func:`errors`
gives each its own typed error. Requests that already have their outcome (cancelled, timed
out, failed meanwhile) get none. The queue records what they return.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from labserve.base.errors import LabServeError, ModelError
from labserve.batching.containers import Codec
from labserve.batching.requests import Batch, Outcome, Request, RequestState

__all__ = ["errors", "results"]

_DONE = RequestState.DONE


def results(batch: Batch, outputs: Sequence[Any], codec: Codec) -> list[Outcome]:
    """Each request's result from ``outputs`` (each part's slice, in order); marks them done.

    A request split across batches gets its result when its last part is in: its pieces,
    in order, joined by ``codec``.
    """
    done: list[Outcome] = []
    for (r, a, b), out in zip(batch.parts, outputs, strict=True):
        r.parts_pending -= 1
        if r.state is _DONE:
            continue  # cancelled or failed meanwhile
        if not a and b == r.items:
            result = out
        else:
            if r.pieces is None:
                r.pieces = []
            r.pieces.append((a, out))
            if r.offset < r.items or r.parts_pending:
                continue
            r.pieces.sort(key=lambda p: p[0])
            result = codec.join([p[1] for p in r.pieces])
            r.pieces = None
        r.state = _DONE
        done.append((r, result, None))
    return done


def errors(
    batch: Batch, exc: BaseException, label: str, settle: Callable[[Request], None]
) -> list[Outcome]:
    """Each request's own error for ``exc``; ``settle`` marks each done (and off the queue).

    A LabServeError is copied as it is; anything else the model raised becomes a
    ModelError of method ``label`` naming how many requests the batch held.
    """
    done: list[Outcome] = []
    n_requests = len(batch.parts)
    for r, _a, _b in batch.parts:
        r.parts_pending -= 1
        if r.state is _DONE:
            continue
        settle(r)
        # Each caller gets its own exception object: they may raise it on different threads.
        err: BaseException
        if isinstance(exc, LabServeError):
            err = copy.copy(exc)
            err.__cause__ = exc.__cause__
        else:
            err = ModelError(label, exc, n_requests)
            err.__cause__ = exc
        done.append((r, None, err))
    return done
