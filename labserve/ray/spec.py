"""What a replica is built from: the Runnable, its resolved configs, the HTTP guards.

Resolved on the driver (the notebook or the ``labserve`` command) from the same layers a
:class:`labserve.Runner` reads, so a replica on another node needs neither the config
file nor the driver's environment.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from labserve.config.batching import BatchingConfig, BatchingLayer
from labserve.config.file import load_config_file
from labserve.config.generation import GENERATION_SETTINGS, GenerationConfig
from labserve.runtime.runnable import Runnable
from labserve.runtime.runner import Runner, RunnerMethod

__all__ = [
    "BOARD_NAMESPACE",
    "RESERVED",
    "ReplicaSpec",
    "RunnableSource",
    "board_name",
    "generation_configs",
    "max_ongoing_requests",
    "resolve",
    "split_settings",
]

RunnableSource = type[Runnable] | Runnable | Callable[[], Runnable] | Runner | RunnerMethod
"""What :func:`labserve.ray.deploy` takes: a Runnable class, an instance, a factory
(a zero-argument callable returning an instance), a lab Runner or one of its methods."""

BOARD_NAMESPACE = "labserve"
"""The Ray namespace of the stats boards (replicas run in Serve's: names must be explicit)."""


def board_name(app: str) -> str:
    """The named actor holding application ``app``'s stats board and plan."""
    return f"labserve-stats-{app}"


RESERVED = frozenset(
    {
        # The replica's own attributes (tests/scale checks the list against the class)...
        "call",
        "http",
        "push",
        "replica_id",
        "runner",
        "snapshots",
        "spec",
        "stream",
        "stream_request",
        # ...and the methods Ray Serve looks for on a deployment.
        "check_health",
        "reconfigure",
        "record_routing_stats",
    }
)
"""Names of the replica's own methods: a Runnable method may not take them."""


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything a replica needs to build its Runner and serve HTTP. Immutable, picklable."""

    app: str
    """The Ray Serve application's name (the stats board is named after it)."""
    runner: str
    """The runner's name: the HTTP routes' ``{name}``."""
    make: Callable[[], Runnable | type[Runnable]]
    """Builds what the replica's Runner serves (called once per replica)."""
    methods: tuple[str, ...]
    """Every served method, batchable or not."""
    token: str = ""
    """Needed by PATCH /config (and by every route when ``token_everywhere``); empty: none."""
    token_everywhere: bool = False
    max_body_bytes: int = 64 * 1024 * 1024
    allow_hosts: frozenset[str] = frozenset()
    allow_origins: frozenset[str] = frozenset()
    stream_interval_ms: float = 0.0
    """A stream's text goes to the proxy (or the ingress) at most once per this many ms
    (0: each piece at once, or the pieces ready together): fewer items for Serve to carry."""
    push_interval_s: float = 0.25
    """How often each replica sends its snapshots to the stats board."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    generation: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Each generative method's config as deployed: the replica's Runner starts with it,
    since its start-time settings (``num_kv_blocks``, ...) size the KV pool at start and a
    later ``reconfigure`` may not change them."""


def _constant(obj: Runnable) -> Callable[[], Runnable]:
    def make() -> Runnable:
        return obj

    return make


def resolve(
    source: RunnableSource,
    *,
    name: str | None,
    config: str | os.PathLike[str] | None,
    batching: Mapping[str, Any],
) -> tuple[
    str, Callable[[], Runnable | type[Runnable]], dict[str, BatchingConfig], tuple[str, ...]
]:
    """The runner name, a maker of the Runnable, every batchable method's config, the methods.

    Layers, highest first, as a Runner's: a lab runner's live config (when ``source`` is a
    Runner or RunnerMethod) > ``batching`` arguments > the file's runner section > the
    decorator > the file's global section > defaults.
    """
    live: dict[str, BatchingConfig] = {}
    if isinstance(source, RunnerMethod):
        source = source.runner
    if isinstance(source, Runner):
        live = {m.name: m.config for m in source.methods.values() if m.batchable}
        name = name or source.name
        cls: type[Runnable] = type(source.instance)
        make: Callable[[], Runnable | type[Runnable]] = _constant(source.instance)
    elif isinstance(source, type) and issubclass(source, Runnable):
        cls = source
        make = _constant_class(source)
    elif isinstance(source, Runnable):
        cls, make = type(source), _constant(source)
    elif callable(source):
        built = source()
        if not isinstance(built, Runnable):
            raise TypeError(
                f"the factory {source!r} must return a labserve.Runnable, got {built!r}"
            )
        cls, make = type(built), cast("Callable[[], Runnable]", source)
    else:
        raise TypeError(
            "deploy() needs a labserve.Runnable class, instance or factory, a Runner or a "
            f"RunnerMethod, got {source!r}"
        )
    if not cls.methods:
        raise TypeError(f"{cls.__name__} has no @labserve.method methods to serve")
    clash = RESERVED & set(cls.methods)
    if clash:
        raise TypeError(
            f"{cls.__name__} names a method {sorted(clash)[0]!r}, which Ray replicas use"
        )
    name = name or cls.__name__.lower()
    file = load_config_file(config)
    arguments = BatchingLayer.from_mapping(batching, path="deploy ")
    configs = {
        m: live.get(m)
        or BatchingConfig.from_layers(
            file.global_batching, spec.batching, file.for_runner(name), arguments
        )
        for m, spec in cls.methods.items()
        if spec.batchable
    }
    return name, make, configs, tuple(cls.methods)


def _constant_class(cls: type[Runnable]) -> Callable[[], type[Runnable]]:
    def make() -> type[Runnable]:
        return cls

    return make


_SHARED = ("isolate_errors", "max_queue_size", "request_timeout_ms")
"""Settings batchable and generative methods both have, with one meaning (as Runner's)."""


def split_settings(settings: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``deploy(**settings)`` split as a Runner splits them: (batching, generation).

    A setting only generative methods have (``max_num_seqs``, ...) goes to them alone; the
    shared ones go to both.
    """
    batching = dict(settings)
    generating = {
        k: batching.pop(k)
        for k in list(batching)
        if k in GENERATION_SETTINGS and k not in BatchingConfig.__dataclass_fields__
    }
    generating |= {k: batching[k] for k in _SHARED if k in batching}
    return batching, generating


def generation_configs(
    source: RunnableSource,
    *,
    name: str,
    config: str | os.PathLike[str] | None,
    settings: Mapping[str, Any],
) -> dict[str, GenerationConfig]:
    """Every generative method's config, layered as a Runner's (or a lab Runner's live one).

    Highest first: a lab runner's live config > ``settings`` > the file's ``generation``
    section for ``name`` > the decorator.
    """
    if isinstance(source, RunnerMethod):
        source = source.runner
    if isinstance(source, Runner):
        return {m: g.config for m, g in source.generators.items()}
    cls = source if isinstance(source, type) else type(source)
    if not (isinstance(cls, type) and issubclass(cls, Runnable)):
        cls = type(cast("Callable[[], Runnable]", source)())
    file = load_config_file(config)
    section = file.generation_for(name)
    path = f"runners.{name}.generation."
    return {
        m: spec.generation.with_changes(section, path=path, source=file.source).replace(**settings)
        for m, spec in cls.methods.items()
        if spec.generation is not None
    }


def generation_ongoing(configs: Mapping[str, GenerationConfig]) -> int:
    """Requests a replica takes at once for its generative methods (each stream is one).

    Every running sequence (``max_num_seqs``) plus a waiting room of four times that, at
    least 256, never more than the method's ``max_queue_size`` (what is refused beyond it
    is refused by labserve, typed, not held by Serve's router).
    """
    return sum(
        c.max_num_seqs + min(c.max_queue_size, max(256, 4 * c.max_num_seqs))
        for c in configs.values()
    )


def max_ongoing_requests(configs: Mapping[str, BatchingConfig]) -> int:
    """How many requests a replica takes at once (Ray Serve's ``max_ongoing_requests``).

    Serve's default, 5, would cap every batch at 5; and what a replica refuses, Serve's
    router holds at the caller and retries with backoff, outside labserve's queue and its
    overload rule. So: room for four rounds of full batches per method, at least 256 (a
    burst waits in labserve's queue, where the tuned rules apply), never more than the
    queue holds plus its running batches.
    """
    per_method = [
        min(
            c.max_queue_size + c.max_batch_size * c.max_concurrent_batches,
            max(256, 4 * c.max_batch_size * c.max_concurrent_batches),
        )
        for c in configs.values()
    ]
    return sum(per_method) if per_method else 256
