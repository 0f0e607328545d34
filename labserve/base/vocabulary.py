"""The words every layer shares: request outcomes, batch fire reasons, strategies.

The ground floor: it imports nothing from labserve, and everything that names an outcome
or a reason (the recorder, snapshots, /metrics, RunResult, the UI) imports it from here.
New words go at the end of their tuple: the position is the code a RunResult stores.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "CANCELLED",
    "CLIENT_ERROR",
    "CONNECT_ERROR",
    "FAILED",
    "OUTCOMES",
    "OVERLOAD_ACTIONS",
    "REASONS",
    "REFUSED",
    "REJECTED",
    "RESET",
    "RUNNER_OUTCOMES",
    "SERVED",
    "STRATEGIES",
    "TIMEOUT",
    "OverloadAction",
    "Reason",
    "Strategy",
]

OUTCOMES: tuple[str, ...] = (
    "served",  # answered with a result
    "rejected",  # admitted, then refused for overload (could not start in time)
    "failed",  # the model raised, or its output was unusable
    "cancelled",  # withdrawn: the caller gave up, or the run was stopped
    "refused",  # never admitted: queue full or runner stopping
    "timeout",  # outlived its request timeout
    "connect_error",  # over HTTP: no connection could be made
    "reset",  # over HTTP: the connection broke before the reply
    "client_error",  # over HTTP: a 4xx reply (bad request, unknown route, no token...)
)
"""Every way a request can end, by code (the index): what ``RunResult.outcome`` holds."""
(
    SERVED,
    REJECTED,
    FAILED,
    CANCELLED,
    REFUSED,
    TIMEOUT,
    CONNECT_ERROR,
    RESET,
    CLIENT_ERROR,
) = range(len(OUTCOMES))

RUNNER_OUTCOMES: tuple[str, ...] = OUTCOMES[: TIMEOUT + 1]
"""The outcomes a runner counts in its snapshot (each a Snapshot field of that name); the
others are seen only by a client across a network."""

Reason = Literal["full", "timeout", "adaptive", "idle", "drain"]
REASONS: tuple[Reason, ...] = ("full", "timeout", "adaptive", "idle", "drain")
"""Why a batch fired: the cap was reached; the oldest request waited ``max_latency_ms``;
the adaptive strategy stopped holding; a slot was free and holding would not pay; the
runner is stopping."""

Strategy = Literal["off", "fixed", "greedy", "adaptive"]
STRATEGIES: tuple[Strategy, ...] = ("off", "fixed", "greedy", "adaptive")

OverloadAction = Literal["reject", "wait"]
OVERLOAD_ACTIONS: tuple[OverloadAction, ...] = ("reject", "wait")
