"""Prefix caching in the scheduler: hits at admission, registration, preemption, live toggles."""

from __future__ import annotations

from labserve.config.generation import GenerationConfig
from labserve.generation.scheduler import Scheduler

CACHING = GenerationConfig(block_size=4, num_kv_blocks=16, enable_prefix_caching=True)


def run_until_done(s: Scheduler, now: float = 0.0, **complete: object) -> float:
    while s.has_work:
        plan = s.schedule(now)
        now += 0.001
        if not plan.empty:
            s.complete(plan, now, tokens={e.seq_id: 7 for e in plan.scheduled}, **complete)
    return now


def admit_and_plan(s: Scheduler, seq_id: int, prompt: list[int], now: float):
    s.add(seq_id, len(prompt), 2, now, token_ids=list(prompt))
    return s.schedule(now)


def test_a_second_prompt_starts_after_the_cached_full_blocks_of_the_first():
    s = Scheduler(CACHING)
    prompt = list(range(10))  # blocks [0..3], [4..7] full; 8, 9 in a third
    run_until_done(admit_and_plan_done(s, 1, prompt))
    plan = admit_and_plan(s, 2, prompt, 1.0)
    (entry,) = plan.scheduled
    assert (entry.start, entry.num_new_tokens) == (8, 2)
    assert (plan.num_cache_queries, plan.num_cache_hits) == (10, 8)
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (20, 8)
    assert s.sequence(2).num_cached_tokens == 8


def admit_and_plan_done(s: Scheduler, seq_id: int, prompt: list[int]) -> Scheduler:
    s.add(seq_id, len(prompt), 2, 0.0, token_ids=list(prompt))
    return s


def test_a_prompt_of_whole_blocks_computes_its_last_block_again():
    s = Scheduler(CACHING)
    run_until_done(admit_and_plan_done(s, 1, list(range(8))))
    plan = admit_and_plan(s, 2, list(range(8)), 1.0)
    assert [(e.start, e.num_new_tokens) for e in plan.scheduled] == [(4, 4)]


def test_a_shared_prefix_shorter_than_a_block_never_hits():
    s = Scheduler(CACHING)
    run_until_done(admit_and_plan_done(s, 1, [1, 2, 3, 4, 5, 6]))
    plan = admit_and_plan(s, 2, [1, 2, 3, 9, 9, 9], 1.0)
    assert plan.num_cache_hits == 0


def test_a_failed_step_registers_nothing():
    s = Scheduler(CACHING)
    s.add(1, 9, 2, 0.0, token_ids=list(range(9)))
    plan = s.schedule(0.0)
    s.complete(plan, 0.001, failed={1})
    assert s.pool.num_cached == 0 and s.pool.num_used == 0
    plan = admit_and_plan(s, 2, list(range(9)), 1.0)
    assert plan.num_cache_hits == 0


def test_blocks_are_registered_only_once_the_step_that_wrote_them_completes():
    s = Scheduler(CACHING.replace(max_num_batched_tokens=6))
    s.add(1, 12, 2, 0.0, token_ids=list(range(12)))
    plan = s.schedule(0.0)  # a chunk of 6: block 0 full, block 1 half
    assert s.pool.num_cached == 0
    s.complete(plan, 0.001)
    assert s.pool.num_cached == 1
    s.complete(s.schedule(0.002), 0.003)  # 12 computed: blocks 0, 1, 2 full
    assert s.pool.num_cached == 3


def test_a_preempted_sequence_hits_its_own_blocks_when_it_resumes():
    # 4 blocks; each needs 3 at its longest (5 + 6 - 1 tokens). When 1 needs its third, 2
    # (8 computed: 2 full blocks cached) is preempted; 1 takes the block at the free queue's
    # front, 2's tail (evicted first), so 2 resumes after its first block: 4 tokens.
    s = Scheduler(GenerationConfig(block_size=4, num_kv_blocks=4, enable_prefix_caching=True))
    s.add(1, 5, 6, 0.0, token_ids=[1] * 5)
    s.add(2, 5, 6, 0.0, token_ids=[2] * 5)
    now, hits = 0.0, []
    while s.has_work:
        plan = s.schedule(now)
        hits += [(e.seq_id, e.start) for e in plan.scheduled if e.kind == "resume"]
        now += 0.001
        s.complete(plan, now, tokens={e.seq_id: 3 for e in plan.scheduled})
    assert s.num_preemptions == 1
    assert hits == [(2, 4)]


def test_turning_caching_off_live_drops_every_hash_and_on_starts_again():
    s = Scheduler(CACHING)
    run_until_done(admit_and_plan_done(s, 1, list(range(10))))
    assert s.pool.num_cached == 2
    s.configure(CACHING.replace(enable_prefix_caching=False))
    plan = admit_and_plan(s, 2, list(range(10)), 1.0)
    assert s.pool.num_cached == 0 and plan.num_cache_hits == 0
    s.complete(plan, 1.001, tokens={2: 7})
    s.configure(CACHING)
    run_until_done(s, 1.002)
    plan = admit_and_plan(s, 3, list(range(10)), 2.0)
    assert plan.num_cache_hits == 8  # 2's blocks registered once caching came back on


def test_counted_sequences_and_an_unset_setting_on_an_account_pool_do_not_cache():
    s = Scheduler(GenerationConfig(block_size=4, num_kv_blocks=16))  # unset, no model memory
    run_until_done(admit_and_plan_done(s, 1, list(range(10))))
    assert not s.pool.caching and s.pool.num_cached == 0
    paged = Scheduler(GenerationConfig(block_size=4), kv_pool_blocks=16)
    assert paged.pool.caching
    paged.add(1, 10, 2, 0.0)  # no token ids: counted only
    run_until_done(paged)
    assert paged.pool.num_cached == 0 and paged.prefix_cache_queries == 0


def first_scheduled(policy: str) -> dict[int, float]:
    """A warm prefix, then a prompt sharing nothing, then four later ones sharing the prefix."""
    s = Scheduler(CACHING.replace(scheduling_policy=policy, max_num_seqs=1))
    shared = list(range(12))  # 3 blocks of 4
    now = run_until_done(admit_and_plan_done(s, 0, [*shared, 99]))
    s.add(1, 13, 2, now, token_ids=[50] * 13)  # first to arrive, nothing cached
    for i in range(2, 6):
        s.add(i, 13, 2, now + 0.0001 * i, token_ids=[*shared, i])
    seqs = {i: s.sequence(i) for i in range(1, 6)}
    run_until_done(s, now + 0.001)
    return {i: seq.first_scheduled_s for i, seq in seqs.items()}


def test_lpm_runs_later_hit_rich_prompts_before_an_earlier_one_that_shares_nothing():
    fcfs, lpm = first_scheduled("fcfs"), first_scheduled("lpm")
    assert sorted(fcfs, key=fcfs.get) == [1, 2, 3, 4, 5]
    assert sorted(lpm, key=lpm.get) == [2, 3, 4, 5, 1]  # the starvation trade-off
    assert lpm[1] > fcfs[1] and lpm[2] < fcfs[2]
