"""The scheduler's invariants under random workloads, on a virtual clock (Hypothesis)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from labserve.base.errors import LengthLimitError
from labserve.config.generation import GenerationConfig
from labserve.generation.scheduler import Scheduler
from labserve.generation.sequence import Finished

STEP_S = 0.01


@st.composite
def configs(draw):
    kv = draw(st.sampled_from([0, 0, 8, 20, 64]))
    return GenerationConfig(
        strategy=draw(st.sampled_from(["continuous", "continuous", "static"])),
        scheduling_policy=draw(st.sampled_from(["fcfs", "priority", "lpm"])),
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(1, 64)),
        enable_chunked_prefill=draw(st.booleans()),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 3, 16])),
        block_size=draw(st.sampled_from([1, 4, 16])),
        num_kv_blocks=kv,
        request_timeout_ms=draw(st.sampled_from([0.0, 0.0, 150.0])),
        enable_prefix_caching=draw(st.booleans()),
    )


@dataclass
class Arrival:
    at_step: int
    prompt_len: int
    max_tokens: int
    priority: int
    cancel_after: int | None  # steps after arrival; None: never
    stop_after: int | None  # outputs after which a "stop token" comes
    prefix: int = 0  # which shared prefix its prompt starts with
    shared: int = 0  # tokens of it (the rest are its own)

    def tokens(self, i: int) -> list[int]:
        return [
            self.prefix * 1000 + j if j < self.shared else 10_000 * (i + 1) + j
            for j in range(self.prompt_len)
        ]


arrivals = st.builds(
    Arrival,
    at_step=st.integers(0, 30),
    prompt_len=st.integers(1, 80),
    max_tokens=st.integers(1, 20),
    priority=st.integers(0, 2),
    cancel_after=st.one_of(st.none(), st.none(), st.integers(0, 15)),
    stop_after=st.one_of(st.none(), st.none(), st.integers(1, 10)),
    prefix=st.integers(0, 2),
    shared=st.integers(0, 80),
)


@dataclass
class Run:
    config: GenerationConfig
    admitted: dict[int, Arrival] = field(default_factory=dict)
    finished: list[Finished] = field(default_factory=list)
    first_scheduled: list[int] = field(default_factory=list)  # ids, in first-run order
    refused: int = 0
    steps: int = 0


def run(config: GenerationConfig, workload: list[Arrival], max_steps: int = 5_000) -> Run:
    """Drive the scheduler on a virtual clock, checking the per-step invariants as it goes."""
    sched = Scheduler(config)
    out = Run(config)
    by_step: dict[int, list[tuple[int, Arrival]]] = {}
    for i, a in enumerate(workload):
        by_step.setdefault(a.at_step, []).append((i, a))
    cancel_at: dict[int, list[int]] = {}
    seen: set[int] = set()
    step = 0
    last_arrival = max((a.at_step for a in workload), default=0)
    while step <= last_arrival or sched.has_work:
        assert step < max_steps, f"no progress after {max_steps} steps: starvation or livelock"
        now = step * STEP_S
        for i, a in by_step.get(step, []):
            try:
                sched.add(
                    i, a.prompt_len, a.max_tokens, now, priority=a.priority, token_ids=a.tokens(i)
                )
            except LengthLimitError:
                out.refused += 1
                continue
            out.admitted[i] = a
            if a.cancel_after is not None:
                cancel_at.setdefault(step + a.cancel_after, []).append(i)
        for i in cancel_at.pop(step, []):
            done = sched.abort(i, "cancelled", now)
            if done is not None:
                out.finished.append(done)
        running_before = {s.id for s in sched._running}
        plan = sched.schedule(now)
        out.finished += plan.finished
        _check_plan(config, sched, plan, running_before)
        for e in plan.scheduled:
            if e.seq_id not in seen:
                seen.add(e.seq_id)
                out.first_scheduled.append(e.seq_id)
        if not plan.empty:
            stopped = [
                e.seq_id
                for e in plan.scheduled
                if e.samples
                and (a := out.admitted[e.seq_id]).stop_after is not None
                and sched.sequence(e.seq_id).num_output + 1 >= a.stop_after
            ]
            tokens = {e.seq_id: 1 for e in plan.scheduled}
            out.finished += sched.complete(plan, now + STEP_S * 0.9, tokens=tokens, stopped=stopped)
            out.steps += 1
            _check_kv(config, sched)
        step += 1
    return out


def _check_plan(config, sched, plan, running_before):
    ids = [e.seq_id for e in plan.scheduled]
    assert len(ids) == len(set(ids)), "a sequence twice in one step"
    assert plan.num_batched_tokens == sum(e.num_new_tokens for e in plan.scheduled)
    assert plan.num_batched_tokens <= config.max_num_batched_tokens
    assert len(ids) <= config.max_num_seqs
    assert sched.num_running <= config.max_num_seqs
    assert all(e.num_new_tokens >= 1 for e in plan.scheduled)
    if config.kv_limited:
        assert sched.kv_blocks_used <= config.num_kv_blocks
    if config.long_prefill_token_threshold:
        assert all(e.num_new_tokens <= config.long_prefill_token_threshold for e in plan.scheduled)
    running_before -= {f.seq_id for f in plan.finished}  # cancelled or timed out first
    new = set(ids) - running_before
    if new:
        # Running sequences come first: a waiting one joins only once every running one
        # is planned (or preempted, which stops admissions).
        assert running_before <= set(ids)
        assert not plan.preempted
        if config.strategy == "static":
            assert not running_before, "static took a sequence while its batch ran"


def _check_kv(config, sched):
    holders: dict[int, int] = {}
    for s in sched._running:
        for block in s.block_table:
            holders[block] = holders.get(block, 0) + 1
    assert len(holders) == sched.kv_blocks_used
    pool = sched.pool
    assert all(pool.refcount(b) == n for b, n in holders.items())  # shared blocks counted
    for s in sched._running:
        assert s.blocks == config.blocks_for(s.num_computed)
        for i in range(s.num_registered):  # a held block's key, if any, is its own tokens'
            assert pool.hash_of(s.block_table[i]) in (s.block_hashes[i], None)
        assert s.num_cached_tokens <= s.num_tokens - 1
    for block_hash, block in pool.cached().items():
        assert pool.hash_of(block) == block_hash


@settings(max_examples=300, deadline=None)
@given(configs(), st.lists(arrivals, max_size=25))
def test_every_sequence_gets_exactly_one_outcome_and_no_step_breaks_a_budget(config, workload):
    out = run(config, workload)
    ids = [f.seq_id for f in out.finished]
    assert len(ids) == len(set(ids)), "a sequence ended twice"
    assert set(ids) == set(out.admitted), "a sequence never ended"
    for f in out.finished:
        a = out.admitted[f.seq_id]
        n = len(f.token_times_s)
        assert n <= a.max_tokens
        if f.reason == "length":
            assert n == a.max_tokens
        elif f.reason == "stop":
            assert n == a.stop_after and n < a.max_tokens
        elif f.reason == "timeout":
            assert f.end_s - f.arrival_s >= config.request_timeout_s
        else:
            assert f.reason == "cancelled"
        assert list(f.token_times_s) == sorted(f.token_times_s)
        if config.request_timeout_s:
            # The timeout is checked at every step boundary: nothing outlives it by a step.
            assert f.end_s - f.arrival_s <= config.request_timeout_s + STEP_S


@settings(max_examples=200, deadline=None)
@given(configs(), st.lists(arrivals, max_size=25))
def test_fcfs_starts_sequences_in_arrival_order(config, workload):
    config = config.replace(scheduling_policy="fcfs", request_timeout_ms=0.0)
    for a in workload:
        a.cancel_after = None
    out = run(config, workload)
    order = [i for i in out.first_scheduled]
    # Admission ids grow with arrival (workload index within a step, step across steps).
    arrival_rank = {i: (a.at_step, i) for i, a in out.admitted.items()}
    assert order == sorted(order, key=arrival_rank.__getitem__)
    assert set(order) == set(out.admitted)  # nobody starved: all ran


@settings(max_examples=100, deadline=None)
@given(configs(), st.lists(arrivals, min_size=1, max_size=25))
def test_a_kv_budget_preempts_and_recomputes_without_losing_tokens(config, workload):
    config = config.replace(num_kv_blocks=6, block_size=4, request_timeout_ms=0.0)
    for a in workload:
        a.cancel_after = None
        a.stop_after = None
    out = run(config, workload)
    for f in out.finished:
        assert len(f.token_times_s) == out.admitted[f.seq_id].max_tokens
