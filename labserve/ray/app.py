"""``deploy()``: a labserve Runnable, tuned in the lab, as a Ray Serve application.

>>> import labserve, labserve.ray                                   # doctest: +SKIP
>>> app = labserve.ray.deploy(labserve.Runner(Model), num_replicas=2)  # doctest: +SKIP
>>> app.predict(x)                       # through a DeploymentHandle, batched  # doctest: +SKIP
>>> app.configure("predict", max_batch_size=64)   # every replica, live      # doctest: +SKIP
>>> app.stats()                          # merged, with each replica's view    # doctest: +SKIP
>>> app.stop()                                                         # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import secrets
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import ray
from ray import serve
from ray.exceptions import RayTaskError
from ray.serve.handle import DeploymentHandle

from labserve.base.errors import ConfigError, LabServeError
from labserve.config.batching import BatchingConfig
from labserve.config.generation import GenerationConfig
from labserve.generation.stats import GenerationSnapshot
from labserve.lab.generation.sources import HttpGenerationSource
from labserve.metrics.snapshot import Snapshot
from labserve.ray.board import StatsBoard
from labserve.ray.generation.calls import GenerativeCaller, in_event_loop
from labserve.ray.plan import Plan
from labserve.ray.router import router_config
from labserve.ray.source import RaySource
from labserve.ray.spec import (
    BOARD_NAMESPACE,
    ReplicaSpec,
    RunnableSource,
    board_name,
    generation_configs,
    resolve,
    split_settings,
)
from labserve.server.state import host_names, origin_names

__all__ = ["RayApp", "deploy"]


def deploy(
    runnable: RunnableSource,
    *,
    name: str | None = None,
    app_name: str | None = None,
    config: str | os.PathLike[str] | None = None,
    num_replicas: int | None = 1,
    autoscaling_config: Mapping[str, Any] | None = None,
    num_cpus: float = 0.5,
    max_ongoing_requests: int | None = None,
    route_prefix: str | None = "/",
    token: str | None = None,
    token_everywhere: bool = False,
    max_body_bytes: int = 16 * 1024 * 1024,
    allow_hosts: str | Iterable[str] = (),
    allow_origin: str | Iterable[str] = (),
    ray_actor_options: Mapping[str, Any] | None = None,
    deployment_options: Mapping[str, Any] | None = None,
    router: str | None = None,
    router_options: Mapping[str, Any] | None = None,
    stream_interval_ms: float = 0.0,
    **batching: Any,
) -> RayApp:
    """Deploy ``runnable`` on the running Ray cluster (``ray.init()`` first) as an application.

    Args:
        runnable: a Runnable class, instance or zero-argument factory; or a lab Runner (or
            one of its methods), whose live config (``configure()`` state) is deployed.
        name: the runner's name in routes (``/runners/{name}/...``, the v2 model name).
        app_name: the Ray Serve application's name (default: ``name``).
        config: a BentoML-shaped YAML config file (or ``$LABSERVE_CONFIG``), read here.
        num_replicas: replicas, each with its own labserve Runner; or
        autoscaling_config: Ray Serve's autoscaling config, passed through.
        num_cpus: CPUs each replica reserves (fractional, so replicas fit small machines).
        max_ongoing_requests: requests a replica takes at once; default: from the caps
            (Ray Serve's own default, 5, would cap every batch, and the sequences a
            replica runs, at 5): room for full batches, and for ``max_num_seqs`` running
            sequences plus a waiting room.
        route_prefix: where Ray's proxy serves the routes (None: handles only).
        token: needed by PATCH /config (and by every route with ``token_everywhere``);
            generated when not given.
        token_everywhere: every route needs the token (a proxy bound off loopback).
        max_body_bytes: the largest request body; larger ones get 413.
        allow_hosts: Host names served besides loopback names ("*": any).
        allow_origin: origins of pages allowed to call the routes ("*": any).
        ray_actor_options: more of Ray's actor options for each replica.
        deployment_options: any other ``serve.deployment`` option, passed through.
        router: which replica takes each request, by labserve's router
            (``labserve.generation.routing``): ``round_robin``, ``power_of_two``,
            ``least_kv``, ``prefix`` or ``prefix_affinity``; None: Ray Serve's own (power
            of two choices on queue lengths it probes). ``labserve.ray.router`` says what
            each sees of a request and how fresh. The prefix routers put an ingress
            (a second Serve application, ``<app>-ingress`` at ``<route_prefix>/v1``) in
            front of the OpenAI routes, so that they see an HTTP request's prompt. A
            process's handles keep the router they were made with for a deployment
            (Serve 2.60 builds it once): to try another in the same process, deploy
            under another ``name``.
        router_options: the router's options (``make_router``'s); a prefix router's
            ``block_size`` defaults to the generative method's.
        stream_interval_ms: a streamed generation's text leaves its replica at most once
            per this many ms (its first piece at once), several pieces as one item: each
            item Serve carries costs CPU on the replica, the ingress and the proxy (Ray
            Serve LLM's ``stream_batching_interval_ms``, 50 by default). 0: each piece
            as soon as it is made (those ready together as one).
        **batching: BatchingConfig settings for every batchable method, and
            GenerationConfig ones (``max_num_seqs``, ...) for every generative one (as
            Runner's).

    Returns once every replica runs. Blocking; call from the driver, not a replica.

    Raises:
        ConfigError: a bad setting, or an unknown router or router option (before
            anything is deployed).
    """
    if not ray.is_initialized():
        raise RuntimeError("labserve.ray.deploy() needs a running Ray: call ray.init() first")
    if (
        isinstance(stream_interval_ms, bool)
        or not isinstance(stream_interval_ms, (int, float))
        or not 0 <= stream_interval_ms < math.inf
    ):
        raise ConfigError("stream_interval_ms", stream_interval_ms, "a number >= 0 (ms)")
    batching, generating = split_settings(batching)
    runner, make, configs, methods = resolve(runnable, name=name, config=config, batching=batching)
    generation = generation_configs(runnable, name=runner, config=config, settings=generating)
    spec = ReplicaSpec(
        app=app_name or runner,
        runner=runner,
        make=make,
        methods=methods,
        token=token or secrets.token_urlsafe(24),
        token_everywhere=token_everywhere,
        max_body_bytes=max_body_bytes,
        allow_hosts=host_names(allow_hosts),
        allow_origins=origin_names(allow_origin),
        generation={m: c.as_dict() for m, c in generation.items()},
        stream_interval_ms=float(stream_interval_ms),
    )
    plan = Plan(
        spec=spec,
        configs=configs,
        version=uuid.uuid4().hex,
        route_prefix=route_prefix,
        num_replicas=num_replicas if autoscaling_config is None else None,
        autoscaling_config=autoscaling_config,
        num_cpus=num_cpus,
        max_ongoing=max_ongoing_requests,
        ray_actor_options=dict(ray_actor_options or {}),
        options=dict(deployment_options or {}),
        generation=generation,
        router=router,
        router_options=_router_options(router, router_options, generation),
    )
    if router is not None:
        router_config(router, plan.router_options, tuple(generation))  # ConfigError now
    board: Any = (
        ray.remote(StatsBoard)
        .options(name=board_name(spec.app), namespace=BOARD_NAMESPACE, num_cpus=0)
        .remote(plan)
    )
    try:
        ray.get(board.deploy.remote())
    except BaseException:
        ray.kill(board)
        raise
    return RayApp(plan, board)


def _router_options(
    router: str | None,
    options: Mapping[str, Any] | None,
    generation: Mapping[str, GenerationConfig],
) -> dict[str, Any]:
    """The router's options, a prefix router's block size the generative method's."""
    chosen = dict(options or {})
    if router in ("prefix", "prefix_affinity") and generation and "block_size" not in chosen:
        chosen["block_size"] = next(iter(generation.values())).block_size
    return chosen


class RayApp:
    """A deployed labserve application: its handle, live config, merged stats, and stop.

    Thread-safe: every method is a call to Ray (the handle, the stats board).
    """

    def __init__(self, plan: Plan, board: Any) -> None:
        self.name = plan.spec.app
        self.runner = plan.spec.runner
        self.token = plan.spec.token
        self.route_prefix = plan.route_prefix
        self.router = plan.router
        """labserve's request router by name; None: Ray Serve's own."""
        self.ingress = plan.ingress
        """The Serve application in front of the OpenAI routes (``/v1``) when the router
        reads the prompt (``labserve.ray.generation.ingress``); None: no second hop."""
        self.methods: tuple[str, ...] = plan.spec.methods
        """The served methods: ``app.<method>(*args)`` calls one through the handle."""
        self.batchable: tuple[str, ...] = tuple(plan.configs)
        """The batchable methods (each with its batch queue on every replica)."""
        self.generators: tuple[str, ...] = tuple(plan.generation)
        """The generative methods (continuous batching on every replica):
        ``app.generate(prompt, ...)`` gives a Completion, ``app.generate.stream(...)``
        the text as it comes."""
        self._board = board
        self._stopped = False
        self.handle: DeploymentHandle[Any] = serve.get_deployment_handle(self.runner, self.name)
        """Ray Serve's handle: ``app.handle.predict.remote(x)`` returns a response to await
        or ``.result()``; every call is batched by the replica's labserve queue."""

    def __getattr__(self, name: str) -> _Caller | GenerativeCaller:
        if name in self.__dict__.get("generators", ()):
            return GenerativeCaller(self.handle, name)
        if name in self.__dict__.get("methods", ()):
            return _Caller(self.handle, name)
        raise AttributeError(f"application {self.__dict__.get('name')!r} has no method {name!r}")

    def url(self, host: str = "127.0.0.1", port: int = 8000) -> str:
        """Where Ray's proxy serves this application (its host and port are Serve's)."""
        return f"http://{host}:{port}{(self.route_prefix or '').rstrip('/')}"

    def call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """One request of ``method`` through the handle; blocks for its result or typed error."""
        return _Caller(self.handle, method)(*args, timeout_s=timeout_s)

    def configure(self, method: str, **changes: Any) -> BatchingConfig | GenerationConfig:
        """Change ``method``'s settings on every replica, live; returns the new config.

        Validated first (ConfigError changes nothing; a generative method's start-time
        settings, which size its KV memory, are refused). Through Ray Serve's
        ``user_config``: each running replica applies it at its next batch boundary (a
        generative method's at its next step), and a replica Ray restarts begins with it.
        Blocks until Serve has the new config.
        """
        try:
            configs = ray.get(self._board.configure.remote(method, dict(changes)))
        except RayTaskError as exc:
            if isinstance(exc.cause, LabServeError):
                raise exc.cause from None
            raise
        if method in self.generators:
            return GenerationConfig(**configs[self.runner][method])
        return BatchingConfig(**configs[self.runner][method])

    def configs(self) -> dict[str, BatchingConfig]:
        """Every batchable method's config as deployed."""
        raw = ray.get(self._board.configs.remote())[self.runner]
        return {m: BatchingConfig(**c) for m, c in raw.items() if m in self.batchable}

    def generation_configs(self) -> dict[str, GenerationConfig]:
        """Every generative method's config as deployed."""
        raw = ray.get(self._board.configs.remote())[self.runner]
        return {m: GenerationConfig(**c) for m, c in raw.items() if m in self.generators}

    def generation_snapshots(self) -> list[GenerationSnapshot]:
        """One merged snapshot per generative method (exact counts; see its merge).

        Percentiles of TTFT, ITL, TPOT and e2e from the replicas' summed histograms, since
        the last reset.
        """
        snaps: list[GenerationSnapshot] = ray.get(self._board.merged_generation.remote())
        return snaps

    def replica_generation_snapshots(self) -> dict[str, list[GenerationSnapshot]]:
        """Each replica's own generation snapshots, by replica id."""
        views: dict[str, list[GenerationSnapshot]] = ray.get(
            self._board.per_replica_generation.remote()
        )
        return views

    def reset_stats(self) -> None:
        """Start every replica's counts over, live (through ``user_config``, as a config change).

        Blocks until Serve has reached every replica; a replica Ray starts later begins fresh.
        """
        ray.get(self._board.reset_stats.remote())

    def watch(self) -> tuple[dict[str, BatchingConfig], dict[str, dict[str, Snapshot]], set[str]]:
        """One look: the configs asked, each method's snapshot by replica, the stale replicas."""
        found: tuple[dict[str, BatchingConfig], dict[str, dict[str, Snapshot]], set[str]] = ray.get(
            self._board.watch.remote()
        )
        return found

    def method_sources(self, *, proxy_url: str | None = None) -> list[RaySource]:
        """Each batchable method as a source for a dashboard (``labserve.method_sources(app)``).

        ``proxy_url``: where Ray's proxy serves this application, for load (default:
        :meth:`url`, Serve's default port 8000).
        """
        return [RaySource(self, m, proxy_url or self.url()) for m in self.batchable]

    def generation_sources(self, *, proxy_url: str | None = None) -> list[HttpGenerationSource]:
        """Each generative method as a source for ``GenerationDashboard(app)``.

        Through Ray's proxy at ``proxy_url`` (default: :meth:`url`, Serve's default port
        8000): the merged snapshot of ``/stats``, live changes with the token, load through
        the proxy, and each replica's own snapshot (``/stats``'s ``replicas``: the
        dashboard's row per replica).
        """
        base = proxy_url or self.url()
        model = self.runner if len(self.generators) == 1 else None
        return [
            HttpGenerationSource(
                base, self.runner, m, model=model or f"{self.runner}.{m}", token=self.token
            )
            for m in self.generators
        ]

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` ran."""
        return self._stopped

    def stats(self) -> dict[str, Any]:
        """``/stats``: merged per method (exact counts and histograms) and per replica."""
        payload: dict[str, Any] = ray.get(self._board.payload.remote())
        return payload

    def snapshots(self) -> list[Snapshot]:
        """One merged snapshot per batchable method (for a dashboard, or Prometheus)."""
        snaps: list[Snapshot] = ray.get(self._board.merged.remote())
        return snaps

    def replica_snapshots(self) -> dict[str, list[Snapshot]]:
        """Each replica's own snapshots, by replica id."""
        views: dict[str, list[Snapshot]] = ray.get(self._board.per_replica.remote())
        return views

    def stop(self) -> None:
        """Delete the application (replicas drain their queues) and its board. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self.ingress is not None:
                serve.delete(self.ingress)
            serve.delete(self.name)
        finally:
            ray.kill(self._board)

    def __enter__(self) -> RayApp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<RayApp {self.name!r} runner={self.runner!r}{' stopped' if self._stopped else ''}>"


class _Caller:
    """``app.predict(x)``: one blocking call of a method through the handle.

    From a thread that runs an event loop (a notebook cell: ipykernel's main thread runs
    one), Ray refuses to block; the wait then happens on a helper thread, as a blocking
    call in a cell does anywhere else.
    """

    def __init__(self, handle: DeploymentHandle[Any], method: str) -> None:
        self._handle = handle
        self._method = method

    def __call__(self, *args: Any, timeout_s: float | None = None) -> Any:
        response = getattr(self._handle, self._method).remote(*args)
        try:
            if not in_event_loop():
                return response.result(timeout_s=timeout_s)
            with concurrent.futures.ThreadPoolExecutor(1, "labserve-ray-call") as pool:
                return pool.submit(response.result, timeout_s=timeout_s).result()
        except RayTaskError as exc:
            if isinstance(exc.cause, LabServeError):
                raise exc.cause from None
            raise
