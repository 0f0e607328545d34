"""The plan of an application: what to build, with which options; run to (re)deploy it.

A live config change is a new plan with a new ``user_config``, run again under the same
code version: Ray Serve then calls ``reconfigure`` on every running replica instead of
replacing them, and a replica it starts later gets the same ``user_config``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from labserve.base.errors import ConfigError
from labserve.config.batching import BatchingConfig
from labserve.config.generation import PAGED_START_SETTINGS, GenerationConfig
from labserve.ray.generation.ingress import Ingress, ingress_app, ingress_route
from labserve.ray.replica import replica_class
from labserve.ray.router import reads_prompt, router_config
from labserve.ray.spec import ReplicaSpec, generation_ongoing, max_ongoing_requests

__all__ = ["Plan"]


@dataclass(frozen=True)
class Plan:
    """One application: its replica spec, configs, Serve options and route. Immutable."""

    spec: ReplicaSpec
    configs: Mapping[str, BatchingConfig]
    version: str
    """The code version Serve compares: fixed, so a new config is a lightweight update."""
    route_prefix: str | None = "/"
    num_replicas: int | str | None = 1
    autoscaling_config: Mapping[str, Any] | None = None
    num_cpus: float = 0.5
    """CPUs each replica reserves (Ray's default, 1, fits only two replicas on 2 CPUs)."""
    max_ongoing: int | None = None
    """Ray Serve's max_ongoing_requests; None: derived from the caps."""
    ray_actor_options: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    """Any other ``serve.deployment`` option, passed through."""
    reset_epoch: int = 0
    """Bumped to reset every replica's counts (a replica seeing a new epoch resets)."""
    generation: Mapping[str, GenerationConfig] = field(default_factory=dict)
    """Every generative method's config (continuous batching on each replica)."""
    router: str | None = None
    """labserve's request router by name (``labserve.ray.router``); None: Serve's own."""
    router_options: Mapping[str, Any] = field(default_factory=dict)
    """The router's options (``make_router``'s)."""

    def user_config(self) -> dict[str, Any]:
        """What every replica's ``reconfigure`` receives: each method's whole config."""
        return {
            "methods": {m: c.as_dict() for m, c in self.configs.items()},
            "generation": {m: c.as_dict() for m, c in self.generation.items()},
            "reset_epoch": self.reset_epoch,
        }

    def ongoing(self) -> int:
        """The replica's max_ongoing_requests: given, or from the batching and generation caps."""
        if self.max_ongoing:
            return self.max_ongoing
        if not self.generation:
            return max_ongoing_requests(self.configs)
        batching = max_ongoing_requests(self.configs) if self.configs else 0
        return batching + generation_ongoing(self.generation)

    @property
    def ingress(self) -> str | None:
        """The ingress application's name, when the OpenAI routes go through one; else None.

        Only a router that scores the prompt needs it (a request straight from Ray's proxy
        is routed before its body is read). The others keep the proxy's single hop: the
        ingress costs every streamed chunk a second hop through Serve (an object and a
        message each way; benchmarks/RESULTS.md, "Generation through Ray's proxy").
        """
        if not (reads_prompt(self.router) and self.generation and self.route_prefix is not None):
            return None
        return ingress_app(self.spec.app)

    def with_change(self, method: str, changes: Mapping[str, Any]) -> Plan:
        """This plan with ``method``'s config changed (validated: ConfigError changes nothing)."""
        if method in self.generation:
            changed = _live(self.generation[method], changes)
            return dataclasses.replace(self, generation={**self.generation, method: changed})
        if method not in self.configs:
            raise KeyError(f"{self.spec.runner} has no batchable or generative method {method!r}")
        configs = {**self.configs, method: self.configs[method].replace(**changes)}
        return dataclasses.replace(self, configs=configs)

    def with_reset(self) -> Plan:
        """This plan with every replica's counts to be reset (the next epoch)."""
        return dataclasses.replace(self, reset_epoch=self.reset_epoch + 1)

    def run(self) -> DeploymentHandle[Any]:
        """Deploy (or update) the application; returns once its replicas are running."""
        scaling: dict[str, Any] = (
            {"autoscaling_config": dict(self.autoscaling_config)}
            if self.autoscaling_config is not None
            else {"num_replicas": self.num_replicas}
        )
        if self.router is not None:  # else Serve's own (power of two on probed queues)
            scaling["request_router_config"] = router_config(
                self.router, self.router_options, tuple(self.generation)
            )
        deployment: Any = serve.deployment(
            replica_class(self.spec.methods),
            name=self.spec.runner,
            user_config=self.user_config(),
            max_ongoing_requests=self.ongoing(),
            ray_actor_options={"num_cpus": self.num_cpus, **self.ray_actor_options},
            **scaling,
            **self.options,
        )
        # Serve gives a Python-API deployment a random code version on every serve.run, so
        # a new user_config would replace every replica (a rolling restart, counts lost)
        # instead of reconfiguring them. Serve sets the version itself with _internal=True
        # (ray 2.60, pinned by labserve[ray]); tests/ray checks that a live change keeps
        # the replicas it reached.
        deployment = deployment.options(version=self.version, _internal=True)
        handle = serve.run(
            deployment.bind(self.spec), name=self.spec.app, route_prefix=self.route_prefix
        )
        if self.ingress is not None and self.route_prefix is not None:
            self._run_ingress(self.ingress, self.route_prefix)
        return handle

    def _run_ingress(self, name: str, route_prefix: str) -> None:
        """Deploy (or keep, as the version is fixed) the ingress at ``<route_prefix>/v1``."""
        ingress: Any = serve.deployment(Ingress)
        ingress = ingress.options(
            name="ingress",
            num_replicas=1,
            # Every replica's streams pass through it at once (Serve's default, 5, would
            # cap the application at 5 streams).
            max_ongoing_requests=self.ongoing() * max(1, _most_replicas(self)),
            # No CPU reserved, as Serve's own proxy reserves none: it is the proxy's
            # second half, and replicas sized to fill the machine must still fit.
            ray_actor_options={"num_cpus": 0},
            version=self.version,
            _internal=True,
        )
        serve.run(ingress.bind(self.spec), name=name, route_prefix=ingress_route(route_prefix))


def _most_replicas(plan: Plan) -> int:
    """The most replicas the plan may run (the autoscaler's maximum when it scales)."""
    if plan.autoscaling_config is not None:
        return int(plan.autoscaling_config.get("max_replicas", 1))
    return plan.num_replicas if isinstance(plan.num_replicas, int) else 1


def _live(old: GenerationConfig, changes: Mapping[str, Any]) -> GenerationConfig:
    """``old`` changed live, checked before any replica sees it.

    Raises:
        ConfigError: a bad value, or a start-time setting (it sizes every replica's KV
            memory, allocated once).
    """
    new = old.replace(**changes)
    for name in PAGED_START_SETTINGS:
        if getattr(new, name) != getattr(old, name):
            raise ConfigError(
                name,
                getattr(new, name),
                f"left at {getattr(old, name)!r} while the application runs (a start-time "
                "setting: it sizes the KV memory; deploy again with it)",
            )
    return new
