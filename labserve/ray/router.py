"""labserve's routers (:mod:`labserve.generation.routing`) as Ray Serve request routers.

Ray Serve (2.60, its alpha ``RequestRouter`` API) asks a router, per request, to rank the
replicas; this adapter builds each replica's :class:`ReplicaView` and lets the sans-IO
router choose. The scoring lives once, in :mod:`labserve.generation.routing`; the fleet
simulator runs the same code on virtual time.

How fresh each replica's view is:

- its load (running + waiting) is at least the requests this router sent it that have not
  completed: exact, from the router's own history (``on_request_routed`` and
  ``on_request_completed``), updated as requests go out and end;
- its own counts (running, waiting, KV blocks used and total, which include requests other
  routers sent) come from ``record_routing_stats``, which the replica answers and Serve
  polls every :data:`STATS_PERIOD_S` (1 s here; Serve's default, 10 s, is too stale to
  route on) and broadcasts to every router;
- a prefix router's view of each replica's cache is its own routing history (each prompt's
  block keys as it routes them), so it needs no cache digest from the replica.

What the router sees of a request: a handle call of a generative method
(``app.generate(prompt)``, its streams) carries the prompt, and so does a call from the
application's ingress (:mod:`labserve.ray.generation.ingress`: the OpenAI routes' request,
read and checked, is the call's argument), so prefix routing works on both. A request that
goes straight from Ray's HTTP proxy to a replica is routed before its body is read (Serve
sends the replica the ASGI scope; the replica pulls the body): the router sees no prompt,
so a router that needs one (:func:`reads_prompt`) gets the ingress in front of the
generation routes, and the others keep that single hop. A text prompt is keyed by its
UTF-8 bytes (TinyLM's tokens exactly; for another tokenizer the keys are consistent
between requests, which is all affinity needs, but the cache size counts bytes as tokens);
a chat by labserve's template of it. Each handle (the proxy's, the ingress's, a
notebook's) has its own router and history.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from labserve.generation.api import ChatPrompt, GenerateRequest
from labserve.generation.routing import ROUTERS, PrefixRouter, ReplicaView, Router, make_router

__all__ = [
    "STATS_PERIOD_S",
    "LabServeRouter",
    "prompt_ids",
    "reads_prompt",
    "router_config",
    "view_of",
]

STATS_PERIOD_S = 1.0
"""How often Serve asks each replica for its routing stats (seconds)."""

_STREAMS = ("stream", "stream_request")
"""The replica's streaming calls: the method's name first, then the prompt."""

STATS_KEYS = ("running", "waiting", "kv_blocks_used", "kv_blocks_total")
"""What a replica's ``record_routing_stats`` reports (its generative methods' sums)."""


def reads_prompt(name: str | None) -> bool:
    """True for a router that scores the prompt (the prefix routers), by name."""
    cls = ROUTERS.get(name or "")
    return cls is not None and issubclass(cls, PrefixRouter)


def router_config(
    name: str, options: Mapping[str, Any], generators: Sequence[str]
) -> RequestRouterConfig:
    """Serve's config for a deployment routed by labserve's router ``name``.

    Raises:
        ConfigError: an unknown router name, an option it does not take, or a bad value
            (checked here, on the driver, before anything is deployed).
    """
    make_router(name, **options)
    fields: dict[str, Any] = {  # typed loosely: Serve annotates every field as a dict
        "request_router_class": LabServeRouter,
        "request_router_kwargs": {
            "router": name,
            "options": dict(options),
            "generators": list(generators),
        },
        "request_routing_stats_period_s": STATS_PERIOD_S,
    }
    return RequestRouterConfig(**fields)


def prompt_ids(pending: PendingRequest | None, generators: Sequence[str]) -> list[int]:
    """The prompt's ids as the router keys them ([] when the request carries none).

    A generative method's call has the prompt first; a stream (the replica's ``stream``,
    and the ingress's ``stream_request``) has the method's name first, then the prompt
    (the ingress's: an OpenAI route's GenerateRequest). Text is keyed by its UTF-8 bytes,
    a chat by its template's text.
    """
    if pending is None:
        return []
    method = pending.metadata.call_method
    args = pending.args
    if method in _STREAMS and len(args) >= 2 and args[0] in generators:
        prompt = args[1]
    elif method in generators and args:
        prompt = args[0]
    else:
        return []
    if isinstance(prompt, (GenerateRequest, ChatPrompt)):
        prompt = prompt.prompt if isinstance(prompt, GenerateRequest) else prompt.text
    if isinstance(prompt, str):
        return list(prompt.encode("utf-8"))
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    return []


def view_of(replica_id: str, stats: Mapping[str, Any], outstanding: int) -> ReplicaView:
    """One replica's view: its reported counts, its load at least ``outstanding``."""
    reported = {k: int(stats.get(k, 0)) for k in STATS_KEYS}
    running = reported["running"]
    # The router's own in-flight requests are exact and newer than the report: a
    # replica's load is never below them (the report may predate the last few sends).
    waiting = max(reported["waiting"], outstanding - running)
    return ReplicaView(
        replica_id,
        running=running,
        waiting=waiting,
        kv_blocks_used=reported["kv_blocks_used"],
        kv_blocks_total=reported["kv_blocks_total"],
    )


class LabServeRouter(RequestRouter):
    """A Ray Serve request router that asks one of labserve's routers (see the module).

    Serve builds one per deployment handle and calls it on that handle's event loop: its
    state (the sans-IO router, the in-flight requests) has one owner, as the router needs.
    Without Serve's ``FIFOMixin`` on purpose: the replica chosen for a request goes to that
    request, not to the oldest one pending (which would break prefix affinity).
    """

    def initialize_state(self, **kwargs: Any) -> None:
        """Serve's hook, with ``request_router_kwargs``: the router's name, options, generators."""
        self.router: Router = make_router(kwargs["router"], **kwargs.get("options", {}))
        self.generators: tuple[str, ...] = tuple(kwargs.get("generators", ()))
        self.outstanding: dict[str, int] = {}
        """Requests this router sent to each replica that have not completed."""
        self._in_flight: dict[str, tuple[str, list[int]]] = {}

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """The chosen replica first, then the others (Serve tries them when it is full)."""
        if not candidate_replicas:
            return []
        ids = prompt_ids(pending_request, self.generators)
        views = [
            view_of(
                r.replica_id.unique_id,
                r.routing_stats or {},
                self.outstanding.get(r.replica_id.unique_id, 0),
            )
            for r in candidate_replicas
        ]
        chosen = self.router.choose(ids, views, now=time.monotonic())
        first = [r for r in candidate_replicas if r.replica_id.unique_id == chosen]
        rest = [r for r in candidate_replicas if r.replica_id.unique_id != chosen]
        return [first, rest] if rest else [first]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        """Serve sent the request to ``replica_id``: count it, and tell a history router."""
        rid = replica_id.unique_id
        ids = prompt_ids(pending_request, self.generators)
        self.outstanding[rid] = self.outstanding.get(rid, 0) + 1
        self._in_flight[pending_request.metadata.internal_request_id] = (rid, ids)
        self.router.routed(rid, ids, now=time.monotonic())

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """The request ended on ``replica_id`` (any outcome): one fewer in flight."""
        sent = self._in_flight.pop(internal_request_id, None)
        if sent is None:  # not counted here (Serve reports every dispatched request once)
            return
        rid, ids = sent
        self.outstanding[rid] -= 1
        self.router.finished(rid, ids, now=time.monotonic())

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Serve's new set of replicas: forget what the router kept about those that left."""
        live = {r.replica_id.unique_id for r in replicas}
        for gone in set(self.outstanding) - live:
            del self.outstanding[gone]
            self.router.forget(gone)
        self._in_flight = {k: v for k, v in self._in_flight.items() if v[0] in live}
        super().update_replicas(replicas)
