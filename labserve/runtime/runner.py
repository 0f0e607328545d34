"""Runner: binds a Runnable to the background loop, one batch queue per batchable method."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import inspect
import os
import threading
from collections.abc import Mapping
from typing import Any

from labserve.base.clock import Clock, MonotonicClock
from labserve.base.errors import (
    ConfigError,
    InputError,
    LoopThreadError,
    RunnerStoppedError,
    StopTimeoutError,
)
from labserve.batching.containers import Codec
from labserve.batching.queue import BatchQueue
from labserve.batching.requests import Request
from labserve.config.batching import BatchingConfig, BatchingLayer
from labserve.config.file import ConfigFile, load_config_file
from labserve.config.generation import GENERATION_SETTINGS, GenerationConfig
from labserve.config.settings import Settings
from labserve.generation.stats import GenerationSnapshot
from labserve.metrics.snapshot import BatchRecord, Snapshot
from labserve.runtime import session
from labserve.runtime.driver import MethodDriver
from labserve.runtime.generation.method import GenerativeMethod
from labserve.runtime.loop import BackgroundLoop, background_loop
from labserve.runtime.runnable import MethodSpec, Runnable
from labserve.runtime.scheduling import LoopHost
from labserve.runtime.served import ServedMethod

__all__ = ["Runner", "RunnerMethod"]


def _generation_config(
    declared: GenerationConfig, file: ConfigFile, runner: str, arguments: Mapping[str, Any]
) -> GenerationConfig:
    """A generative method's settings: the decorator < the file's section < the arguments."""
    section = file.generation_for(runner)
    path = f"runners.{runner}.generation."
    return declared.with_changes(section, path=path, source=file.source).replace(**arguments)


_SHARED = ("isolate_errors", "max_queue_size", "request_timeout_ms")
"""Settings batchable and generative methods both have, with one meaning."""


def _generation_only(key: str) -> bool:
    """A setting of generative methods that batchable methods do not have."""
    return key in GENERATION_SETTINGS and key not in BatchingConfig.__dataclass_fields__


def _lengths_given(fn: Any, spec: MethodSpec) -> Any:
    """A padded method's model, its lengths keyword given by each batch (not by callers).

    A partial: its signature shows the keyword as given, so a call's inputs are checked
    against the others, and the batch's lengths override the placeholder.
    """
    padding = spec.padding
    if not spec.batchable or padding is None or padding.lengths_arg is None:
        return fn
    return functools.partial(fn, **{padding.lengths_arg: None})


class RunnerMethod:
    """One served method: ``run`` (blocking) and ``async_run`` (awaitable).

    Both are thread-safe. Batchable methods go through the method's batch queue on the
    background loop; others are plain calls. A :class:`~labserve.runtime.served.ServedMethod`.
    """

    generative = False

    def __init__(self, runner: Runner, spec: MethodSpec, fn: Any, config: BatchingConfig) -> None:
        self.runner = runner
        self.spec = spec
        self.name = spec.name
        self._fn = _lengths_given(fn, spec)
        self._lock = threading.Lock()
        self._driver: MethodDriver | None = None
        self._queue: BatchQueue | None = None
        self._plain_config = config  # a plain method's (unused) layers; a queue holds the rest
        self._fits: set[int] = set()  # numbers of arguments the model was checked to take
        if spec.batchable:
            codec = Codec(spec.name, spec.batch_dim, spec.input_spec, spec.padding)
            self._queue = BatchQueue(spec.name, codec, config, runner=runner.name)
            self._new_request = self._queue.new_request  # per call: one lookup less

    @property
    def batchable(self) -> bool:
        """True when calls are batched."""
        return self.spec.batchable

    @property
    def config(self) -> BatchingConfig:
        """The latest config asked for (in force from the next batch). Thread-safe."""
        if self._queue is None:
            return self._plain_config
        return self._queue.latest_config

    @property
    def model_fn(self) -> Any:
        """The bound model method (called with a whole batch when batchable).

        For a method with a ragged axis whose model takes the lengths, a
        ``functools.partial`` giving that keyword (each batch passes its own).
        """
        return self._fn

    @property
    def parameters(self) -> tuple[str, ...]:
        """The names of the model method's positional parameters, in order (none if unknown)."""
        try:
            signature = inspect.signature(self._fn)
        except (TypeError, ValueError):  # a callable without a signature
            return ()
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return tuple(p.name for p in signature.parameters.values() if p.kind in kinds)

    def check_arity(self, args: tuple[Any, ...]) -> None:
        """Raise InputError if the model cannot take ``args`` (a wrong number of inputs).

        Thread-safe. Every call form checks it first, so a request with too many or too few
        inputs fails alone at admission, before it reaches a batch.
        """
        if len(args) in self._fits:
            return
        try:
            inspect.signature(self._fn).bind(*args)
        except TypeError as exc:
            n = len(args)
            raise InputError(
                f"{self.runner.name}.{self.name} cannot take {n} input{'s' if n != 1 else ''}: "
                f"{exc}",
                sent=n,
            ) from None
        except ValueError:
            pass  # a callable without a signature: the call decides
        self._fits.add(len(args))  # a set's add is atomic: no lock needed

    def start(self) -> None:
        """Start the background loop and this method's driver now, not at the first request.

        Thread-safe and idempotent; raises RunnerStoppedError once the runner stopped, and
        TypeError for a method that is not batchable (it has no driver). A load generator
        calls it so that start-up is not counted as the first requests' latency.
        """
        if not self.batchable:
            raise TypeError(f"{self.runner.name}.{self.name} is not batchable: nothing to start")
        self._driver_started()

    def _driver_started(self) -> MethodDriver:
        if self.runner.stopped:
            raise RunnerStoppedError(self.runner.name)
        driver = self._driver
        if driver is None:
            with self._lock:
                if self._driver is None:
                    assert self._queue is not None
                    self._driver = MethodDriver(
                        self._queue,
                        self._fn,
                        is_async=self.spec.is_async,
                        scheduler=LoopHost(self.runner.bg, self.runner.clock),
                    )
                    self.runner._started()
                driver = self._driver
        return driver

    def run(self, *args: Any) -> Any:
        """Send one request and block for its own result. Not from labserve's loop thread.

        Raises the request's typed error (InputError, OverloadError, ModelError, ...).
        An interrupt while waiting (KeyboardInterrupt) withdraws the request.
        """
        if len(args) not in self._fits:
            self.check_arity(args)
        if not self.batchable:
            if self.runner.stopped:
                raise RunnerStoppedError(self.runner.name)
            return self._call_plain_sync(*args)
        driver = self._driver_started()
        if self.runner.bg.in_loop_thread():
            raise LoopThreadError(
                f"{self.runner.name}.{self.name}.run() blocks, and was called from labserve's "
                "loop thread; use `await ...async_run()` there"
            )
        assert self._queue is not None
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        request = self._queue.new_request(args, future)
        driver.submit_threadsafe(request)
        try:
            return future.result()
        except BaseException:
            if not future.done():  # interrupted while waiting, not the request's own error
                future.cancel()
                driver.cancel_threadsafe(request)
            raise

    async def async_run(self, *args: Any) -> Any:
        """Send one request and await its own result, from any running event loop.

        Raises the request's typed error. Cancelling the awaiting task withdraws it.
        """
        if len(args) not in self._fits:
            self.check_arity(args)
        driver = self._driver
        if driver is None or self.runner._stopped:
            if not self.batchable:
                if self.runner.stopped:
                    raise RunnerStoppedError(self.runner.name)
                return await self._call_plain_async(*args)
            driver = self._driver_started()
        # The caller's own loop settles the future: no task, no wrapped concurrent future,
        # and one hand-off per batch for all of that loop's callers.
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        request = self._new_request(args, future)
        here = loop is driver.loop
        if here:
            driver.submit(request)
        else:
            driver.submit_threadsafe(request)
        try:
            return await future
        except asyncio.CancelledError:
            if here:
                driver.cancel(request)
            else:
                driver.cancel_threadsafe(request)
            raise

    def submit_on_loop(self, args: tuple[Any, ...]) -> tuple[Request, asyncio.Future[Any]]:
        """Submit one request from labserve's own loop; return it and the future it settles.

        Loop-only (the thread-safe doors are :meth:`run` and :meth:`async_run`). The
        request's ``start_s`` (when its batch fired, on the runner's clock) and ``items``
        can be read once the future is done: the load generator records them. Refusals
        (QueueFullError, RunnerStoppedError, InputError) are set on the future, except a
        wrong number of inputs (InputError) and a stopped runner, raised at once.
        """
        if len(args) not in self._fits:
            self.check_arity(args)
        driver = self._driver_started()
        assert self._queue is not None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        request = self._queue.new_request(args, future)
        driver.submit(request)
        return request, future

    def withdraw_on_loop(self, request: Request) -> None:
        """Withdraw a request from :meth:`submit_on_loop` whose caller gave up. Loop-only.

        Counted ``cancelled`` unless it already has its outcome; its future, unless the
        caller cancelled it first (as the HTTP handlers do), gets CancelledRequestError.
        """
        if self._driver is not None:
            self._driver.cancel(request)

    def batch_records(self, last: int) -> list[BatchRecord]:
        """The last ``last`` batches recorded, oldest first; none before the first request.

        At most what the recorder holds. Thread-safe.
        """
        if self._driver is None or last <= 0:
            return []
        return self._driver.batch_records(last)

    def _call_plain_sync(self, *args: Any) -> Any:
        if self.spec.is_async:
            return self.runner.bg.run(self._fn(*args))
        return self._fn(*args)

    async def _call_plain_async(self, *args: Any) -> Any:
        if self.spec.is_async:
            return await self._fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(self._fn, *args))

    def configure(self, **changes: Any) -> BatchingConfig:
        """Change settings live; validated first (ConfigError changes nothing). Thread-safe.

        Applied atomically: the next batch fired uses all of the new settings.
        """
        if not self.batchable:
            raise TypeError(f"{self.runner.name}.{self.name} is not batchable: nothing to set")
        with self._lock:  # held until the queue has it: two callers apply in order
            new = self.config.replace(**changes)
            if self._driver is not None:
                self._driver.configure(new)
            else:
                assert self._queue is not None
                self._queue.configure(new)  # nothing runs it yet: the first poll applies it
        return new

    def stats(self) -> Snapshot:
        """An immutable snapshot of the method's queue, batches and latencies. Thread-safe."""
        if self._queue is None:
            raise TypeError(f"{self.runner.name}.{self.name} is not batchable: it has no queue")
        if self._driver is None:  # nothing ran yet; the time is the runner's clock
            snap = self._queue.snapshot(self.runner.clock.now())
        else:
            snap = self._driver.snapshot()
        asked = self.config  # read after: a change made meanwhile shows as pending
        if snap.config != asked:  # configure()'s change waits for the next batch boundary
            snap = dataclasses.replace(snap, config_asked=asked)
        return snap

    def reset_stats(self) -> None:
        """Forget recorded traffic (counters, samples, batches). Thread-safe."""
        if self._queue is not None:
            if self._driver is None:
                self._queue.recorder.reset()
            else:
                self._driver.reset_stats()

    async def _aclose(self) -> None:
        if self._driver is not None:
            await self._driver.aclose()
        elif self._queue is not None:
            self._queue.close()

    def __repr__(self) -> str:
        kind = "batchable" if self.batchable else "plain"
        return f"<RunnerMethod {self.runner.name}.{self.name} ({kind})>"


class Runner:
    """Serve a Runnable: each batchable method gets a batch queue on the background loop.

    ``runnable`` is a Runnable class (instantiated once, with no arguments) or an
    instance. Config layers, highest first: :meth:`configure` > these arguments
    (``max_batch_size=...`` etc. for every batchable method, ``method_configs`` per
    method) > the config file's runner section > the decorator > the file's global
    section > defaults. ``config`` is a YAML path; without it ``$LABSERVE_CONFIG`` is read.
    ``clock`` is the runner's time (a monotonic clock by default): it stamps snapshots,
    batches and requests, and its drivers' timers run on it, so it must be monotonic in
    seconds like the background loop's.

    >>> import labserve, numpy as np
    >>> class Doubler(labserve.Runnable):
    ...     @labserve.method(batchable=True, max_batch_size=32, max_latency_ms=10)
    ...     def predict(self, x):
    ...         return x * 2
    >>> runner = labserve.Runner(Doubler, name="doubler")
    >>> runner.predict.run(np.ones((1, 3)))
    array([[2., 2., 2.]])
    >>> runner.stop()
    """

    def __init__(
        self,
        runnable: type[Runnable] | Runnable,
        *,
        name: str | None = None,
        config: str | os.PathLike[str] | None = None,
        method_configs: Mapping[str, Mapping[str, Any]] | None = None,
        loop: BackgroundLoop | None = None,
        clock: Clock | None = None,
        **batching: Any,
    ) -> None:
        cls = runnable if isinstance(runnable, type) else type(runnable)
        if not issubclass(cls, Runnable):
            raise TypeError(f"Runner needs a labserve.Runnable class or instance, got {runnable!r}")
        if not cls.methods:
            raise TypeError(f"{cls.__name__} has no @labserve.method methods to serve")
        self.name = name or cls.__name__.lower()
        self.instance: Runnable = runnable() if isinstance(runnable, type) else runnable
        self._bg = loop
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        """The runner's time (seconds, monotonic): snapshots, batch and request times. Its
        drivers' schedulers read it too, so it must agree with the loop's timers."""
        self._stopped = False
        self._lock = threading.Lock()
        self._hooked = False
        file = load_config_file(config)
        self.config_file: ConfigFile = file
        """The config file read (``config`` or ``$LABSERVE_CONFIG``; empty if none)."""
        # Settings only a generative method has (max_num_seqs, ...) go to those methods;
        # the ones both kinds mean alike (isolate_errors, max_queue_size,
        # request_timeout_ms) go to both. ``strategy`` names other choices on each side.
        generating = {k: batching.pop(k) for k in list(batching) if _generation_only(k)}
        generating |= {k: batching[k] for k in _SHARED if k in batching}
        arguments = BatchingLayer.from_mapping(batching, path="Runner ")
        method_configs = dict(method_configs or {})
        for method_name in method_configs:
            if method_name not in cls.methods:
                raise ValueError(
                    f"method_configs names {method_name!r}, which {cls.__name__} does not have "
                    f"(it has: {', '.join(cls.methods)})"
                )
        self.methods: dict[str, RunnerMethod] = {}
        self.generators: dict[str, GenerativeMethod] = {}
        """The generative methods (continuous batching), by name."""
        for method_name, spec in cls.methods.items():
            fn = getattr(self.instance, method_name)
            if spec.generation is not None:
                gen = _generation_config(
                    spec.generation,
                    file,
                    self.name,
                    {**generating, **method_configs.get(method_name, {})},
                )
                self.generators[method_name] = GenerativeMethod(self, spec, self.instance, gen)
                continue
            per_method = BatchingLayer.from_mapping(
                method_configs.get(method_name, {}), path=f"method_configs[{method_name!r}] "
            )
            cfg = BatchingConfig.from_layers(
                file.global_batching,
                spec.batching,
                file.for_runner(self.name),
                arguments,
                per_method,
            )
            self.methods[method_name] = RunnerMethod(self, spec, fn, cfg)
        served: dict[str, ServedMethod] = {**self.methods, **self.generators}
        for method_name, method in served.items():
            # ``runner.predict`` as a plain attribute: __getattr__ costs every call 0.4 µs.
            # The runner's own names win, as they do with __getattr__.
            if not hasattr(Runner, method_name) and method_name not in self.__dict__:
                self.__dict__[method_name] = method
        # A re-run cell's Runner of the same name replaces this one (and its server, load).
        session.track(self, "runner", self.name, self.stop)

    @property
    def bg(self) -> BackgroundLoop:
        """The background loop this runner lives on (labserve's own unless one was given)."""
        if self._bg is None:
            self._bg = background_loop()
        return self._bg

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopped

    def __getattr__(self, name: str) -> Any:
        for kind in ("methods", "generators"):
            served = self.__dict__.get(kind, {})
            if name in served:
                return served[name]
        raise AttributeError(f"runner {self.__dict__.get('name')!r} has no method {name!r}")

    def _method(self, name: str) -> RunnerMethod:
        try:
            return self.methods[name]
        except KeyError:
            raise KeyError(
                f"runner {self.name!r} has no method {name!r} (it has: {', '.join(self.methods)})"
            ) from None

    def configurable(self) -> dict[str, ServedMethod]:
        """The methods whose settings change live, by name: batchable ones, then generative."""
        return {**{n: m for n, m in self.methods.items() if m.batchable}, **self.generators}

    def configure(self, method: str, **changes: Any) -> Settings:
        """Change a method's settings live, from any thread; see RunnerMethod.configure.

        A generative method takes GenerationConfig settings (see GenerativeMethod.configure)
        and returns its GenerationConfig; a batchable one returns its BatchingConfig.
        ConfigError for a method the runner does not have; TypeError for a plain one.

        >>> runner.configure("predict", max_batch_size=64, strategy="fixed")  # doctest: +SKIP
        """
        served: ServedMethod | None = self.methods.get(method) or self.generators.get(method)
        if served is None:
            raise ConfigError(
                "method",
                method,
                f"a method of runner {self.name!r} "
                f"(it has: {', '.join([*self.methods, *self.generators])})",
            )
        return served.configure(**changes)

    def stats(self, method: str) -> Snapshot:
        """An immutable snapshot of one batchable method. Thread-safe."""
        return self._method(method).stats()

    def snapshots(self) -> list[Snapshot]:
        """Snapshots of every batchable method (for /stats, /metrics and dashboards)."""
        return [m.stats() for m in self.methods.values() if m.batchable]

    def generation_snapshots(self) -> list[GenerationSnapshot]:
        """Snapshots of every generative method (for /stats, /metrics and dashboards)."""
        return [g.stats() for g in self.generators.values()]

    def _started(self) -> None:
        with self._lock:
            if not self._hooked:
                self.bg.add_shutdown_hook(self._aclose)
                self._hooked = True

    async def _aclose(self) -> None:
        self._stopped = True
        await asyncio.gather(
            *(m._aclose() for m in self.methods.values()),
            *(g._aclose() for g in self.generators.values()),
        )

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse new requests, finish the queued ones (reason ``drain``). Idempotent.

        If that takes longer than ``timeout`` seconds, every caller still waiting (queued
        or in a running batch) gets RunnerStoppedError, and StopTimeoutError names the
        methods whose model calls are still running.

        From the loop thread, use ``await runner.aclose()``.
        """
        if self._bg is not None and self._bg.in_loop_thread():
            raise LoopThreadError("Runner.stop() blocks; on labserve's loop use `await aclose()`")
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            hooked = self._hooked
        session.forget(self)
        if hooked and self.bg.running:
            self.bg.remove_shutdown_hook(self._aclose)
            try:
                self.bg.run(self._aclose(), timeout=timeout)
            except TimeoutError:
                # Every caller was answered when the drain was cancelled; say which model
                # calls are still running (they cannot be interrupted).
                stuck = [
                    f"{self.name}.{m.name}"
                    for m in self.methods.values()
                    if m.batchable and m.stats().in_flight_batches
                ] + [f"{self.name}.{g.name}" for g in self.generators.values() if g.step_in_flight]
                raise StopTimeoutError(self.name, stuck, timeout) from None

    async def aclose(self) -> None:
        """Like :meth:`stop`, awaitable from any running event loop."""
        self._stopped = True
        session.forget(self)
        if self._hooked:
            self.bg.remove_shutdown_hook(self._aclose)
            if self.bg.in_loop_thread():
                await self._aclose()
            else:  # the drivers live on labserve's loop: drain them there
                await asyncio.wrap_future(self.bg.submit(self._aclose()))

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "ready"
        kinds = {n: "batchable" if m.batchable else "plain" for n, m in self.methods.items()}
        kinds |= {n: "generative" for n in self.generators}
        return f"<Runner {self.name!r} methods={kinds} {state}>"
