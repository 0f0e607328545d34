"""``Scheduler.run_decodes`` leaves the scheduler exactly as the same steps planned one by one.

Two schedulers get the same arrivals on a virtual clock: one plans every step
(``schedule``/``complete``), the other carries out runs of decode steps at once where it
can. After each run the first is brought to the same step and every piece of state is
compared: each live sequence's record (counts, block table, token ids and times), the KV
pool (held, free, cached, and the order it hands free blocks out in) and the last record.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labserve.base.errors import LengthLimitError
from labserve.config.generation import GenerationConfig
from labserve.generation.scheduler import Scheduler


def step_time(num_seqs: int, num_batched_tokens: int, num_context_tokens: int) -> float:
    return 0.001 + 0.0001 * num_seqs + 0.00001 * num_batched_tokens + 1e-7 * num_context_tokens


class Arrivals:
    """Requests ``(at_s, prompt ids, max_tokens)`` in time order, added to a scheduler when due."""

    def __init__(self, sched: Scheduler, requests: list[tuple[float, list[int], int]]) -> None:
        self.sched, self.requests, self.i = sched, requests, 0

    def __call__(self, now: float) -> float:
        while self.i < len(self.requests) and self.requests[self.i][0] <= now:
            at, ids, most = self.requests[self.i]
            try:
                self.sched.add(self.i, len(ids), most, at, token_ids=list(ids))
            except LengthLimitError:
                pass
            self.i += 1
        return self.requests[self.i][0] if self.i < len(self.requests) else math.inf


THREES = [3] * 100  # every output token is a 3, on both paths


def planned_step(sched: Scheduler, now: float) -> float:
    plan = sched.schedule(now)
    if plan.empty:
        return now
    end = now + step_time(len(plan.scheduled), plan.num_batched_tokens, plan.num_context_tokens)
    tokens = {e.seq_id: 3 for e in plan.scheduled if e.samples}
    sched.complete(plan, end, tokens=tokens)
    return end


def steps(sched: Scheduler) -> int:
    return sched.last_step.index + 1 if sched.last_step is not None else 0


def state(sched: Scheduler) -> dict:
    """Everything a later step or a reader can see."""
    seqs = [
        (
            s.id,
            s.status,
            s.num_computed,
            s.num_tokens,
            s.num_output,
            s.num_registered,
            s.num_preemptions,
            s.first_scheduled_s,
            list(s.block_table),
            list(s.token_ids or ()),
            list(s.token_times_s),
        )
        for s in sched.live()
    ]
    pool = sched.pool
    return {
        "seqs": seqs,
        "running": sched.num_running,
        "waiting": sched.num_waiting,
        "pool": (pool.num_used, pool.num_free, pool.num_cached, pool.num_evicted, pool.cached()),
        "last": sched.last_step,
        "queries": (sched.prefix_cache_queries, sched.prefix_cache_hits),
    }


def free_order(sched: Scheduler) -> list[int]:
    """The ids the pool hands out next, in order (taken: call last)."""
    table: list[int] = []
    n = sched.pool.num_free
    if n:
        sched.pool.allocate(table, n)
    return table


def drive(
    config: GenerationConfig, requests: list[tuple[float, list[int], int]]
) -> tuple[int, int]:
    """Run both schedulers to the end, comparing after every run; (steps in runs, steps)."""
    fast, ref = Scheduler(config), Scheduler(config)
    admit_fast, admit_ref = Arrivals(fast, requests), Arrivals(ref, requests)
    now = ref_now = 0.0
    in_runs = 0
    for _ in range(10_000):
        nxt = admit_fast(now)
        if not fast.has_work:
            if nxt == math.inf:
                break
            now = nxt
            continue
        run = fast.run_decodes(now, step_time, admit=admit_fast, outputs=lambda _: THREES)
        if run is None:
            now = planned_step(fast, now)
        else:
            in_runs += len(run)
            now = run.end_s[-1]
        while steps(ref) < steps(fast):
            nxt = admit_ref(ref_now)
            ref_now = planned_step(ref, ref_now) if ref.has_work else nxt
        assert ref_now == now
        admit_ref(now), admit_fast(now)  # a run may stop after admitting what came at its end
        assert state(ref) == state(fast)
    assert not fast.has_work and not ref.has_work
    assert free_order(ref) == free_order(fast)
    return in_runs, steps(fast)


@st.composite
def cases(draw: st.DrawFn) -> tuple[GenerationConfig, list[tuple[float, list[int], int]]]:
    config = GenerationConfig(
        strategy=draw(st.sampled_from(["continuous", "continuous", "static"])),
        scheduling_policy=draw(st.sampled_from(["fcfs", "priority", "lpm"])),
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.integers(6, 48)),
        enable_chunked_prefill=draw(st.booleans()),
        block_size=draw(st.sampled_from([1, 2, 4])),
        num_kv_blocks=draw(st.sampled_from([0, 0, 10, 30])),
        enable_prefix_caching=draw(st.booleans()),
    )
    n = draw(st.integers(1, 10))
    at, requests = 0.0, []
    for _ in range(n):
        at += draw(st.sampled_from([0.0, 0.003, 0.02]))
        ids = [5] * draw(st.integers(0, 6)) + draw(
            st.lists(st.integers(0, 9), min_size=1, max_size=6)
        )
        requests.append((at, ids, draw(st.integers(1, 25))))
    return config, requests


@settings(max_examples=40, deadline=None)
@given(cases())
def test_run_decodes_leaves_the_state_of_the_planned_steps(case):
    drive(*case)


@pytest.mark.parametrize("caching", [False, True])
def test_runs_carry_most_steps_of_a_decode_heavy_load(caching):
    """Long outputs, a few arrivals: nearly every step is carried out in a run."""
    requests = [(0.004 * i, [1, 2, 3, 4] * 3, 60) for i in range(12)]
    config = GenerationConfig(max_num_seqs=8, block_size=4, enable_prefix_caching=caching)
    in_runs, total = drive(config, requests)
    assert in_runs >= 0.85 * total


def test_nothing_changes_when_the_next_step_is_not_a_decode_run():
    """A prompt not yet computed: None, and the scheduler is as it was."""
    sched = Scheduler(GenerationConfig())
    sched.add(0, prompt_len=5, max_tokens=3, now=0.0)
    before = state(sched)
    assert sched.run_decodes(0.0, step_time) is None
    assert state(sched) == before
