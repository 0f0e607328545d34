"""Every error labserve raises, in one flat hierarchy.

Each error builds its message from its fields and knows the HTTP status the server
answers with, so a caller in a notebook and a client over HTTP read the same words.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BatchSizeMismatchError",
    "CancelledRequestError",
    "ConfigError",
    "InputError",
    "LabServeError",
    "LoadInterrupted",
    "LoadTargetError",
    "LoadWarning",
    "LoopThreadError",
    "ModelError",
    "OverloadError",
    "QueueFullError",
    "RunnerStoppedError",
]


class LabServeError(Exception):
    """Base of every labserve error; ``status`` is the HTTP status the server maps it to."""

    status: int = 500

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild without calling the subclass __init__ (its arguments differ from
        # ``args``), so errors copy and pickle.
        return (_rebuild, (type(self), self.args, self.__dict__))

    @property
    def kind(self) -> str:
        """A short machine-readable name, e.g. ``"overload"``; the server's ``error`` field."""
        return type(self).__name__


def _rebuild(cls: type[LabServeError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class InputError(LabServeError, ValueError):
    """Raised when a request cannot be batched: wrong shape, dtype, container or axis.

    The message names what was sent and what was expected. The request fails alone,
    at admission; the rest of the queue is untouched.
    """

    status = 400

    def __init__(self, message: str, *, sent: Any = None, expected: Any = None) -> None:
        super().__init__(message)
        self.sent = sent
        self.expected = expected


class QueueFullError(LabServeError):
    """Raised at admission when the queue already holds ``max_queue_size`` requests."""

    status = 503

    def __init__(self, method: str, max_queue_size: int, retry_after_s: float) -> None:
        super().__init__(
            f"{method}: queue is full ({max_queue_size} requests waiting, "
            f"max_queue_size={max_queue_size}); retry in {retry_after_s:.3g} s"
        )
        self.max_queue_size = max_queue_size
        self.retry_after_s = retry_after_s


class OverloadError(LabServeError):
    """Raised when a queued request could not start within ``max_latency_ms``.

    Only with ``on_overload="reject"`` (the default); with ``"wait"`` the request stays queued.
    """

    status = 503

    def __init__(self, method: str, waited_ms: float, max_latency_ms: float) -> None:
        # Built in bulk under overload, on the batching path: the message is made when read.
        super().__init__(method, waited_ms, max_latency_ms)
        self.method = method
        self.waited_ms = waited_ms
        self.max_latency_ms = max_latency_ms
        self.retry_after_s = max(max_latency_ms / 1000.0, 0.001)

    def __str__(self) -> str:
        return (
            f"{self.method}: overloaded, the request waited {self.waited_ms:.1f} ms without a "
            f"free batch slot (max_latency_ms={self.max_latency_ms:g}); retry later or set "
            'on_overload="wait"'
        )


class ModelError(LabServeError):
    """Raised when the model raised while running the request's batch.

    ``__cause__`` is the model's exception; the message repeats it.
    """

    status = 500

    def __init__(self, method: str, exc: BaseException, batch_requests: int) -> None:
        try:
            said = str(exc)
        except Exception:  # a model's exception whose __str__ fails must not lose the caller
            said = "<unprintable>"
        super().__init__(
            f"{method}: model raised {type(exc).__name__}: {said} "
            f"(in a batch of {batch_requests} request{'s' if batch_requests != 1 else ''})"
        )
        self.batch_requests = batch_requests


class BatchSizeMismatchError(LabServeError):
    """Raised when the model returned another number of rows than it was given."""

    status = 500

    def __init__(self, method: str, sent_items: int, returned_items: int) -> None:
        super().__init__(
            f"{method}: the model was given {sent_items} items along the batch axis but "
            f"returned {returned_items}; a batchable method must return one output per input"
        )
        self.sent_items = sent_items
        self.returned_items = returned_items


class CancelledRequestError(LabServeError):
    """Raised to a caller whose request was withdrawn before it ran (it gave up)."""

    status = 499


class RunnerStoppedError(LabServeError):
    """Raised when a request reaches a runner that is stopping or stopped."""

    status = 503

    def __init__(self, runner: str) -> None:
        super().__init__(f"runner {runner!r} is stopped; start a new Runner to serve it again")
        self.retry_after_s = 1.0


class LoopThreadError(LabServeError, RuntimeError):
    """Raised when a blocking call is made from labserve's own loop thread.

    Blocking there would deadlock: the loop that must answer is the one waiting.
    """

    status = 500


class ConfigError(LabServeError, ValueError):
    """Raised when a config value breaks a rule; names where it came from, the key and the rule.

    Also a ``ValueError``, so ``configure()`` callers can catch the usual type.
    """

    status = 422

    def __init__(self, key: str, value: Any, rule: str, *, source: str | None = None) -> None:
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key} must be {rule}, got {value!r}")
        self.key = key
        self.value = value
        self.rule = rule
        self.source = source


class LoadTargetError(LabServeError):
    """Raised when a load generator's HTTP target cannot be used: a bad URL, or no model there.

    Said before the first request is timed, naming the URL and what was wrong.
    """

    status = 400

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(f"cannot load {url}: {problem}")
        self.url = url
        self.problem = problem


class LoadWarning(UserWarning):
    """Warned when a load generator could not keep the asked rate (it fell behind schedule).

    Latencies stay measured from the intended send times, so they include the lag.
    """


class LoadInterrupted(KeyboardInterrupt):
    """Raised when a blocking load run is interrupted (Ctrl-C, a notebook's stop button).

    The load stopped at once: no request was sent after the interrupt, and requests still
    in flight were given up (outcome ``cancelled``). ``result`` is the RunResult measured
    so far. A KeyboardInterrupt, so a script's loop of runs stops as the user asked.
    """

    def __init__(self, result: Any, sent: int) -> None:
        super().__init__(
            f"load run interrupted after {sent} requests; .result holds what was measured so far"
        )
        self.result = result
        self.sent = sent
