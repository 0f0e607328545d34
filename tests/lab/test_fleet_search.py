"""The search across fleets: replicas and routers in the grid, each point a simulate_fleet run.

On virtual time, with small workloads (short outputs, a few simulated seconds a point).
"""

from __future__ import annotations

import math

import pytest

import labserve
from labserve.base.errors import ConfigError
from labserve.config.generation import GenerationConfig
from labserve.lab.generation.judging import attained, squeezed_poisson
from labserve.lab.generation.search import PoissonWorkload, search_generation
from labserve.sim.fleet import simulate_fleet

# A prefill of a 128-token prefix costs ~8x the 16-token tail: a cache hit buys capacity.
COST = labserve.StepCost(10.0, per_seq_ms=1.0, per_batched_token_ms=0.1)
TARGETS = {"ttft": 150.0, "tpot": 40.0}
TINY = dict(cost=COST, duration_s=6.0, warmup_s=1.0, attainment=0.9)


def tenants() -> labserve.SharedPrefixWorkload:
    """Eight tenants of 128-token prefixes (8 blocks each), replies of 4 tokens."""
    return labserve.SharedPrefixWorkload(
        prefix_len=128, num_prefixes=8, input_len=16, output_len=4, seed=3
    )


# 48 blocks a replica: all eight prefixes (64 blocks) do not fit one cache, four do.
SMALL_CACHE = GenerationConfig(enable_prefix_caching=True, num_kv_blocks=48, max_num_seqs=4)


@pytest.fixture(scope="module")
def found() -> labserve.GenerationSearch:
    return search_generation(
        tenants(),
        TARGETS,
        grid={"replicas": [1, 2], "router": ["round_robin", "prefix_affinity"]},
        base=SMALL_CACHE,
        **TINY,
    )


def test_one_replica_runs_once_and_each_fleet_has_a_row(found):
    keys = [(r["replicas"], r["router"]) for r in found.rows]
    assert keys == [(1, "round_robin"), (2, "round_robin"), (2, "prefix_affinity")]
    assert found.fleet
    assert "sessions/s" in repr(found) and "replicas=" in repr(found)


def test_each_fleet_rate_meets_and_the_next_lattice_rate_misses(found):
    for row in found.rows:
        assert row["max_rate"] > 0
        for rate, met in ((row["max_rate"], True), (row["max_rate"] * 1.02, False)):
            fleet = simulate_fleet(
                SMALL_CACHE,
                COST,
                tenants(),
                arrival_s=squeezed_poisson(rate, TINY["duration_s"], 0),
                replicas=row["replicas"],
                router=row["router"],
                measure_from_s=TINY["warmup_s"],
            )
            share = attained(fleet.generation, TARGETS, TINY["warmup_s"])
            assert (share >= 0.9) is met, (row["replicas"], row["router"], rate, share)


def test_routing_by_prefix_serves_more_per_replica_when_one_cache_cannot_hold_every_tenant(found):
    rows = {(r["replicas"], r["router"]): r for r in found.rows}
    affinity, spread = rows[2, "prefix_affinity"], rows[2, "round_robin"]
    assert affinity["hit_rate"] > spread["hit_rate"] + 0.2
    assert affinity["rate_per_replica"] > spread["rate_per_replica"]
    assert found.best["router"] == "prefix_affinity"
    assert "--policy cache_aware" in found.export("sglang-router")
    assert "--max-num-seqs 4" in found.export("vllm")


def test_per_replica_figures_divide_the_fleets(found):
    for row in found.rows:
        assert row["rate_per_replica"] == pytest.approx(row["max_rate"] / row["replicas"])
        assert 0 < row["tokens_per_s"] < math.inf


def test_a_poisson_workload_searches_fleets_as_one_turn_sessions():
    out = search_generation(
        PoissonWorkload(16, 4), TARGETS, grid={"replicas": [2]}, cost=COST, duration_s=4.0,
        warmup_s=0.5,
    )  # fmt: skip
    (row,) = out.rows
    assert row["replicas"] == 2 and row["router"] == "round_robin" and row["max_rate"] > 0
    assert row["hit_rate"] == 0.0  # no shared prefix


@pytest.mark.parametrize(
    ("grid", "error", "match"),
    [
        ({"replicas": [0]}, ValueError, "replicas must be integers >= 1"),
        ({"replicas": [True]}, ValueError, "replicas must be integers >= 1"),
        ({"router": ["nearest"]}, ConfigError, "router"),
        ({"replica": [2]}, ValueError, "grid keys must be among"),
    ],
)
def test_a_bad_fleet_grid_is_refused_with_what_was_expected(grid, error, match):
    with pytest.raises(error, match=match):
        search_generation(tenants(), TARGETS, grid=grid, **TINY)
