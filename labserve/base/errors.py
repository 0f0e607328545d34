"""Every error labserve raises, in one flat hierarchy.

Each error builds its message from its fields and knows the HTTP status the server
answers with, so a caller in a notebook and a client over HTTP read the same words.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "BatchSizeMismatchError",
    "CancelledRequestError",
    "ConfigError",
    "HostError",
    "InputError",
    "LabServeError",
    "LengthLimitError",
    "LoadInterrupted",
    "LoadTargetError",
    "LoadWarning",
    "LoopThreadError",
    "MethodNotAllowedError",
    "ModelError",
    "ModelStuckError",
    "NoReplicaError",
    "NotFoundError",
    "OriginError",
    "OutputError",
    "OverloadError",
    "PaddedOutputError",
    "PayloadTooLargeError",
    "QueueFullError",
    "RemoteError",
    "RequestTimeoutError",
    "RunnerStoppedError",
    "ServerError",
    "StopTimeoutError",
    "TokenBudgetError",
    "UnauthorizedError",
    "UnsupportedMediaTypeError",
]


class LabServeError(Exception):
    """Base of every labserve error; ``status`` is the HTTP status the server maps it to."""

    status: int = 500
    retry_after_s: float | None = None
    """Seconds after which a retry may succeed (the HTTP ``Retry-After``); None: no hint."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild without calling the subclass __init__ (its arguments differ from
        # ``args``), so errors copy and pickle.
        return (_rebuild, (type(self), self.args, self.__dict__))

    @property
    def kind(self) -> str:
        """The class name, e.g. ``"OverloadError"``: the ``error`` field on the wire, always."""
        return type(self).__name__


def _rebuild(cls: type[LabServeError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class InputError(LabServeError, ValueError):
    """Raised when a request cannot be batched: wrong shape, dtype, container or axis.

    The message names what was sent and what was expected. The request fails alone,
    at admission; the rest of the queue is untouched. ``param``, when one request
    parameter is at fault, names it as the request spells it (``"messages[1].role"``):
    the OpenAI-compatible routes report it in their error body.
    """

    status = 400

    def __init__(
        self, message: str, *, sent: Any = None, expected: Any = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.sent = sent
        self.expected = expected
        self.param = param


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
    """Raised when a request cannot start within ``max_latency_ms`` for want of a batch slot.

    Only with ``on_overload="reject"`` (BentoML's rule; the default, ``"wait"``, keeps it
    queued). Raised at admission when the cost model predicts it (``predicted_wait_s`` is
    then the predicted wait, ``waited_s`` 0), else once queued, as soon as the cost model
    predicts it (a batch ahead ran late) or at the latest when its deadline passes.
    """

    status = 503

    def __init__(
        self,
        method: str,
        waited_s: float,
        max_latency_s: float,
        retry_after_s: float,
        predicted_wait_s: float | None = None,
    ) -> None:
        # Built in bulk under overload, on the batching path: the message is made when read.
        super().__init__(method, waited_s, max_latency_s, retry_after_s, predicted_wait_s)
        self.method = method
        self.waited_s = waited_s
        self.max_latency_s = max_latency_s
        self.retry_after_s = retry_after_s
        self.predicted_wait_s = predicted_wait_s

    @property
    def waited_ms(self) -> float:
        """How long the request waited in the queue, in milliseconds."""
        return self.waited_s * 1000.0

    @property
    def max_latency_ms(self) -> float:
        """The wait cap it could not start within, in milliseconds."""
        return self.max_latency_s * 1000.0

    def __str__(self) -> str:
        if self.predicted_wait_s is not None:
            said = (
                f"the request would wait about {self.predicted_wait_s * 1000.0:.1f} ms for a "
                "free batch slot, refused at once"
            )
        elif self.waited_s < self.max_latency_s:  # shed once the cost model saw it late
            said = (
                f"the request waited {self.waited_ms:.1f} ms and is predicted to find no free "
                "batch slot in time"
            )
        else:
            said = f"the request waited {self.waited_ms:.1f} ms without a free batch slot"
        return (
            f"{self.method}: overloaded, {said} (max_latency_ms={self.max_latency_ms:g}); "
            f'retry in {self.retry_after_s:.3g} s or set on_overload="wait"'
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


class PaddedOutputError(LabServeError):
    """Raised when a padded batch's output has another width on the ragged axis than its input.

    The method declared that output to carry the ragged axis (``Padding.output_axis``), so
    it must be as wide as the padded input, to be cut back to each caller's length.
    """

    status = 500

    def __init__(self, where: str, axis: int, width: int, got: int | None) -> None:
        sent = "no such axis" if got is None else f"width {got}"
        super().__init__(
            f"{where}: the model returned {sent} on the ragged axis {axis}, expected the "
            f"padded batch's width {width} (Padding.output_axis declares that it carries it)"
        )
        self.axis = axis
        self.width = width
        self.got = got


class TokenBudgetError(InputError):
    """Raised at admission for a request whose longest row alone exceeds ``max_batch_tokens``.

    A request of many rows may exceed the budget (it is split across batches, as one larger
    than ``max_batch_size`` is); a single row cannot be split.
    """

    def __init__(self, method: str, length: int, padded: int, budget: int) -> None:
        rounded = f" (padded to {padded})" if padded != length else ""
        super().__init__(
            f"{method}: a row of length {length}{rounded} exceeds max_batch_tokens={budget}: "
            "a single row cannot be split; send shorter rows or raise the budget",
            sent=length,
            expected=f"<= {budget} tokens",
        )
        self.length = length
        self.budget = budget


class CancelledRequestError(LabServeError):
    """Raised on a request's future when it was withdrawn before it had an outcome.

    Its caller gave up (an interrupted ``run()``, a cancelled ``async_run()`` task, an HTTP
    client that went away): the driver settles the request's future with this error, so
    that whoever still listens on it hears how it ended, and counts it ``cancelled``. The
    caller that gave up sees its own interruption (KeyboardInterrupt, CancelledError).
    """

    status = 499

    def __init__(self, method: str) -> None:
        super().__init__(f"{method}: the request was withdrawn by its caller before its outcome")
        self.method = method


class RunnerStoppedError(LabServeError):
    """Raised when a request reaches a runner that is stopping or stopped."""

    status = 503

    def __init__(self, runner: str) -> None:
        super().__init__(f"runner {runner!r} is stopped; start a new Runner to serve it again")
        self.retry_after_s = 1.0


class RequestTimeoutError(LabServeError, TimeoutError):
    """Raised when a request outlived ``request_timeout_ms``, queued or in a running batch.

    Exactly once per request; its batch, if it runs on, keeps its slot until it returns
    (a model call cannot be killed), and its late result is dropped.
    """

    status = 504

    def __init__(self, method: str, elapsed_s: float, timeout_s: float) -> None:
        super().__init__(method, elapsed_s, timeout_s)
        self.method = method
        self.elapsed_s = elapsed_s
        self.timeout_s = timeout_s

    def __str__(self) -> str:
        return (
            f"{self.method}: no answer after {self.elapsed_s:.3g} s "
            f"(request_timeout_ms={self.timeout_s * 1000.0:g}); the model may be stuck"
        )


class ModelStuckError(LabServeError):
    """Raised at admission while every batch slot of the method is held by a stuck batch.

    A batch is stuck once it has run longer than ``request_timeout_ms``. Rather than queue
    behind it, new requests are refused at once until a slot frees.
    """

    status = 503

    def __init__(self, method: str, stuck_batches: int, running_s: float) -> None:
        super().__init__(
            f"{method}: not ready, every batch slot ({stuck_batches}) is held by a model call "
            f"running for {running_s:.3g} s, past request_timeout_ms; retry later"
        )
        self.stuck_batches = stuck_batches
        self.retry_after_s = 1.0


class StopTimeoutError(LabServeError, TimeoutError):
    """Raised by ``Runner.stop(timeout=...)`` when model calls were still running at the end.

    Every caller has been answered by then (queued or in flight); the named methods' model
    calls may still be running in their worker threads.
    """

    status = 500

    def __init__(self, runner: str, stuck: list[str], timeout_s: float) -> None:
        super().__init__(
            f"runner {runner!r} stopped after {timeout_s:g} s with model calls still running "
            f"in {', '.join(stuck) or 'no method'}; every caller was answered "
            "(RunnerStoppedError), the calls themselves cannot be interrupted"
        )
        self.runner = runner
        self.stuck = stuck


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


class NoReplicaError(LabServeError):
    """Raised when a router is asked to choose among no replicas (a fleet with none up)."""

    status = 503

    def __init__(self, router: str) -> None:
        super().__init__(f"router {router!r} has no replica to choose from")
        self.router = router


# Errors the HTTP server answers with on its own (no runner involved). Their class name is
# the ``error`` field on the wire, as for every other error.


class NotFoundError(LabServeError):
    """Raised when a request names a route, runner, method or model the server does not serve.

    The message lists what is served, so a typo is easy to see.
    """

    status = 404

    def __init__(
        self, what: str, name: str, *, served: Iterable[str] = (), within: str | None = None
    ) -> None:
        self.what = what
        self.name = name
        self.served = tuple(served)
        self.within = within
        where = f"{within} has " if within else ""
        listed = f" (served: {', '.join(self.served) or 'none'})" if what != "route" else ""
        super().__init__(f"{where}no {what} {name!r}{listed}")


class UnauthorizedError(LabServeError):
    """Raised when a route that needs the server's token is called without it, or a wrong one."""

    status = 401

    def __init__(self) -> None:
        super().__init__("a valid token is required (header Authorization: Bearer <server.token>)")


class MethodNotAllowedError(LabServeError):
    """Raised when a route is called with an HTTP method it does not answer (GET on infer)."""

    status = 405

    def __init__(self, method: str, path: str) -> None:
        super().__init__(f"Method Not Allowed: {method} {path}")
        self.method = method
        self.path = path


class PayloadTooLargeError(LabServeError):
    """Raised when a request body is over the server's ``max_body_bytes``.

    ``size_bytes`` is the declared size when the client sent one, else None.
    """

    status = 413

    def __init__(self, limit_bytes: int, size_bytes: int | None = None) -> None:
        size = f"of {size_bytes} bytes " if size_bytes is not None else ""
        super().__init__(
            f"body {size}is over the {limit_bytes}-byte limit (the server's max_body_bytes)"
        )
        self.limit_bytes = limit_bytes
        self.size_bytes = size_bytes


class UnsupportedMediaTypeError(LabServeError):
    """Raised when a body's Content-Type is not one the route documents.

    A page on another site can send ``text/plain`` without asking the browser first, so
    anything but the route's own types is refused before the body is read.
    """

    status = 415

    def __init__(self, content_type: str | None, accepted: Iterable[str]) -> None:
        self.content_type = content_type
        self.accepted = tuple(accepted)
        sent = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
        super().__init__(f"{sent} is not accepted here; send one of: {', '.join(self.accepted)}")


class OriginError(LabServeError):
    """Raised when a request comes from a web page of another origin (its ``Origin`` header).

    As in Jupyter Server: a page in the user's browser must not drive the server. Allow
    chosen origins with ``serve(allow_origin=[...])`` (or ``"*"``).
    """

    status = 403

    def __init__(self, origin: str) -> None:
        super().__init__(
            f"cross-origin request refused: Origin {origin!r} is not this server's own; "
            "allow it with serve(allow_origin=[...])"
        )
        self.origin = origin


class HostError(LabServeError):
    """Raised when the ``Host`` header names neither a loopback name nor the bound address.

    The guard against DNS rebinding (a foreign name resolving to 127.0.0.1), as Jupyter
    Server's ``allow_remote_access``. Allow chosen names with ``serve(allow_hosts=[...])``.
    """

    status = 403

    def __init__(self, host: str) -> None:
        super().__init__(
            f"Host {host!r} is not a loopback name or the address the server is bound to "
            "(a DNS rebinding guard); allow it with serve(allow_hosts=[...])"
        )
        self.host = host


class OutputError(LabServeError):
    """Raised when a result cannot be sent on the wire: the model's fault, not the client's.

    For example a dtype with no Open Inference Protocol name (complex, strings), or values
    that JSON cannot hold.
    """

    status = 500

    def __init__(self, what: str, wire: str) -> None:
        super().__init__(f"the method's result cannot be sent as {wire}: {what}")
        self.what = what
        self.wire = wire


class ServerError(LabServeError):
    """Raised when the server failed on its own: a bug in labserve, not in the request or model.

    The server logs the traceback to the ``labserve.server`` logger.
    """

    status = 500

    def __init__(self, detail: str) -> None:
        super().__init__(f"internal server error: {detail}")
        self.detail = detail


class RemoteError(LabServeError):
    """Raised when a labserve server asked for its stats or config answered with an error, or not.

    ``remote_status`` is its HTTP status (None: no answer), ``error`` the name of its error
    (``"ConfigError"`` for a refused change) and ``detail`` its message.
    """

    status = 502

    def __init__(self, url: str, remote_status: int | None, error: str, detail: str) -> None:
        answer = (
            f"answered {remote_status} {error}" if remote_status else f"did not answer ({error})"
        )
        super().__init__(f"{url} {answer}: {detail}")
        self.url = url
        self.remote_status = remote_status
        self.error = error
        self.detail = detail


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


# Errors of generative methods (continuous batching), raised at admission.


class LengthLimitError(InputError):
    """Raised when a sequence cannot fit a limit of its generative method, at admission.

    The limits: the model's context (prompt plus ``max_tokens``), the token budget of one
    step when chunked prefill is off (the prompt), and the whole KV budget in blocks. The
    message names the value and the limit; nothing else running is touched.
    """

    status = 400

    def __init__(self, what: str, value: int, limit_name: str, limit: int) -> None:
        super().__init__(
            f"{what} is {value}, over {limit_name} of {limit}", sent=value, expected=f"<= {limit}"
        )
        self.what = what
        self.value = value
        self.limit_name = limit_name
        self.limit = limit
