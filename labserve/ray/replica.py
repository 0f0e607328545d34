"""One Ray Serve replica: a labserve Runner inside, fed by the proxy and by handles.

Each replica batches with labserve's own queue, strategies, caps, latency target and
overload rule (a :class:`labserve.Runner`), takes live config through Ray Serve's
``reconfigure(user_config)`` (so a replica restarted by Ray gets the config in force), and
reports its snapshots to the application's stats board.

The Runner's drivers live on the event loop Ray Serve runs the replica's code on (the one
that builds it and answers its requests), not on a loop thread of labserve's own: a request
goes straight into the batch queue and its caller is answered there, with no hand-off
between two loop threads either way (py-spy behind Ray's proxy, 2026-12-02: that hop was the
largest item of labserve's own code in the replica). A synchronous model still runs in a
worker thread, as ``@serve.batch``'s ``asyncio.to_thread`` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import ray
from ray import serve
from ray.exceptions import RayActorError, RayTaskError
from starlette.requests import Request
from starlette.responses import Response

from labserve.base.errors import LabServeError, ServerError
from labserve.generation.api import Finish, GenerateRequest
from labserve.metrics.snapshot import Snapshot
from labserve.ray.http import BoardBackend, Routes, ready_together
from labserve.ray.spec import BOARD_NAMESPACE, ReplicaSpec, board_name
from labserve.runtime.loop import BackgroundLoop
from labserve.runtime.runner import Runner
from labserve.server.core import HttpCore
from labserve.server.exchange import typed_call
from labserve.server.state import ServerState

__all__ = ["Replica", "replica_class"]

log = logging.getLogger("labserve.ray")

_IN_FORCE_WAIT_S = 1.0
"""How long reconfigure waits for a new config to be in force before reporting anyway."""


class _HostLoop(BackgroundLoop):
    """The running event loop of the thread that builds it, with worker threads of its own.

    A BackgroundLoop that owns no thread: :meth:`start` has nothing to start and
    :meth:`stop` runs the shutdown hooks (from another thread) and joins the workers, but
    never stops the loop, which is Ray Serve's. Thread-safe as BackgroundLoop is.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._loop = asyncio.get_running_loop()
        self._host = threading.current_thread()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            4, thread_name_prefix=f"{name}-worker"
        )

    @property
    def running(self) -> bool:
        """True while the host loop runs."""
        return self._loop is not None and self._loop.is_running()

    def in_loop_thread(self) -> bool:
        """True when called from the host loop's thread."""
        return threading.current_thread() is self._host

    def start(self) -> None:
        """Nothing to start: the host loop runs already."""

    def stop(self, timeout: float = 10.0) -> None:
        """Drain (shutdown hooks) and join the workers; the host loop keeps running."""
        with self._lock:
            loop, executor = self._loop, self._executor
            hooks, self._shutdown_hooks = list(self._shutdown_hooks), []
            self.closing = True
        if loop is not None and hooks and not self.in_loop_thread() and loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(_drain(hooks), loop).result(timeout)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass  # stop anyway, as BackgroundLoop.stop does
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


async def _drain(hooks: list[Any]) -> None:
    for hook in hooks:
        await hook()


class Replica:
    """The deployment's class; :func:`replica_class` adds one method per Runnable method.

    Ray Serve builds it once per replica. Its methods run on the replica's event loop
    (async) or Serve's threads; the Runner's doors are thread-safe.
    """

    def __init__(self, spec: ReplicaSpec) -> None:
        self.spec = spec
        # Ray Serve builds the replica on the loop that runs its requests: the drivers too.
        self._host = _HostLoop(f"labserve-ray-{spec.runner}")
        self._closing: asyncio.Task[None] | None = None
        self.runner = Runner(
            spec.make(), name=spec.runner, loop=self._host, method_configs=spec.generation
        )
        for m in self.runner.methods.values():
            if m.batchable:
                m.start()  # the loop and drivers now, not in the first request's latency
        for g in self.runner.generators.values():
            g.start_driver()  # and each generative method's (its KV pool is allocated here)
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self._board = ray.get_actor(board_name(spec.app), namespace=BOARD_NAMESPACE)
        state = ServerState(
            runners={spec.runner: self.runner},
            token=spec.token,
            token_everywhere=spec.token_everywhere,
            max_body_bytes=spec.max_body_bytes,
            allow_origins=spec.allow_origins,
            allow_hosts=spec.allow_hosts,
        )
        backend = BoardBackend(
            state,
            stats=self._stats,
            merged=self._merged,
            configure=self._configure,
            merged_generation=self._merged_generation,
        )
        self._interval_s = spec.stream_interval_ms / 1000.0
        self.http = Routes(HttpCore(state, backend), interval_s=self._interval_s)
        self._stop = threading.Event()
        self._reporting = False
        self._reset_epoch: int | None = None
        self._pusher = threading.Thread(
            target=self._push_loop, name=f"labserve-ray-push-{spec.runner}", daemon=True
        )

    def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        """Ray Serve's live config: ``{"methods": ..., "generation": ..., "reset_epoch": n}``.

        Each batchable method's new settings take effect at its next batch boundary, each
        generative method's at its next step. A new ``reset_epoch`` (not the first one
        seen: a replica Ray starts later begins fresh) starts every method's counts over.
        """
        epoch = int(user_config.get("reset_epoch", 0))
        if self._reset_epoch is not None and epoch != self._reset_epoch:
            for m in self.runner.configurable().values():
                m.reset_stats()
        self._reset_epoch = epoch
        for method, settings in dict(user_config.get("generation", {})).items():
            self.runner.configure(method, **settings)
        asked = {
            method: self.runner.configure(method, **settings)
            for method, settings in dict(user_config.get("methods", {})).items()
        }
        # Report once the new config is in force (the next batch boundary: at once when
        # idle, as a new replica is), so no view shows a config the replica is leaving.
        deadline = time.monotonic() + _IN_FORCE_WAIT_S
        while time.monotonic() < deadline and any(
            self.runner.stats(m).config != c for m, c in asked.items()
        ):
            time.sleep(0.002)
        self.push()
        if not self._reporting:
            # Reporting starts once the deployed config is asked for (Serve calls
            # reconfigure right after __init__): no view of the decorator's alone.
            self._reporting = True
            self._pusher.start()

    def snapshots(self) -> list[Snapshot]:
        """This replica's snapshots, one per batchable method."""
        return self.runner.snapshots()

    def record_routing_stats(self) -> dict[str, int]:
        """Serve's routing stats (polled every second by a labserve router): load and KV.

        The sums over the generative methods of running and waiting sequences and KV
        blocks used and held (``labserve.ray.router`` reads them).
        """
        snaps = self.runner.generation_snapshots()
        return {
            "running": sum(s.num_running for s in snaps),
            "waiting": sum(s.num_waiting for s in snaps),
            "kv_blocks_used": sum(s.kv_blocks_used for s in snaps),
            "kv_blocks_total": sum(s.kv_blocks_total or s.config.num_kv_blocks for s in snaps),
        }

    def push(self) -> None:
        """Send this replica's snapshots to the board (fire and forget)."""
        self._board.put.remote(
            self.replica_id, self.runner.snapshots(), self.runner.generation_snapshots()
        )

    def _push_loop(self) -> None:
        while not self._stop.wait(self.spec.push_interval_s):
            try:
                self.push()
            except Exception:  # the board is gone (the app is being deleted): stop reporting
                log.info("replica %s: the stats board is gone", self.replica_id)
                return

    async def _stats(self) -> dict[str, Any]:
        self.push()  # this replica's latest, ahead of the board's read (one actor: in order)
        payload: dict[str, Any] = await self._ask(self._board.payload.remote())
        return payload

    async def _merged(self) -> list[Snapshot]:
        self.push()
        merged: list[Snapshot] = await self._ask(self._board.merged.remote())
        return merged

    async def _merged_generation(self) -> list[Any]:
        self.push()
        merged: list[Any] = await self._ask(self._board.merged_generation.remote())
        return merged

    async def _configure(self, method: str, changes: dict[str, Any]) -> dict[str, Any]:
        configs: dict[str, Any] = await self._ask(self._board.configure.remote(method, changes))
        return configs

    async def _ask(self, ref: Any) -> Any:
        """The board's answer; its typed error as such; ServerError if the board is gone."""
        try:
            return await ref
        except RayTaskError as exc:
            if isinstance(exc.cause, LabServeError):
                raise exc.cause from None
            raise
        except RayActorError:
            # The board lives as long as the process that deployed (its owner): a driver
            # that exited leaves the replicas serving but nobody to gather or redeploy.
            raise ServerError(
                f"the stats board of application {self.spec.app!r} is gone (the process that "
                "deployed it exited): /stats, /metrics and PATCH /config need it"
            ) from None

    async def call(self, method: str, *args: Any, **params: Any) -> Any:
        """One request of ``method`` through the batch queue, or one whole generation."""
        generator = self.runner.generators.get(method)
        if generator is not None:
            return await generator.async_run(*args, **params)
        return await typed_call(self.runner.methods[method], *args)

    async def stream(self, method: str, prompt: Any, params: dict[str, Any]) -> AsyncIterator[Any]:
        """One generation of ``method``, streamed: its text pieces, then its Finish.

        For ``handle.options(stream=True).stream.remote(...)``; a refusal or a later error
        is raised by the iteration (typed). Closing the stream early cancels the sequence.
        """
        stream = self.runner.generators[method].astream(prompt, **params)
        try:
            async for piece in stream:
                yield piece
            yield stream.finish
        finally:
            await stream.aclose()

    async def stream_request(
        self, method: str, request: GenerateRequest
    ) -> AsyncIterator[list[str] | Finish]:
        """One OpenAI route's generation, for the ingress: lists of text pieces, then the Finish.

        ``request`` is the route's checked request; it goes in by the door the kernel
        server's routes use (``start``), so answers and refusals are the kernel server's.
        The pieces ready together go as one list: each item Serve streams to the ingress
        costs this loop an object and a message (see :func:`ready_together`).
        """
        stream = self.runner.generators[method].start(request)
        async with contextlib.aclosing(ready_together(stream, self._interval_s)) as batches:
            async for pieces in batches:
                yield pieces
        finish = stream.finish
        if finish is None:
            raise ServerError("the generation ended without saying how it ended")
        yield finish

    async def __call__(self, request: Request) -> Response:
        """An HTTP request from Ray Serve's proxy."""
        return await self.http(request)

    def __del__(self) -> None:
        # Ray Serve's documented shutdown hook for a replica (it calls __del__ on a
        # graceful stop, on the replica's loop, once its requests are done): drain the
        # queue, stop reporting.
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        runner, host = getattr(self, "runner", None), getattr(self, "_host", None)
        if runner is None or host is None:
            return
        if host.in_loop_thread():  # the drivers live here: drain without blocking it
            if host.running and self._closing is None:
                self._closing = asyncio.ensure_future(runner.aclose(), loop=host.loop)
            return
        runner.stop(timeout=5.0)
        host.stop(timeout=5.0)


def replica_class(methods: tuple[str, ...]) -> type[Replica]:
    """A Replica subclass with an async method per served method (for DeploymentHandles)."""

    def caller(name: str) -> Callable[..., Any]:
        async def run(self: Replica, *args: Any, **params: Any) -> Any:
            return await self.call(name, *args, **params)

        run.__name__ = run.__qualname__ = name
        run.__doc__ = f"One request of ``{name}``, batched with the others."
        return run

    return type("LabServeReplica", (Replica,), {m: caller(m) for m in methods})
