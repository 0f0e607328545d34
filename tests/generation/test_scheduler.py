"""The scheduler's rules, one by one, on a virtual clock."""

from __future__ import annotations

import pytest

from labserve.base.errors import ConfigError, InputError, LengthLimitError, QueueFullError
from labserve.config.generation import GenerationConfig
from labserve.generation.scheduler import Scheduler


def step(sched, now, **kw):
    plan = sched.schedule(now)
    done = sched.complete(plan, now + 0.001, **kw) if not plan.empty else []
    return plan, done


def shares(plan):
    return [(e.seq_id, e.num_new_tokens, e.kind) for e in plan.scheduled]


def test_a_long_prompt_is_chunked_under_the_token_budget_and_samples_once_done():
    s = Scheduler(GenerationConfig(max_num_batched_tokens=32))
    s.add(1, prompt_len=100, max_tokens=3, now=0.0)
    counts = []
    for t in range(4):
        plan, _ = step(s, t)
        counts.append([(e.num_new_tokens, e.samples) for e in plan.scheduled])
    assert counts == [[(32, False)], [(32, False)], [(32, False)], [(4, True)]]
    plan, _ = step(s, 5)
    assert shares(plan) == [(1, 1, "decode")]


def test_running_decodes_go_first_then_waiting_prompts_fill_the_budget():
    s = Scheduler(GenerationConfig(max_num_batched_tokens=10))
    s.add(1, 4, 5, 0.0)
    s.add(2, 4, 5, 0.0)
    plan, _ = step(s, 0.0)
    assert shares(plan) == [(1, 4, "prefill"), (2, 4, "prefill")]
    s.add(3, 20, 5, 0.1)
    plan, _ = step(s, 0.1)
    # Two decodes, then the new prompt gets what is left of the budget: 8 of its 20.
    assert shares(plan) == [(1, 1, "decode"), (2, 1, "decode"), (3, 8, "prefill")]
    assert plan.stop_reason == "empty"
    s.add(4, 2, 5, 0.2)
    plan, _ = step(s, 0.2)
    assert plan.stop_reason == "token_budget"  # 4 waits: the budget went to 1, 2 and 3
    assert shares(plan) == [(1, 1, "decode"), (2, 1, "decode"), (3, 8, "prefill")]


def test_long_prefill_token_threshold_caps_one_sequences_chunk():
    s = Scheduler(GenerationConfig(max_num_batched_tokens=100, long_prefill_token_threshold=16))
    s.add(1, 40, 2, 0.0)
    s.add(2, 10, 2, 0.0)
    plan, _ = step(s, 0.0)
    assert shares(plan) == [(1, 16, "prefill"), (2, 10, "prefill")]


def test_max_num_seqs_caps_the_running_set():
    s = Scheduler(GenerationConfig(max_num_seqs=2))
    for i in range(3):
        s.add(i, 2, 3, 0.0)
    plan, _ = step(s, 0.0)
    assert [e.seq_id for e in plan.scheduled] == [0, 1]
    assert plan.stop_reason == "max_num_seqs"
    assert (s.num_running, s.num_waiting) == (2, 1)


def test_without_chunking_a_prompt_that_does_not_fit_waits_at_the_head_in_order():
    s = Scheduler(GenerationConfig(max_num_batched_tokens=10, enable_chunked_prefill=False))
    s.add(1, 5, 3, 0.0)
    step(s, 0.0)
    s.add(2, 10, 1, 0.1)  # fits a step alone, not beside a decode
    s.add(3, 2, 1, 0.1)  # would fit, but arrived after 2: FCFS keeps it behind
    plan, _ = step(s, 0.1)
    assert shares(plan) == [(1, 1, "decode")]
    assert plan.stop_reason == "token_budget"
    step(s, 0.2)  # 1 ends (max_tokens 3)
    plan, _ = step(s, 0.3)
    assert shares(plan) == [(2, 10, "prefill")]
    plan, _ = step(s, 0.4)
    assert shares(plan) == [(3, 2, "prefill")]


def test_kv_pressure_preempts_the_newest_running_sequence_which_is_recomputed():
    cfg = GenerationConfig(block_size=4, num_kv_blocks=4, max_num_batched_tokens=64)
    s = Scheduler(cfg)
    s.add(1, 4, 6, 0.0)  # 4 tokens: 1 block, growing to 9 tokens (3 blocks)
    s.add(2, 8, 6, 0.0)  # 8 tokens: 2 blocks
    plan, _ = step(s, 0.0)
    assert s.kv_blocks_used == 3
    # 1 decodes to 5 tokens (a 2nd block: 4 used); 2 then needs a 3rd block, none is free,
    # and 2 is the newest running sequence: it preempts itself.
    plan, _ = step(s, 0.1)
    assert plan.preempted == (2,)
    assert shares(plan) == [(1, 1, "decode")]
    assert plan.stop_reason == "preempted"
    seq = s.sequence(2)
    assert (seq.num_computed, seq.num_preemptions, s.num_waiting, s.kv_blocks_used) == (0, 1, 1, 2)
    plan, _ = step(s, 0.2)
    assert plan.stop_reason == "kv_blocks"  # 2's 9 tokens need 3 blocks; 2 are free
    finished, resumed, t = [], [], 0.3
    while s.has_work:
        plan, done = step(s, t)
        finished += done
        resumed += [shares(plan)] if any(e.kind == "resume" for e in plan.scheduled) else []
        t += 0.1
    # Once 1 ends, 2 recomputes its prompt and the output it had (8 + 1 tokens) in one go.
    assert resumed == [[(2, 9, "resume")]]
    assert {f.seq_id: len(f.token_times_s) for f in finished} == {1: 6, 2: 6}
    assert [f.num_preemptions for f in finished] == [0, 1]
    assert s.num_preemptions == 1


def test_priority_orders_the_waiting_queue_and_picks_the_lowest_priority_victim():
    cfg = GenerationConfig(scheduling_policy="priority", max_num_seqs=1)
    s = Scheduler(cfg)
    s.add(1, 2, 1, 0.0, priority=5)
    s.add(2, 2, 1, 0.1, priority=0)
    s.add(3, 2, 1, 0.2, priority=5)
    order = []
    t = 1.0
    while s.has_work:
        plan, _ = step(s, t)
        order += [e.seq_id for e in plan.scheduled]
        t += 1
    assert order == [2, 1, 3]


def test_static_runs_a_batch_until_its_longest_sequence_ends():
    s = Scheduler(GenerationConfig(strategy="static", max_num_seqs=2))
    s.add(1, 2, 1, 0.0)
    s.add(2, 2, 4, 0.0)
    s.add(3, 2, 1, 0.0)
    plan, _ = step(s, 0.0)  # 1 ends at once, but 3 waits for 2 to end
    assert [e.seq_id for e in plan.scheduled] == [1, 2]
    for t in (1, 2):
        plan, _ = step(s, t)
        assert [e.seq_id for e in plan.scheduled] == [2]
        assert plan.stop_reason == "batch"
    plan, _ = step(s, 3)
    assert [e.seq_id for e in plan.scheduled] == [2]
    plan, _ = step(s, 4)
    assert [e.seq_id for e in plan.scheduled] == [3]


def test_continuous_refills_a_slot_the_step_it_frees():
    s = Scheduler(GenerationConfig(max_num_seqs=2))
    s.add(1, 2, 1, 0.0)
    s.add(2, 2, 4, 0.0)
    s.add(3, 2, 1, 0.0)
    step(s, 0.0)
    plan, _ = step(s, 1)
    assert [e.seq_id for e in plan.scheduled] == [2, 3]


def test_a_cancelled_sequence_ends_at_once_and_drops_its_in_flight_token():
    s = Scheduler(GenerationConfig())
    s.add(1, 2, 10, 0.0)
    s.add(2, 2, 10, 0.0)
    plan = s.schedule(0.0)
    done = s.abort(1, "cancelled", 0.05)
    assert done is not None
    assert (done.seq_id, done.outcome, done.token_times_s, done.end_s) == (1, "cancelled", (), 0.05)
    assert s.abort(1, "cancelled", 0.06) is None  # once
    assert 1 not in s and s.num_running == 1 and s.kv_blocks_used == 1
    assert s.complete(plan, 0.1) == []  # the step it was in comes back: its token dropped
    assert s.sequence(2).num_output == 1
    # A waiting one is cancelled too, and never runs.
    s.add(3, 2, 10, 0.1)
    gone = s.abort(3, "cancelled", 0.1)
    assert gone is not None and gone.outcome == "cancelled"
    plan = s.schedule(0.2)
    assert plan.finished == () and [e.seq_id for e in plan.scheduled] == [2]
    assert s.num_waiting == 0


def test_request_timeout_covers_a_sequences_whole_life():
    s = Scheduler(GenerationConfig(request_timeout_ms=250))
    s.add(1, 2, 100, 0.0)
    t, finished = 0.0, []
    while s.has_work:
        plan = s.schedule(t)
        finished += plan.finished
        if not plan.empty:
            finished += s.complete(plan, t + 0.1)
        t += 0.1
    (f,) = finished
    assert (f.outcome, f.reason) == ("timeout", "timeout")
    assert f.end_s == pytest.approx(0.3)
    # The step planned at 0.2 (before the 0.25 deadline) ran; the boundary at 0.3 ended it.
    assert f.token_times_s == pytest.approx((0.1, 0.2, 0.3))


def test_a_failed_step_fails_only_the_sequences_named():
    s = Scheduler(GenerationConfig())
    s.add(1, 2, 5, 0.0)
    s.add(2, 2, 5, 0.0)
    plan = s.schedule(0.0)
    done = s.complete(plan, 0.1, failed={2})
    assert [(f.seq_id, f.outcome) for f in done] == [(2, "failed")]
    assert s.sequence(1).num_output == 1


def test_stop_ends_a_sequence_with_the_token_counted():
    s = Scheduler(GenerationConfig())
    s.add(1, 2, 5, 0.0)
    plan = s.schedule(0.0)
    (f,) = s.complete(plan, 0.1, stopped={1})
    assert (f.reason, len(f.token_times_s)) == ("stop", 1)


def test_a_config_change_applies_at_the_next_step():
    s = Scheduler(GenerationConfig(max_num_seqs=1))
    for i in range(3):
        s.add(i, 2, 5, 0.0)
    plan, _ = step(s, 0.0)
    s.configure(s.config.replace(max_num_seqs=3))
    assert s.config.max_num_seqs == 1
    plan, _ = step(s, 0.1)
    assert len(plan.scheduled) == 3


def test_step_records_count_prefill_and_decode_tokens():
    s = Scheduler(GenerationConfig())
    s.add(1, 5, 3, 0.0)
    step(s, 0.0)
    s.add(2, 7, 3, 0.1)
    step(s, 0.1)
    r = s.last_step
    assert (r.num_prefill_tokens, r.num_decode_tokens, r.num_seqs) == (7, 1, 2)
    assert (r.start_s, r.end_s, r.num_running, r.index) == (0.1, 0.101, 2, 1)


@pytest.mark.parametrize(
    ("cfg", "model_len", "prompt", "max_tokens", "error", "words"),
    [
        (GenerationConfig(), 64, 60, 10, LengthLimitError, "is 70, over the model's context"),
        (
            GenerationConfig(enable_chunked_prefill=False, max_num_batched_tokens=16),
            0,
            17,
            1,
            LengthLimitError,
            "is 17, over max_num_batched_tokens of 16",
        ),
        (
            GenerationConfig(num_kv_blocks=2, block_size=4),
            0,
            6,
            4,
            LengthLimitError,
            "KV blocks of 9 tokens (block_size 4) is 3, over num_kv_blocks of 2",
        ),
        (GenerationConfig(), 0, 4, 0, InputError, "max_tokens must be an integer >= 1, got 0"),
        (GenerationConfig(), 0, 0, 4, InputError, "length in tokens must be an integer >= 1"),
    ],
)
def test_admission_refuses_what_can_never_run_naming_value_and_limit(
    cfg, model_len, prompt, max_tokens, error, words
):
    s = Scheduler(cfg, max_model_len=model_len)
    s.add(99, 2, 2, 0.0)
    with pytest.raises(error) as e:
        s.add(1, prompt, max_tokens, 0.0)
    assert words in str(e.value)
    assert e.value.status == 400
    assert 1 not in s and s.num_waiting == 1  # the one running is untouched


def test_a_full_waiting_queue_refuses_at_admission():
    s = Scheduler(GenerationConfig(max_queue_size=1))
    s.add(1, 2, 2, 0.0)
    with pytest.raises(QueueFullError):
        s.add(2, 2, 2, 0.0)


def test_a_live_sequence_id_cannot_be_reused():
    s = Scheduler(GenerationConfig())
    s.add(1, 2, 2, 0.0)
    with pytest.raises(ValueError, match="live already"):
        s.add(1, 2, 2, 0.0)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs must be an integer >= 1, got 0"),
        ({"strategy": "orca"}, "strategy must be one of 'continuous', 'static', got 'orca'"),
        ({"enable_chunked_prefill": 1}, "enable_chunked_prefill must be true or false"),
        ({"ttft_slo_ms": -1}, "ttft_slo_ms must be a finite number of milliseconds >= 0"),
        ({"max_num_batched_tokns": 5}, "max_num_batched_tokns must be a known setting"),
    ],
)
def test_config_refuses_bad_values_naming_the_rule(changes, words):
    with pytest.raises(ConfigError) as e:
        GenerationConfig().replace(**changes)
    assert words in str(e.value)


def test_every_generation_setting_is_of_exactly_one_kind():
    from labserve.config.generation import (
        ARRIVAL_SETTINGS,
        GENERATION_SETTINGS,
        START_SETTINGS,
        STEP_SETTINGS,
    )

    kinds = [*ARRIVAL_SETTINGS, *STEP_SETTINGS, *START_SETTINGS]
    assert sorted(kinds) == sorted(GENERATION_SETTINGS) and len(set(kinds)) == len(kinds)


def test_an_arrival_setting_acts_on_the_next_arrival_before_any_step():
    s = Scheduler(GenerationConfig(request_timeout_ms=1000, max_queue_size=5))
    s.add(1, 2, 4, 0.0)
    s.configure(GenerationConfig(request_timeout_ms=100, max_queue_size=1))
    with pytest.raises(QueueFullError):
        s.add(2, 2, 4, 0.0)  # one waits already: the new max_queue_size acts at once
    s.configure(GenerationConfig(request_timeout_ms=100, max_queue_size=5))
    s.add(3, 2, 4, 0.0)
    assert (s.sequence(1).timeout_s, s.sequence(3).timeout_s) == (1.0, 0.1)
    assert [f.seq_id for f in s.expire(0.2)] == [3]  # 1 keeps the timeout it came with


def test_a_step_setting_that_strands_ends_those_sequences_at_the_next_step_typed():
    s = Scheduler(GenerationConfig(max_num_seqs=1, max_num_batched_tokens=64))
    s.add(1, 4, 8, 0.0)
    s.add(2, 40, 8, 0.0)  # waits for the seat
    s.add(3, 4, 8, 0.0)
    s.complete(s.schedule(0.0), 0.1)
    s.configure(s.config.replace(enable_chunked_prefill=False, max_num_batched_tokens=16))
    plan = s.schedule(0.1)
    (stranded,) = plan.finished
    assert (stranded.seq_id, stranded.outcome, stranded.reason) == (2, "refused", "stranded")
    assert isinstance(stranded.error, LengthLimitError)
    assert "chunked prefill is off" in str(stranded.error)
    assert 2 not in s and s.num_waiting == 1  # 3 is next, not stuck behind 2
