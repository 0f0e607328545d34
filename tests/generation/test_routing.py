"""The sans-IO routers: choices, their reasons, the bounded prefix memory, bad options."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labserve.base.errors import ConfigError, NoReplicaError
from labserve.config.generation import GenerationConfig
from labserve.generation.routing import ROUTERS, ReplicaView, make_router
from labserve.generation.scheduler import Scheduler

SIZE = 4  # tokens per block in these tests


def _fleet(*loads: int) -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", running=load) for i, load in enumerate(loads)]


def _prompt(tenant: int, user: int, prefix_blocks: int = 3) -> list[int]:
    """A tenant's shared prefix of whole blocks, then a user's own block."""
    return [1000 * tenant + i for i in range(prefix_blocks * SIZE)] + [-user - 1] * SIZE


def test_round_robin_takes_each_replica_in_turn() -> None:
    router = make_router("round_robin")
    fleet = _fleet(9, 0, 0)
    got = [router.choose([1], fleet, now=0.0) for _ in range(7)]
    assert got == ["r0", "r1", "r2", "r0", "r1", "r2", "r0"]


def test_power_of_two_never_takes_the_most_loaded_and_is_seeded() -> None:
    fleet = _fleet(0, 5, 10)
    a, b = make_router("power_of_two", seed=7), make_router("power_of_two", seed=7)
    got = [a.choose([1], fleet, now=0.0) for _ in range(300)]
    assert got == [b.choose([1], fleet, now=0.0) for _ in range(300)]
    counts = Counter(got)
    # r0 wins every pair it is drawn in (2 of 3 pairs), r1 the pair (r1, r2).
    assert "r2" not in counts
    assert 160 < counts["r0"] < 240 and 60 < counts["r1"] < 140


def test_power_of_two_spreads_an_idle_fleet() -> None:
    router = make_router("power_of_two", seed=1)
    counts = Counter(router.choose([1], _fleet(0, 0, 0, 0), now=0.0) for _ in range(400))
    assert set(counts) == {"r0", "r1", "r2", "r3"} and min(counts.values()) > 70


def test_least_kv_takes_the_smallest_fraction_then_the_least_load() -> None:
    router = make_router("least_kv")
    fleet = [
        ReplicaView("big", running=1, kv_blocks_used=40, kv_blocks_total=100),
        ReplicaView("small", running=1, kv_blocks_used=30, kv_blocks_total=50),
        ReplicaView("busy", running=9, kv_blocks_used=10, kv_blocks_total=100),
        ReplicaView("calm", running=2, kv_blocks_used=10, kv_blocks_total=100),
    ]
    assert router.choose([1], fleet, now=0.0) == "calm"
    assert router.choose([1], fleet[:2], now=0.0) == "big"


def test_prefix_keeps_a_tenant_on_the_replica_that_cached_it() -> None:
    router = make_router("prefix", block_size=SIZE, seed=0)
    fleet = _fleet(0, 0, 0, 0)
    homes = {}
    for user in range(40):
        tenant = user % 4
        prompt = _prompt(tenant, user)
        chosen = router.choose(prompt, fleet, now=float(user))
        router.routed(chosen, prompt, now=float(user))
        homes.setdefault(tenant, set()).add(chosen)
    assert all(len(h) == 1 for h in homes.values())
    # A new tenant goes to the replica that remembers the fewest keys: all four are used.
    assert len(set().union(*homes.values())) == 4
    assert router.reasons["prefix"] == 36 and router.reasons["no_match"] == 4


def test_prefix_falls_back_to_power_of_two_when_the_load_spreads() -> None:
    router = make_router("prefix", block_size=SIZE, balance_abs_threshold=4)
    prompt = _prompt(0, 0)
    router.routed("r0", prompt, now=0.0)
    assert router.choose(prompt, _fleet(4, 0), now=1.0) == "r0"  # spread 4: not over
    assert router.choose(prompt, _fleet(5, 0), now=1.0) == "r1"  # over both thresholds
    assert router.reasons["balance"] == 1


def test_prefix_affinity_never_falls_back() -> None:
    router = make_router("prefix_affinity", block_size=SIZE)
    prompt = _prompt(0, 0)
    router.routed("r1", prompt, now=0.0)
    assert router.choose(prompt, _fleet(0, 500, 0), now=1.0) == "r1"
    assert "balance" not in router.reasons


def test_a_match_below_the_rate_threshold_is_no_match() -> None:
    router = make_router("prefix", block_size=SIZE, match_rate_threshold=0.5)
    shared = _prompt(0, 0, prefix_blocks=1)  # 1 shared block of 2
    router.routed("r0", shared, now=0.0)
    other = shared[:SIZE] + [7] * 3 * SIZE  # the same first block of 4: 25% matched
    assert router.choose(other, _fleet(0, 0), now=1.0) == "r1"  # r1 remembers fewer keys
    assert router.reasons["no_match"] == 1


def test_the_memory_is_bounded_and_forgets_the_tail_first() -> None:
    router = make_router("prefix", block_size=SIZE, cache_blocks=3)
    prompt = _prompt(0, 0, prefix_blocks=3)  # 4 blocks
    router.routed("r0", prompt, now=0.0)
    assert router.cached_blocks("r0", prompt) == 3  # the head stays (vLLM's eviction order)
    for user in range(1, 4):  # other tenants push it out
        router.routed("r0", _prompt(user, user), now=float(user))
    assert router.cached_blocks("r0", prompt) == 0


def test_the_memory_takes_its_size_from_the_replica_report() -> None:
    router = make_router("prefix", block_size=SIZE)
    fleet = [ReplicaView("r0", kv_blocks_total=2), ReplicaView("r1", kv_blocks_total=2)]
    prompt = _prompt(0, 0)
    router.choose(prompt, fleet, now=0.0)
    router.routed("r0", prompt, now=0.0)
    assert router.cached_blocks("r0", prompt) == 2


def test_finished_outputs_become_matchable() -> None:
    router = make_router("prefix", block_size=SIZE)
    prompt = _prompt(0, 0, prefix_blocks=0)  # one unique block
    router.routed("r1", prompt, now=0.0)
    reply = [5] * SIZE
    router.finished("r1", prompt + reply, now=1.0)
    second_turn = prompt + reply + [6] * SIZE
    assert router.cached_blocks("r1", second_turn) == 2
    router.forget("r1")
    assert router.cached_blocks("r1", second_turn) == 0


def test_the_keys_are_the_caches_own() -> None:
    config = GenerationConfig(block_size=SIZE, num_kv_blocks=16, enable_prefix_caching=True)
    sched = Scheduler(config)
    prompt = _prompt(3, 1)
    sched.add(0, len(prompt), 1, 0.0, token_ids=list(prompt))
    plan = sched.schedule(0.0)
    sched.complete(plan, 0.01, tokens={0: 5})
    router = make_router("prefix", block_size=SIZE)
    router.routed("r0", prompt, now=0.0)
    # What the scheduler registered is what the router believes r0 holds.
    assert set(sched.pool.cached()) == set(router.hashes(prompt))
    assert router.cached_blocks("r0", prompt) == len(prompt) // SIZE


@pytest.mark.parametrize(
    ("name", "options", "key"),
    [
        ("nearest", {}, "router"),
        ("round_robin", {"block_size": 4}, "round_robin.block_size"),
        ("power_of_two", {"seed": -1}, "power_of_two.seed"),
        ("prefix", {"block_size": 0}, "prefix.block_size"),
        ("prefix", {"balance_rel_threshold": 0.5}, "prefix.balance_rel_threshold"),
        ("prefix", {"match_rate_threshold": 1.5}, "prefix.match_rate_threshold"),
        ("prefix", {"balance_abs_threshold": float("nan")}, "prefix.balance_abs_threshold"),
        ("prefix_affinity", {"balance_abs_threshold": 3}, "prefix_affinity.balance_abs_threshold"),
    ],
)
def test_bad_names_and_options_are_config_errors(name: str, options: dict, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_router(name, **options)
    assert caught.value.key == key and caught.value.status == 422


def test_no_replica_is_a_typed_error() -> None:
    with pytest.raises(NoReplicaError) as caught:
        make_router("least_kv").choose([1], [], now=0.0)
    assert caught.value.status == 503


def test_a_replica_view_refuses_negative_counts() -> None:
    with pytest.raises(ValueError, match="waiting must be an integer >= 0"):
        ReplicaView("r0", waiting=-1)


def test_options_round_trip_through_make_router() -> None:
    for name in ROUTERS:
        router = make_router(name, seed=5)
        assert make_router(name, **router.options).options == router.options


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(ROUTERS)),
    loads=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=6),
    prompts=st.lists(st.lists(st.integers(0, 3), max_size=20), min_size=1, max_size=12),
)
def test_every_choice_is_one_of_the_replicas(
    name: str, loads: list[tuple[int, int]], prompts: list[list[int]]
) -> None:
    router = make_router(name, **({"block_size": 2} if name.startswith("prefix") else {}))
    fleet = [ReplicaView(f"r{i}", running=r, waiting=w) for i, (r, w) in enumerate(loads)]
    ids = {r.replica_id for r in fleet}
    for t, prompt in enumerate(prompts):
        chosen = router.choose(prompt, fleet, now=float(t))
        assert chosen in ids
        router.routed(chosen, prompt, now=float(t))
    assert sum(router.reasons.values()) == len(prompts)
