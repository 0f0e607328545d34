"""The continuous-batching driver, stepped on virtual time: the code a notebook runs.

A VirtualHost plays the loop; the model is a small deterministic step function (each
sampling sequence's next token is a function of its position), or a parked call that the
test releases, hangs or fails. A Hypothesis state machine checks the promises: every
admitted sequence ends exactly once, none is answered later than its timeout plus one tick
however long a step hangs, the model's state is freed for every ended sequence, and a stop
answers everyone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import labserve
from labserve.config.generation import GenerationConfig
from labserve.generation.batch import SeqBatch
from labserve.generation.sampling import SamplingParams, SequenceSampler, TextDecoder
from labserve.runtime.generation.driver import GenerationDriver, GenerativeModel, NewSequence
from labserve.runtime.generation.streams import End
from labserve.runtime.scheduling import MIN_TIMER_S
from labserve.runtime.virtual import VirtualHost

TICK = MIN_TIMER_S


@dataclass
class Recorded:
    """A stream the test reads without blocking: what the driver fed it, in order."""

    loop: Any = None
    pieces: list[str] = field(default_factory=list)
    ends: list[End] = field(default_factory=list)
    end_s: float | None = None
    clock: Any = None
    withdrawn: bool = False

    def feed(self, pieces: list[str], end: End | None) -> None:
        self.pieces += [p for p in pieces if p]
        if end is not None:
            self.ends.append(end)
            self.end_s = self.clock.now()


class StepModel:
    """Next token = (position + 1) % 256 as a byte; its state: the tokens each sequence holds."""

    def __init__(self, sched: VirtualHost | None = None, poison: int | None = None):
        self.sched = sched
        self.poison = poison
        self.cache: dict[int, int] = {}
        self.freed: list[int] = []
        self.rolled_back = 0
        self.calls: list[SeqBatch] = []

    def step(self, batch: SeqBatch) -> np.ndarray:
        self.calls.append(batch)
        for seq_id, tokens, start, _ in batch:
            assert self.cache.get(seq_id, 0) == start, "a step must start where the state ends"
            self.cache[seq_id] = start + len(tokens)
        if self.poison is not None and self.poison in batch.seq_ids:
            raise ValueError(f"poisoned by {self.poison}")
        if self.sched is not None:
            released = self.sched.park(batch)
            if released is not None:
                return released  # what the test released the step with
        return np.array(
            [(s + len(t)) % 256 for _, t, s, samples in batch if samples], dtype=np.int64
        )

    def free(self, ids):
        self.freed += list(ids)
        for i in ids:
            self.cache.pop(i, None)

    def rollback(self, batch: SeqBatch) -> None:
        self.rolled_back += 1
        for seq_id, _, start, _ in batch:
            if start == 0:
                self.cache.pop(seq_id, None)
            else:
                self.cache[seq_id] = start


def make(config: GenerationConfig, model: StepModel, sched: VirtualHost) -> GenerationDriver:
    return GenerationDriver(
        GenerativeModel(model.step, model.free, model.rollback),
        config,
        host=sched,
        runner="r",
        method="gen",
    )


def admit(driver, sched, prompt_len=3, max_tokens=4, **params) -> Recorded:
    stream = Recorded(clock=sched.clock)
    sampler = SequenceSampler(
        SamplingParams(max_tokens=max_tokens, temperature=0, **params),
        TextDecoder(token_bytes=lambda t: bytes((t,))),
    )
    live = NewSequence(list(range(65, 65 + prompt_len)), sampler, stream, sched.now())
    driver.submit_threadsafe(driver.new_id(), live)
    return stream


def test_arrivals_of_one_loop_iteration_share_the_first_step():
    sched = VirtualHost()
    model = StepModel()
    driver = make(GenerationConfig(), model, sched)
    streams = [admit(driver, sched, prompt_len=2 + i) for i in range(3)]
    sched.settle()
    assert [len(b) for b in model.calls[:1]] == [3]
    assert all(len(s.ends) == 1 and s.ends[0].finish.reason == "length" for s in streams)
    # Each token is the position after the prompt and the tokens before it.
    assert [s.ends[0].token_ids for s in streams] == [(2, 3, 4, 5), (3, 4, 5, 6), (4, 5, 6, 7)]
    assert sorted(model.freed) == [1, 2, 3] and model.cache == {}


def test_a_hung_step_is_answered_at_the_timeout_and_its_late_tokens_dropped():
    sched = VirtualHost(timers="late")
    model = StepModel(sched)
    driver = make(GenerationConfig(request_timeout_ms=50), model, sched)
    stream = admit(driver, sched)
    sched.settle()
    assert len(sched.parked) == 1  # the prefill hangs
    sched.advance(0.2)
    assert len(stream.ends) == 1
    assert isinstance(stream.ends[0].error, labserve.RequestTimeoutError)
    assert stream.end_s <= 0.050 + TICK + 1e-9
    sched.release(sched.parked[0], value=np.array([7]))
    sched.advance(0.01)
    assert len(stream.ends) == 1 and stream.pieces == []
    snap = driver.snapshot()
    assert snap.outcomes["timeout"] == 1 and snap.outcomes["served"] == 0
    assert model.cache == {}  # freed once the scheduler accounted for it


def test_a_withdrawn_sequence_is_freed_at_the_next_step_and_counted_cancelled():
    sched = VirtualHost()
    model = StepModel(sched)
    driver = make(GenerationConfig(), model, sched)
    stay, leave = admit(driver, sched, max_tokens=3), admit(driver, sched, max_tokens=3)
    sched.settle()
    driver.cancel_threadsafe(2)
    sched.release(sched.parked[0], value=np.array([1, 1]))  # the step both were in ends
    assert [c.seq_ids for c in model.calls] == [(1, 2), (1,)]  # the next step has only 1
    assert 2 in model.freed and leave.ends == []  # nobody listens to the one that left
    while sched.parked:
        sched.release(sched.parked[0], value=np.array([1]))
    assert stay.ends[0].finish.reason == "length"
    snap = driver.snapshot()
    assert snap.outcomes["cancelled"] == 1 and snap.outcomes["served"] == 1


@pytest.mark.parametrize("isolate", [False, True])
def test_a_step_that_raises_fails_its_sequences_or_only_the_poisoned_one(isolate):
    sched = VirtualHost()
    model = StepModel(poison=2)
    driver = make(GenerationConfig(isolate_errors=isolate), model, sched)
    streams = [admit(driver, sched) for _ in range(4)]
    sched.settle()
    failed = [isinstance(s.ends[0].error, labserve.ModelError) for s in streams]
    assert all(len(s.ends) == 1 for s in streams)
    assert failed == ([False, True, False, False] if isolate else [True] * 4)
    assert "poisoned by 2" in str(streams[1].ends[0].error)
    assert model.rolled_back >= 1 and model.cache == {}


def test_a_stop_token_and_a_stop_string_end_the_sequence_without_their_text():
    sched = VirtualHost()
    driver = make(GenerationConfig(), StepModel(), sched)
    # Prompt "ABC" (3 tokens): the model then says bytes 3, 4, 5, ... ; ask to stop at 5.
    by_id = admit(driver, sched, max_tokens=8, stop_token_ids=(5,))
    by_text = admit(driver, sched, max_tokens=8, stop=("\x05\x06",))
    sched.settle()
    assert by_id.ends[0].finish.reason == "stop" and by_id.ends[0].token_ids == (3, 4, 5)
    assert "".join(by_id.pieces) == "\x03\x04"
    assert by_text.ends[0].finish.reason == "stop" and "".join(by_text.pieces) == "\x03\x04"


def test_abort_answers_every_live_sequence_stopped():
    sched = VirtualHost()
    model = StepModel(sched)
    driver = make(GenerationConfig(max_num_seqs=1), model, sched)
    streams = [admit(driver, sched) for _ in range(3)]
    sched.settle()
    driver.abort()
    assert all(isinstance(s.ends[0].error, labserve.RunnerStoppedError) for s in streams)
    sched.release(sched.parked[0], value=np.array([0]))
    assert all(len(s.ends) == 1 for s in streams)
    late = admit(driver, sched)
    sched.settle()
    assert isinstance(late.ends[0].error, labserve.RunnerStoppedError)


def test_a_refusal_at_admission_is_the_streams_typed_error():
    sched = VirtualHost()
    driver = make(GenerationConfig(max_queue_size=1, max_num_seqs=1), StepModel(sched), sched)
    admit(driver, sched)  # runs
    sched.settle()
    admit(driver, sched)  # waits
    sched.settle()
    refused = admit(driver, sched)
    sched.settle()
    assert isinstance(refused.ends[0].error, labserve.QueueFullError)
    assert driver.snapshot().outcomes["refused"] == 1


# -- the state machine ---------------------------------------------------------------------


def _logits(batch: SeqBatch, nan: set[int] = frozenset()) -> np.ndarray:  # type: ignore[assignment]
    """StepModel's next tokens as logits rows (one-hot); a NaN row for a sequence in ``nan``."""
    rows = [(i, (s + len(t)) % 256) for i, t, s, ok in batch if ok]
    out = np.zeros((len(rows), 256))
    for k, (seq_id, token) in enumerate(rows):
        out[k, token] = np.nan if seq_id in nan else 1.0
    return out


def _poisoned_decoder(token: int) -> bytes:
    raise UnicodeError(f"this sequence's detokeniser breaks on {token}")


def runnable(seq, config: GenerationConfig) -> bool:
    """Whether ``config`` can ever run ``seq`` to its end (the scheduler's rule, restated)."""
    if not config.enable_chunked_prefill and seq.status == "waiting":
        if seq.prompt_len > config.max_num_batched_tokens:
            return False
    need = config.blocks_for(seq.prompt_len + seq.max_tokens - 1)
    return not config.kv_limited or need <= config.num_kv_blocks


class GenerationMachine(RuleBasedStateMachine):
    """The driver on virtual time, its steps hung until a rule ends them."""

    def __init__(self) -> None:
        super().__init__()
        self.sched = VirtualHost(timers="late")
        self.model = StepModel(self.sched)
        self.driver = make(
            GenerationConfig(
                max_num_seqs=3, max_num_batched_tokens=8, block_size=4, request_timeout_ms=40.0
            ),
            self.model,
            self.sched,
        )
        self.streams: dict[int, tuple[Recorded, float, float]] = {}  # stream, admitted, timeout
        self.withdrawn: set[int] = set()
        self.poisoned: set[int] = set()  # their own sampling fails (NaN row or detokeniser)
        self.nan: set[int] = set()
        self.step_failed: set[int] = set()  # in a step the model raised for
        self.calls_at_stop: int | None = None

    @rule(
        prompt=st.integers(1, 12),
        max_tokens=st.integers(1, 6),
        poison=st.sampled_from([None, None, None, "nan", "text"]),
    )
    def admit(self, prompt, max_tokens, poison):
        seq_id = len(self.streams) + 1
        stream = Recorded(clock=self.sched.clock)
        decoder = _poisoned_decoder if poison == "text" else (lambda t: bytes((t,)))
        sampler = SequenceSampler(
            SamplingParams(max_tokens=max_tokens, temperature=0), TextDecoder(decoder)
        )
        timeout_s = self.driver.config.request_timeout_s  # the one in force for arrivals
        new = NewSequence(list(range(65, 65 + prompt)), sampler, stream, self.sched.now())
        self.driver.submit_threadsafe(self.driver.new_id(), new)
        self.streams[seq_id] = (stream, self.sched.now(), timeout_s)
        if poison is not None:
            self.poisoned.add(seq_id)
        if poison == "nan":
            self.nan.add(seq_id)
        self.sched.settle()

    @precondition(lambda self: self.sched.parked)
    @rule(fail=st.sampled_from([False, False, False, True]))
    def finish_step(self, fail):
        call = self.sched.parked[0]
        batch = call.args[0]
        if fail:
            self.step_failed.update(batch.seq_ids)
        value = _logits(batch, self.nan)
        self.sched.release(call, error=RuntimeError("boom") if fail else None, value=value)

    @rule(dt=st.sampled_from([0.001, 0.005, 0.03]))
    def advance(self, dt):
        self.sched.advance(dt)

    @precondition(lambda self: self.streams)
    @rule(data=st.data())
    def withdraw(self, data):
        seq_id = data.draw(st.sampled_from(sorted(self.streams)))
        self.withdrawn.add(seq_id)
        self.driver.cancel_threadsafe(seq_id)
        self.sched.settle()

    @rule(
        max_num_seqs=st.integers(1, 4),
        budget=st.integers(4, 16),
        chunked=st.booleans(),
        kv=st.sampled_from([0, 0, 2, 3, 5]),
        timeout_ms=st.sampled_from([20.0, 40.0, 100.0]),
    )
    def configure(self, max_num_seqs, budget, chunked, kv, timeout_ms):
        self.driver.configure(
            self.driver.config.replace(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=budget,
                enable_chunked_prefill=chunked,
                num_kv_blocks=kv,
                request_timeout_ms=timeout_ms,
            )
        )
        self.sched.settle()

    @rule(timeout_ms=st.sampled_from([5.0, 20.0, 100.0]))
    def set_timeout(self, timeout_ms):
        # An arrival setting: it must act on the next arrival, even while a step hangs.
        self.driver.configure(self.driver.config.replace(request_timeout_ms=timeout_ms))
        self.sched.settle()

    @precondition(lambda self: self.calls_at_stop is None)
    @rule()
    def stop(self):
        self.driver.abort()
        self.calls_at_stop = len(self.model.calls)
        self.sched.settle()

    @invariant()
    def each_sequence_ends_at_most_once_and_in_time(self):
        now = self.sched.now()
        for seq_id, (stream, admitted_s, timeout_s) in self.streams.items():
            assert len(stream.ends) <= 1
            if seq_id in self.withdrawn:
                continue
            due_s = admitted_s + timeout_s + TICK + 1e-9
            if now > due_s:
                assert len(stream.ends) == 1, f"sequence {seq_id} unanswered past its timeout"
            if stream.ends:
                assert stream.end_s <= due_s, f"sequence {seq_id} answered past its timeout"

    @invariant()
    def only_a_poisoned_sequence_or_a_failed_step_fails_it(self):
        for seq_id, (stream, _, _) in self.streams.items():
            end = stream.ends[0] if stream.ends else None
            if end is not None and isinstance(end.error, labserve.ModelError):
                assert seq_id in self.poisoned | self.step_failed, (
                    f"sequence {seq_id} failed for a neighbour: {end.error}"
                )
            if end is not None and seq_id in self.poisoned:
                assert end.finish is None, f"sequence {seq_id} was served from a poisoned row"

    @invariant()
    def no_step_starts_after_stop(self):
        if self.calls_at_stop is not None:
            assert len(self.model.calls) == self.calls_at_stop, "a step started after stop"

    @invariant()
    def no_sequence_stays_that_the_config_can_never_run(self):
        if self.calls_at_stop is not None:
            return  # no step comes after a stop
        scheduler = self.driver.scheduler
        config = scheduler.config
        if scheduler.latest_config is not config:  # a change waits for the next step
            assert self.driver.step_in_flight, "a config change was not applied"
            return
        stranded = [s.id for s in scheduler.live() if not runnable(s, config)]
        assert not stranded, f"sequences {stranded} can never run under the config in force"

    def teardown(self):
        # Let every step end and every timer fire: all sequences end, all state is freed.
        for _ in range(200):
            while self.sched.parked:
                call = self.sched.parked[0]
                self.sched.release(call, value=_logits(call.args[0], self.nan))
            self.sched.advance(0.01)
        for seq_id, (stream, _, _) in self.streams.items():
            ends = len(stream.ends)
            assert ends <= 1, f"sequence {seq_id} ended {ends} times"
            assert ends == 1 or seq_id in self.withdrawn, f"sequence {seq_id} never ended"
            end = stream.ends[0] if stream.ends else None
            if end is not None and isinstance(end.error, labserve.LengthLimitError):
                assert end.error.status == 400  # stranded: the error admission would give
        snap = self.driver.snapshot()
        ended = sum(snap.outcomes[k] for k in ("served", "cancelled", "timeout", "failed"))
        stopped = sum(
            1
            for stream, _, _ in self.streams.values()
            if stream.ends and isinstance(stream.ends[0].error, labserve.RunnerStoppedError)
        )
        counted = ended + snap.outcomes["refused"]
        assert counted + stopped >= len(self.streams) >= counted
        assert self.model.cache == {}, "the model's state of an ended sequence was not freed"
        assert self.sched.errors == []


TestGenerationMachine = GenerationMachine.TestCase
TestGenerationMachine.settings = settings(
    max_examples=80,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

BUG_HUNT = settings(  # deterministic, so that scripts/bug_hunt.py says the same every run
    derandomize=True,
    max_examples=1500,
    stateful_step_count=30,
    deadline=None,
    database=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- the same machine on a model that stores K/V in labserve's blocks --------------------------


class PagedStepModel(StepModel):
    """StepModel storing, in labserve's blocks, what each slot holds: (token id, position).

    Each step first checks that every earlier position of each sequence, read through its
    block table, holds that sequence's own token at that position (``tokens_of`` gives its
    ids): a block handed to someone else while its owner still needed it shows here as
    another sequence's tokens; a prefix-cache hit (a block another sequence wrote with the
    same tokens) passes, as it should.
    """

    def __init__(self, sched: VirtualHost | None = None, poison: int | None = None):
        super().__init__(sched, poison)
        self.store = np.zeros((0, 2), np.int64)
        self.block_size = 0
        self.tokens_of: Any = None  # seq id -> its token ids (the scheduler's record)

    def allocate_kv(self, num_blocks: int, block_size: int) -> list[np.ndarray]:
        assert self.store.size == 0, "allocate_kv is called once"
        self.store = np.full((num_blocks * block_size, 2), -1, np.int64)
        self.block_size = block_size
        return [self.store]

    def step(self, batch: SeqBatch) -> np.ndarray:
        self.calls.append(batch)
        size = batch.block_size
        assert size == self.block_size and len(batch.block_tables) == len(batch)
        for row, (seq_id, tokens, start, _) in enumerate(batch):
            table = np.asarray(batch.block_tables[row], np.int64)
            assert len(table) == -(-(start + len(tokens)) // size), "a table covers the step"
            past = np.arange(start)
            held = self.store[table[past // size] * size + past % size]
            own = np.asarray(self.tokens_of(seq_id)[:start], np.int64)
            assert (held[:, 0] == own).all() and (held[:, 1] == past).all(), (
                f"sequence {seq_id}'s K/V were overwritten by another sequence"
            )
            new = start + np.arange(len(tokens))
            self.store[batch.slots(row)] = np.stack([np.asarray(tokens, np.int64), new], 1)
        if self.poison is not None and self.poison in batch.seq_ids:
            raise ValueError(f"poisoned by {self.poison}")
        if self.sched is not None:
            released = self.sched.park(batch)
            if released is not None:
                return released
        return np.array(
            [(s + len(t)) % 256 for _, t, s, samples in batch if samples], dtype=np.int64
        )


POOL_BLOCKS = 12


def make_paged(
    config: GenerationConfig, model: PagedStepModel, sched: VirtualHost
) -> GenerationDriver:
    driver = GenerationDriver(
        GenerativeModel(model.step, allocate_kv=model.allocate_kv),
        config,
        host=sched,
        runner="r",
        method="gen",
        kv_pool_blocks=POOL_BLOCKS,
    )
    model.tokens_of = lambda seq_id: driver.scheduler.sequence(seq_id).token_ids
    return driver


class PagedGenerationMachine(GenerationMachine):
    """The machine above on a paged model: the block pool's promises, checked at each step."""

    def __init__(self) -> None:
        super().__init__()
        self.model = PagedStepModel(self.sched)
        self.driver = make_paged(
            GenerationConfig(
                max_num_seqs=3, max_num_batched_tokens=8, block_size=4, request_timeout_ms=40.0
            ),
            self.model,
            self.sched,
        )
        self.seen: dict[int, Any] = {}  # every sequence record met, to check the ended ones

    @rule(
        max_num_seqs=st.integers(1, 4),
        budget=st.integers(4, 16),
        chunked=st.booleans(),
        timeout_ms=st.sampled_from([20.0, 40.0, 100.0]),
        caching=st.booleans(),
    )
    def configure(self, max_num_seqs, budget, chunked, timeout_ms, caching):  # type: ignore[override]
        # num_kv_blocks is a start-time setting here: the pool is the model's memory.
        self.driver.configure(
            self.driver.config.replace(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=budget,
                enable_chunked_prefill=chunked,
                request_timeout_ms=timeout_ms,
                enable_prefix_caching=caching,
            )
        )
        self.sched.settle()

    @invariant()
    def every_block_is_free_parked_or_held_by_one_live_sequence(self):
        scheduler = self.driver.scheduler
        pool = scheduler.pool
        live = scheduler.live()
        self.seen.update((s.id, s) for s in live)
        owners: dict[int, list[int]] = {}  # more than one: a prefix-cache hit, shared
        for seq in live:
            for block in seq.block_table:
                owners.setdefault(block, []).append(seq.id)
                assert not pool.is_free(block), f"block {block} of {seq.id} is on the free queue"
        assert pool.num_used == len(owners)
        free = sum(pool.is_free(b) for b in range(POOL_BLOCKS))
        assert free + pool.num_parked + len(owners) == POOL_BLOCKS, "a block is lost"
        for b in range(POOL_BLOCKS):
            assert pool.refcount(b) == len(owners.get(b, ())), f"block {b}: {owners.get(b)}"
            if len(owners.get(b, ())) > 1:
                assert pool.hash_of(b) is not None, f"block {b} shared but not cached"
        assert scheduler.kv_blocks_used == pool.num_used

    @invariant()
    def an_ended_sequence_holds_no_block(self):
        for seq in self.seen.values():
            if seq.finished:
                assert seq.block_table == [], f"ended sequence {seq.id} holds blocks"

    @invariant()
    def no_block_of_the_step_in_flight_is_given_to_another_sequence(self):
        if not self.sched.parked:
            return
        batch = self.sched.parked[0].args[0]
        scheduler = self.driver.scheduler
        mine: dict[int, set[int]] = {}
        for i, t in zip(batch.seq_ids, batch.block_tables, strict=True):
            for b in t:
                mine.setdefault(b, set()).add(i)
        for block, seq_ids in mine.items():
            assert not scheduler.pool.is_free(block), (
                f"block {block} of sequence {seq_ids}, whose step is in flight, is free"
            )
        for seq in scheduler.live():
            for block in seq.block_table:
                if block in mine:  # or shared with it: a cached block both hit
                    assert seq.id in mine[block] or scheduler.pool.hash_of(block) is not None, (
                        f"block {block} of {mine[block]}'s step in flight was given to {seq.id}"
                    )

    def teardown(self):
        super().teardown()
        pool = self.driver.scheduler.pool
        assert pool.num_used == 0 and pool.num_parked == 0, "blocks outlived their sequences"
        assert pool.num_free == POOL_BLOCKS


TestPagedGenerationMachine = PagedGenerationMachine.TestCase
TestPagedGenerationMachine.settings = settings(
    max_examples=80,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_the_paged_machine_finds_blocks_freed_under_a_step_in_flight(monkeypatch):
    # The bug it must find: a sequence that ends while its step runs gives its blocks
    # straight back to the free queue, where the next sequence may get them while the
    # model still writes into them.
    from labserve.generation.blocks import BlockPool

    monkeypatch.setattr(BlockPool, "step_started", lambda self: None)
    with pytest.raises(AssertionError, match="whose step is in flight, is free"):
        run_state_machine_as_test(PagedGenerationMachine, settings=BUG_HUNT)


def test_the_model_gets_its_blocks_and_kv_bytes_are_the_arrays_it_allocated():
    sched = VirtualHost()
    model = PagedStepModel()
    driver = make_paged(GenerationConfig(block_size=4), model, sched)
    snap = driver.snapshot()
    assert snap.kv_memory == "model" and snap.kv_blocks_total == POOL_BLOCKS
    assert snap.kv_bytes == model.store.nbytes == POOL_BLOCKS * 4 * 2 * 8
    streams = [admit(driver, sched, prompt_len=5, max_tokens=4) for _ in range(2)]
    sched.settle()
    assert all(s.ends[0].finish.reason == "length" for s in streams)
    first = model.calls[0]
    assert first.block_size == 4 and [len(t) for t in first.block_tables] == [2, 2]
    assert set(first.block_tables[0]).isdisjoint(first.block_tables[1])
    assert driver.snapshot().kv_blocks_used == 0  # all given back


def test_a_paged_model_is_bisected_without_a_rollback_hook():
    sched = VirtualHost()
    model = PagedStepModel(poison=2)
    driver = make_paged(GenerationConfig(block_size=4, isolate_errors=True), model, sched)
    streams = [admit(driver, sched) for _ in range(4)]
    sched.settle()
    failed = [isinstance(s.ends[0].error, labserve.ModelError) for s in streams]
    assert failed == [False, True, False, False]  # retried halves rewrote their slots
    assert driver.scheduler.pool.num_used == 0


def test_a_model_with_its_own_caches_is_told_its_kv_figures_are_an_account():
    sched = VirtualHost()
    driver = make(GenerationConfig(num_kv_blocks=7), StepModel(), sched)
    snap = driver.snapshot()
    assert snap.kv_memory == "accounting" and snap.kv_bytes == 0
    assert snap.kv_blocks_total == 7 and snap.as_dict()["kv_memory"] == "accounting"


def test_the_machine_finds_a_hung_step_whose_callers_wait_past_their_timeout(monkeypatch):
    # The bug it must find: only the scheduler's own expiry (at the next step) answers a
    # timeout, so a caller whose step hangs waits for the model.
    monkeypatch.setattr(GenerationDriver, "_on_deadline", lambda self, due_s: None)
    with pytest.raises(AssertionError, match="unanswered past its timeout"):
        run_state_machine_as_test(GenerationMachine, settings=BUG_HUNT)


def test_a_hook_that_raises_in_the_worker_fails_the_step_instead_of_losing_it():
    sched = VirtualHost()
    model = StepModel()
    driver = make(GenerationConfig(), model, sched)

    def broken(token):
        raise UnicodeError("the detokeniser broke")

    stream = Recorded(clock=sched.clock)
    sampler = SequenceSampler(SamplingParams(max_tokens=3, temperature=0), TextDecoder(broken))
    driver.submit_threadsafe(driver.new_id(), NewSequence([65, 66], sampler, stream, 0.0))
    sched.settle()
    assert isinstance(stream.ends[0].error, labserve.ModelError)
    assert "the detokeniser broke" in str(stream.ends[0].error)
    healthy = admit(driver, sched)
    sched.settle()
    assert healthy.ends[0].finish.reason == "length" and sched.errors == []


def test_a_timeout_change_reaches_the_next_arrival_at_once_even_while_a_step_hangs():
    sched = VirtualHost()
    model = StepModel(sched)
    driver = make(GenerationConfig(request_timeout_ms=20_000), model, sched)
    admit(driver, sched)
    sched.settle()
    assert len(sched.parked) == 1  # the step hangs
    driver.configure(driver.config.replace(request_timeout_ms=500))
    late = admit(driver, sched)
    sched.settle()
    sched.advance(0.6)
    assert isinstance(late.ends[0].error, labserve.RequestTimeoutError)
    assert late.end_s == pytest.approx(0.5, abs=TICK)
    assert "500" in str(late.ends[0].error)
    # Raised again while idle: the next arrival gets the new, longer one.
    sched.release(sched.parked[0], error=RuntimeError("let it go"))
    sched.settle()
    driver.configure(driver.config.replace(request_timeout_ms=60_000))
    patient = admit(driver, sched, max_tokens=2)
    sched.settle()
    sched.advance(1.0)
    assert patient.ends == [] and len(sched.parked) == 1
    while sched.parked:
        sched.release(sched.parked[0], value=np.array([1]))
    assert patient.ends[0].finish.reason == "length"


def test_a_paged_prefix_hit_reads_the_same_tokens_another_sequence_wrote():
    sched = VirtualHost()
    model = PagedStepModel()
    driver = make_paged(GenerationConfig(block_size=4), model, sched)
    first = admit(driver, sched, prompt_len=9, max_tokens=2)
    sched.settle()
    second = admit(driver, sched, prompt_len=9, max_tokens=2)  # the model checks each slot
    sched.settle()
    assert first.ends[0].token_ids == second.ends[0].token_ids
    assert driver.scheduler.prefix_cache_hits == 8  # two full blocks of the 9-token prompt
    assert model.calls[-2].starts == (8,)  # its prefill computed the last prompt token only
