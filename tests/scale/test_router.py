"""labserve's routers as a Ray Serve ``RequestRouter``: what it sees of a request and of a replica.

No cluster: Serve's router object is built directly and called as Serve calls it
(``choose_replicas``, ``on_request_routed``, ``on_request_completed``), with stand-ins for
Serve's replicas carrying what the router reads of them (an id and the routing stats).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

import pytest
from ray.serve._private.common import (
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
    RequestMetadata,
)
from ray.serve.request_router import PendingRequest

from labserve.base.errors import ConfigError
from labserve.generation.api import ChatPrompt, GenerateRequest
from labserve.ray.router import LabServeRouter, prompt_ids, router_config, view_of

DEPLOYMENT = DeploymentID(name="lm", app_name="lm")
_ids = itertools.count()


@dataclass(frozen=True)
class Replica:
    """What the router reads of Serve's ``RunningReplica`` (the real one looks its actor up)."""

    replica_id: ReplicaID
    routing_stats: dict[str, int]


def replica(name: str, **stats: int) -> Replica:
    return Replica(ReplicaID(unique_id=name, deployment_id=DEPLOYMENT), dict(stats))


def request(method: str, *args: object) -> PendingRequest:
    metadata = RequestMetadata(
        request_id="r", internal_request_id=f"i{next(_ids)}", call_method=method
    )
    return PendingRequest(list(args), {}, metadata, future=asyncio.Future())


def router(name: str, **options: object) -> LabServeRouter:
    made = LabServeRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN)
    made.initialize_state(router=name, options=options, generators=["generate"])
    return made


async def send(made: LabServeRouter, replicas: list[Any], pending: PendingRequest):
    """Route one request as Serve does: rank, take the first, report it routed."""
    ranks = await made.choose_replicas(replicas, pending)
    chosen = ranks[0][0]
    made.on_request_routed(pending, chosen.replica_id, result=None)
    return chosen.replica_id.unique_id


def test_a_generation_through_a_handle_or_a_stream_is_keyed_by_its_prompt_an_http_one_by_nothing():
    async def main():
        generators = ("generate",)
        assert prompt_ids(request("generate", "ab"), generators) == [97, 98]
        assert prompt_ids(request("stream", "generate", "ab", {}), generators) == [97, 98]
        assert prompt_ids(request("generate", [5, 6, 7]), generators) == [5, 6, 7]
        # The ingress sends an OpenAI route's checked request: its prompt, a chat's template.
        chat = GenerateRequest("lm", "user: hi\nassistant: ", messages=(("user", "hi"),))
        sent = request("stream_request", "generate", chat)
        assert prompt_ids(sent, generators) == list(b"user: hi\nassistant: ")
        assert prompt_ids(request("generate", ChatPrompt((), "ab")), generators) == [97, 98]
        # Ray's proxy routes before the body is read: the replica gets the ASGI scope.
        assert prompt_ids(request("__call__", b"pickled scope"), generators) == []
        assert prompt_ids(request("stream", "predict", "ab", {}), generators) == []

    asyncio.run(main())


def test_the_prefix_router_sends_a_shared_prefix_to_the_replica_that_took_it_first():
    async def main():
        made = router("prefix", block_size=4)
        fleet = [replica("a"), replica("b")]
        tenants = ["alpha system prompt ", "bravo system prompt "]
        homes = {}
        for i in range(12):
            tenant = tenants[i % 2]
            pending = request("generate", f"{tenant}question {i}")
            chosen = await send(made, fleet, pending)
            assert homes.setdefault(tenant, chosen) == chosen
        assert set(homes.values()) == {"a", "b"}  # the two tenants were spread, then stuck

    asyncio.run(main())


def test_the_routers_own_in_flight_requests_count_as_load_before_any_report():
    async def main():
        made = router("power_of_two", seed=1)
        fleet = [replica("a"), replica("b")]
        first = await send(made, fleet, request("generate", "x"))
        # Serve's stats are a second old at best: the request just sent must count now.
        other = await send(made, fleet, request("generate", "y"))
        assert {first, other} == {"a", "b"}
        assert made.outstanding == {"a": 1, "b": 1}

    asyncio.run(main())


def test_a_completed_request_leaves_the_load_and_an_unknown_completion_changes_nothing():
    async def main():
        made = router("least_kv")
        fleet = [replica("a"), replica("b")]
        pending = request("generate", "x")
        chosen = await send(made, fleet, pending)
        made.on_request_completed(ReplicaID(chosen, DEPLOYMENT), "not routed here")
        assert made.outstanding[chosen] == 1
        made.on_request_completed(
            ReplicaID(chosen, DEPLOYMENT), pending.metadata.internal_request_id
        )
        assert made.outstanding[chosen] == 0

    asyncio.run(main())


def test_the_reported_kv_use_steers_least_kv_and_the_chosen_replica_ranks_first():
    async def main():
        made = router("least_kv")
        fleet = [
            replica("a", running=1, kv_blocks_used=90, kv_blocks_total=100),
            replica("b", running=3, kv_blocks_used=10, kv_blocks_total=100),
        ]
        ranks = await made.choose_replicas(fleet, request("generate", "x"))
        assert [[r.replica_id.unique_id for r in rank] for rank in ranks] == [["b"], ["a"]]

    asyncio.run(main())


def test_a_view_takes_the_report_and_never_less_load_than_the_routers_own():
    reported = {"running": 2, "waiting": 1, "kv_blocks_used": 7, "kv_blocks_total": 64}
    assert view_of("a", reported, outstanding=0).load == 3
    assert view_of("a", reported, outstanding=5).load == 5
    assert view_of("a", {}, outstanding=2).load == 2
    assert view_of("a", reported, outstanding=5).kv_use == pytest.approx(7 / 64)


def test_an_unknown_router_or_option_is_a_config_error_before_anything_deploys():
    with pytest.raises(ConfigError, match="router"):
        router_config("fastest", {}, ["generate"])
    with pytest.raises(ConfigError, match="block_size"):
        router_config("round_robin", {"block_size": 16}, ["generate"])
    config = router_config("prefix", {"block_size": 16}, ["generate"])
    assert config.request_router_kwargs["router"] == "prefix"
    assert config.request_routing_stats_period_s == 1.0
