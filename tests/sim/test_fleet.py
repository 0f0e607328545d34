"""The fleet simulator: N schedulers behind a router on one virtual clock."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labserve.base.errors import ConfigError
from labserve.config.generation import GenerationConfig
from labserve.generation.routing import ROUTERS, make_router
from labserve.generation.workload import SharedPrefixWorkload
from labserve.sim.fleet import simulate_fleet
from labserve.sim.generation import StepCost, simulate_workload

CACHED = GenerationConfig(enable_prefix_caching=True, num_kv_blocks=96, max_num_seqs=8)
COST = StepCost(fixed_ms=4.0, per_batched_token_ms=0.05)


def _arrivals(n: int, rate: float, seed: int = 1) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))


def _tenants(num_prefixes: int = 8, dist: str = "uniform", **kw) -> SharedPrefixWorkload:
    return SharedPrefixWorkload(
        prefix_len=128, num_prefixes=num_prefixes, prefix_dist=dist, input_len=16,
        output_len=8, **kw,
    )  # fmt: skip


def test_one_replica_is_the_single_simulator_exactly() -> None:
    # Multi-turn, no think time (a next turn joins the boundary its reply ended at), a
    # spread drawn per step: every time and every prompt equal.
    w = _tenants(4, turns=3)
    cost = StepCost(fixed_ms=5.0, per_batched_token_ms=0.05, spread=(0.8, 1.0, 1.6))
    arrivals = _arrivals(120, 40.0)
    single = simulate_workload(CACHED, cost, w, arrival_s=arrivals, seed=3)
    fleet = simulate_fleet(CACHED, cost, w, arrival_s=arrivals, seed=3, replicas=1)
    a, b = single.generation, fleet.generation
    for name in ("arrival_s", "first_token_s", "end_s", "prompt_len", "num_output", "outcome"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    assert np.array_equal(a.steps.start_s, b.steps.start_s)
    assert single.prompts == fleet.workload.prompts and a.refused == b.refused
    assert np.array_equal(single.turn, fleet.workload.turn)


def test_round_robin_spreads_requests_evenly() -> None:
    r = simulate_fleet(
        CACHED, COST, _tenants(), arrival_s=_arrivals(203, 50.0), replicas=4, router="round_robin"
    )
    counts = Counter(r.replica.tolist())
    assert sorted(counts.values()) == [50, 51, 51, 51]


def test_prefix_routing_keeps_each_tenant_on_one_replica_and_hits_more() -> None:
    # 32 blocks a replica: about 2 of the 8 tenants' 8-block prefixes beside the running.
    small = CACHED.replace(num_kv_blocks=32)
    w, arrivals = _tenants(8), _arrivals(300, 20.0)
    runs = {
        name: simulate_fleet(small, COST, w, arrival_s=arrivals, replicas=4, router=name)
        for name in ("prefix", "power_of_two")
    }
    prefix = runs["prefix"]
    tenants = [w.tenant(int(k)) for k in prefix.workload.session]
    homes: dict[int, set[int]] = {}
    for tenant, replica in zip(tenants, prefix.replica.tolist(), strict=True):
        homes.setdefault(tenant, set()).add(replica)
    assert all(len(h) == 1 for h in homes.values())  # light load: never fell back
    assert prefix.reasons.get("balance", 0) == 0
    hit = {name: r.summary()["hit_rate"] for name, r in runs.items()}
    assert hit["prefix"] > 2 * hit["power_of_two"]


def test_pure_affinity_piles_a_hot_tenant_onto_one_replica() -> None:
    # Zipf 2 over 8 tenants: tenant 0 sends about 65% of the traffic.
    w, arrivals = _tenants(8, "zipf:2"), _arrivals(300, 150.0)
    runs = {
        name: simulate_fleet(CACHED, COST, w, arrival_s=arrivals, replicas=4, router=name)
        for name in ("prefix_affinity", "prefix")
    }
    affinity, balanced = (runs[n].summary() for n in ("prefix_affinity", "prefix"))
    assert affinity["load_skew"] > 2.0
    assert balanced["load_skew"] < 1.5
    assert runs["prefix"].reasons["balance"] > 0


def test_the_load_is_time_averaged_over_the_window() -> None:
    # One request at a time on one replica: the load is 1 while it runs, 0 between.
    w = _tenants(1)
    r = simulate_fleet(CACHED, COST, w, arrival_s=[0.0, 1.0, 2.0], replicas=1)
    busy = float((r.generation.end_s - r.generation.arrival_s).sum())
    assert r.per_replica()[0].load == pytest.approx(busy / r.window_s)


def test_the_warm_up_is_left_out() -> None:
    w, arrivals = _tenants(), _arrivals(100, 20.0)
    r = simulate_fleet(CACHED, COST, w, arrival_s=arrivals, replicas=2, measure_from_s=2.0)
    assert r.summary()["requests"] == int((arrivals >= 2.0).sum())
    assert r.window_s == pytest.approx(float(r.generation.end_s.max()) - 2.0)


def test_same_seed_same_result() -> None:
    w, arrivals = _tenants(), _arrivals(80, 30.0)
    runs = [
        simulate_fleet(CACHED, COST, w, arrival_s=arrivals, replicas=3, router="power_of_two")
        for _ in range(2)
    ]
    assert runs[0].replica.tolist() == runs[1].replica.tolist()
    assert runs[0].summary() == runs[1].summary()


def test_bad_arguments_are_typed_errors() -> None:
    w = _tenants()
    with pytest.raises(ValueError, match="replicas must be an integer >= 1"):
        simulate_fleet(CACHED, COST, w, arrival_s=[0.0], replicas=0)
    with pytest.raises(ConfigError, match="router must be one of"):
        simulate_fleet(CACHED, COST, w, arrival_s=[0.0], router="nearest")
    with pytest.raises(ConfigError, match="block_size"):
        simulate_fleet(CACHED, COST, w, arrival_s=[0.0], router=make_router("prefix", block_size=8))
    with pytest.raises(ValueError, match="non-decreasing"):
        simulate_fleet(CACHED, COST, w, arrival_s=[1.0, 0.0])


@settings(max_examples=25, deadline=None)
@given(
    router=st.sampled_from(sorted(ROUTERS)),
    replicas=st.integers(1, 4),
    n=st.integers(0, 30),
    rate=st.floats(5.0, 400.0),
    turns=st.integers(1, 3),
    kv_blocks=st.integers(12, 40),
    queue=st.integers(1, 6),
)
def test_every_turn_gets_exactly_one_outcome(
    router: str, replicas: int, n: int, rate: float, turns: int, kv_blocks: int, queue: int
) -> None:
    config = GenerationConfig(
        enable_prefix_caching=True, num_kv_blocks=kv_blocks, max_num_seqs=4, max_queue_size=queue
    )
    w = SharedPrefixWorkload(
        prefix_len=32, num_prefixes=3, input_len="uniform:1:40", output_len="uniform:1:12",
        turns=turns,
    )  # fmt: skip
    r = simulate_fleet(
        config, COST, w, arrival_s=_arrivals(n, rate), replicas=replicas, router=router,
        max_model_len=160,
    )  # fmt: skip
    g = r.generation
    keys = list(zip(r.workload.session.tolist(), r.workload.turn.tolist(), strict=True))
    assert len(keys) == len(set(keys))  # no turn ends twice
    served = {key for key, ok in zip(keys, g.served.tolist(), strict=True) if ok}
    # Each session sends its first turn; each served turn but the last sends the next;
    # each sent turn ends once in the results or is refused.
    sent = n + sum(1 for _, t in served if t + 1 < turns)
    assert len(g) + g.refused == sent
    assert set(r.replica.tolist()) <= set(range(replicas))
    assert sum(s.requests for s in r.per_replica()) == len(g)
