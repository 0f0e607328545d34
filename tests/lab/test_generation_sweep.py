"""sweep_generation: the scheduler's knobs swept through the generation simulator."""

import concurrent.futures

import pytest

from labserve.base.errors import ConfigError
from labserve.config.generation import GenerationConfig
from labserve.lab.generation.sweep import GENERATION_COLUMNS, sweep_generation
from labserve.lab.sweep import format_table
from labserve.sim.generation import StepCost

COST = StepCost(fixed_ms=5.0, per_batched_token_ms=0.02)
BASE = GenerationConfig(request_timeout_ms=0, max_queue_size=100_000)


def test_rows_follow_the_grid_and_carry_their_settings():
    rows = sweep_generation(
        rates=[5, 10],
        cost=COST,
        input_len=16,
        output_len=8,
        strategies=["static", "continuous"],
        max_num_seqs=[4],
        base=BASE,
        duration_s=2,
    )
    keys = [(r["strategy"], r["rate"]) for r in rows]
    assert keys == [("static", 5), ("static", 10), ("continuous", 5), ("continuous", 10)]
    assert all(r["max_num_seqs"] == 4 and r["refused"] == 0 for r in rows)
    table = format_table(rows, GENERATION_COLUMNS)
    assert table.splitlines()[0].split() == list(GENERATION_COLUMNS)


def test_continuous_outserves_static_over_capacity():
    # Outputs 1..64 with 8 slots: static holds each slot until its batch's longest ends.
    kw = dict(rates=[400], cost=StepCost(5.0), input_len=8, output_len="uniform:1:64")
    kw.update(max_num_seqs=[8], base=BASE, duration_s=5)
    static, continuous = sweep_generation(strategies=["static", "continuous"], **kw)
    assert continuous["output_tokens_per_s"] > 1.4 * static["output_tokens_per_s"]


def test_a_smaller_token_budget_trades_ttft_for_itl():
    # One prompt in ten is long: a big budget computes it in one slow step that every
    # running decode waits for; a small one spreads it over several short steps.
    rows = sweep_generation(
        rates=[20],
        cost=COST,
        input_len="list:32,32,32,32,32,32,32,32,32,1024",
        output_len=64,
        max_num_batched_tokens=[256, 2048],
        max_num_seqs=[64],
        base=BASE,
        duration_s=20,
    )
    small, big = rows
    assert small["itl_p99_ms"] < big["itl_p99_ms"]
    assert small["ttft_p99_ms"] > big["ttft_p99_ms"]


def test_without_chunking_a_prompt_over_the_budget_is_refused_and_counted():
    rows = sweep_generation(
        rates=[10],
        cost=COST,
        input_len="list:16,600",
        output_len=4,
        max_num_batched_tokens=[512],
        enable_chunked_prefill=[True, False],
        base=BASE,
        duration_s=4,
    )
    chunked, unchunked = rows
    assert chunked["refused"] == 0
    assert unchunked["refused"] > 0
    assert unchunked["served"] + unchunked["refused"] == chunked["served"]


def test_an_executor_gives_the_serial_rows_in_order():
    kw = dict(rates=[10, 30], cost=COST, input_len="uniform:4:64", output_len="uniform:1:32")
    kw.update(max_num_seqs=[2, 16], base=BASE, duration_s=3)
    serial = sweep_generation(**kw)
    seen = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        parallel = sweep_generation(
            executor=pool, progress=lambda done, total: seen.append((done, total)), **kw
        )
    assert parallel == serial
    assert seen[-1] == (4, 4)


def test_goodput_uses_the_base_configs_targets():
    kw = dict(rates=[50], cost=COST, input_len=8, output_len=32, duration_s=4)
    loose = sweep_generation(base=BASE, **kw)[0]
    tight = sweep_generation(base=BASE.replace(tpot_slo_ms=5.1), **kw)[0]
    assert 0 < tight["goodput_rps"] < loose["goodput_rps"]


@pytest.mark.parametrize(
    ("kw", "error", "words"),
    [
        ({"rates": []}, ValueError, "rates must be"),
        ({"rates": [float("inf")]}, ValueError, "rates must be"),
        ({"duration_s": 0}, ValueError, "duration_s must be"),
        ({"max_num_seqs": [0]}, ConfigError, "max_num_seqs"),
        ({"strategies": ["orca"]}, ConfigError, "strategy"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(kw, error, words):
    args = dict(rates=[10], cost=COST, input_len=8, output_len=8) | kw
    with pytest.raises(error, match=words):
        sweep_generation(**args)
