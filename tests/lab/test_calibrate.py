"""calibrate: a StepCost fitted to a run's step spans (start to next start), with residuals.

Synthetic runs come from the simulator on a known cost; the live one is the real driver on
a VirtualHost whose model advances virtual time by a known cost and whose hand-back from
the worker to the loop costs a known extra, so the fit must price the whole step, not the
model alone. No wall clock anywhere.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np
import pytest

import labserve
from labserve.config.generation import GenerationConfig
from labserve.generation.batch import SeqBatch
from labserve.generation.results import StepSeries
from labserve.generation.sampling import SamplingParams, SequenceSampler, TextDecoder
from labserve.lab.generation.calibrate import MIN_STEPS, SPREAD_QUANTILES, calibrate
from labserve.lab.steps import profile_steps
from labserve.runtime.generation.driver import GenerationDriver, GenerativeModel, NewSequence
from labserve.runtime.virtual import VirtualHost
from labserve.sim.generation import StepCost, simulate_generation

TRUE = StepCost(fixed_ms=0.8, per_seq_ms=0.06, per_batched_token_ms=0.02, per_context_token_ms=5e-5)
HOP_S = 0.0004  # the worker-to-loop hand-off a live step pays after the model returns


def busy_run(cost: StepCost = TRUE, seed: int = 0, n: int = 300) -> labserve.GenerationResult:
    """A run with every kind of step: prefills, chunks, decodes, from 1 to 32 sequences."""
    return simulate_generation(
        GenerationConfig(max_num_batched_tokens=256),
        cost,
        n_requests=n,
        input_len="uniform:4:300",
        output_len="uniform:2:64",
        rate=150.0,
        seed=seed,
    )


def test_calibrate_recovers_the_cost_of_a_simulated_run():
    run = busy_run()
    cal = calibrate(run)
    terms = ("fixed_ms", "per_seq_ms", "per_batched_token_ms", "per_context_token_ms")
    for field in terms:
        assert getattr(cal.cost, field) == pytest.approx(getattr(TRUE, field), rel=1e-6), field
    assert cal.rank == 4
    assert cal.rms_ms == pytest.approx(0.0, abs=1e-9)
    assert np.abs(np.asarray(cal.cost.spread) - 1.0).max() < 1e-9  # every step typical
    assert len(cal.measured_ms) + cal.skipped == len(run.steps)


def test_calibrate_from_noisy_spans_is_within_tolerance_and_reports_the_noise():
    steps = busy_run().steps
    rng = np.random.default_rng(7)
    noise_ms = 0.05
    # Each span gets its own noise: the starts move by the running sum of the noise.
    jitter = np.cumsum(rng.normal(0.0, noise_ms / 1000.0, len(steps)))
    shifted = dataclasses.replace(steps, start_s=steps.start_s + jitter, end_s=steps.end_s + jitter)
    cal = calibrate(shifted)
    assert cal.cost.fixed_ms == pytest.approx(TRUE.fixed_ms, rel=0.05)
    assert cal.cost.per_batched_token_ms == pytest.approx(TRUE.per_batched_token_ms, rel=0.05)
    assert cal.cost.per_seq_ms == pytest.approx(TRUE.per_seq_ms, rel=0.25)
    # A span's noise is one increment of the running sum: the residuals carry it.
    assert cal.rms_ms == pytest.approx(noise_ms, rel=0.15)
    assert abs(cal.residuals_ms.mean()) < 0.01  # least squares with a fixed term: no bias
    text = repr(cal)
    assert f"residuals rms {cal.rms_ms:.3f} ms" in text
    assert f"{cal.cost.fixed_ms:.3f} ms + " in text and f"from {len(cal.measured_ms)} steps" in text
    assert "decode" in cal.table() and "prefill" in cal.table()


def test_steps_followed_by_idle_time_are_skipped_not_fitted():
    run = simulate_generation(
        GenerationConfig(), TRUE, n_requests=40, input_len=16, output_len=8, rate=5.0, seed=3
    )
    steps = run.steps
    idle_after = int((~steps.chained).sum())
    assert idle_after > 5  # at 5 req/s each request mostly runs alone, then idles
    cal = calibrate(steps)
    assert cal.skipped == idle_after
    # Had the idle spans been fitted, the fixed term would carry seconds of idle time.
    assert cal.cost.fixed_ms == pytest.approx(TRUE.fixed_ms, rel=1e-6)


def test_too_few_chained_steps_and_wrong_input_are_refused():
    run = simulate_generation(GenerationConfig(), TRUE, n_requests=1, input_len=4, output_len=3)
    with pytest.raises(ValueError, match=f"at least {MIN_STEPS} steps"):
        calibrate(run.steps)
    with pytest.raises(TypeError, match="StepSeries"):
        calibrate([1.0, 2.0])  # type: ignore[list-item]


def test_span_is_start_to_next_start_and_nan_after_idle():
    records = busy_run().steps
    spans = records.span_s
    chained = records.chained
    assert not chained[-1] and np.isnan(spans[-1])
    i = int(np.flatnonzero(chained)[0])
    assert spans[i] == pytest.approx(records.start_s[i + 1] - records.start_s[i])
    assert np.isnan(spans[~chained]).all()
    assert isinstance(records, StepSeries)


# -- the live driver on virtual time ---------------------------------------------------------


class SlowHandBackHost(VirtualHost):
    """A virtual loop on which each callback handed over from a worker thread (a step coming
    back) starts HOP_S later: the loop's wake-up and the GIL a real hand-off waits for."""

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        if threading.current_thread() is threading.main_thread():
            super().call_soon_threadsafe(fn, *args)
            return

        def late(*a: Any) -> None:
            self.clock.advance(HOP_S)
            fn(*a)

        super().call_soon_threadsafe(late, *args)


class CostedModel:
    """Advances virtual time by TRUE's price of each step; next token = position % 256."""

    vocab_size = 256

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.cached: dict[int, int] = {}

    def step(self, batch: SeqBatch) -> np.ndarray:
        context = 0
        for seq_id, tokens, start, _ in batch:
            self.cached[seq_id] = start + len(tokens)
            context += len(tokens) * start + len(tokens) * (len(tokens) + 1) // 2
        self.clock.advance(TRUE.seconds(len(batch), batch.num_tokens, context))
        return np.array([(s + len(t)) % 256 for _, t, s, samples in batch if samples], np.int64)

    generate = step

    def free_sequences(self, ids: Any) -> None:
        for i in ids:
            self.cached.pop(i, None)

    def rollback_step(self, batch: SeqBatch) -> None:
        for seq_id, start in zip(batch.seq_ids, batch.starts, strict=True):
            self.cached[seq_id] = start


class Stream:
    """A stream the driver feeds; the test only counts its ends."""

    loop = None
    withdrawn = False

    def __init__(self) -> None:
        self.ends: list[Any] = []

    def feed(self, pieces: list[str], end: Any) -> None:
        if end is not None:
            self.ends.append(end)


def test_a_live_step_profile_includes_the_hand_back_not_only_the_model():
    host = SlowHandBackHost()
    model = CostedModel(host.clock)
    config = GenerationConfig(max_num_seqs=12, max_num_batched_tokens=48)
    driver = GenerationDriver(
        GenerativeModel(model.step, model.free_sequences, model.rollback_step),
        config,
        host=host,
        runner="r",
        method="gen",
    )
    rng = np.random.default_rng(1)
    streams = []
    for _ in range(3):  # three waves, each more than the step takes at once
        for _ in range(30):
            sampler = SequenceSampler(
                SamplingParams(max_tokens=int(rng.integers(1, 40)), temperature=0),
                TextDecoder(token_bytes=lambda t: bytes((t,))),
            )
            stream = Stream()
            prompt = rng.integers(0, 256, int(rng.integers(1, 90))).tolist()
            driver.submit_threadsafe(
                driver.new_id(), NewSequence(prompt, sampler, stream, host.now())
            )
            streams.append(stream)
        host.advance(1.0)
    assert host.errors == []
    assert all(len(s.ends) == 1 for s in streams)  # every sequence ended once

    cal = calibrate(driver.snapshot())
    assert cal.rank == 4
    # The whole step: the model's fixed cost plus the hand-back; the rest is the model's.
    assert cal.cost.fixed_ms == pytest.approx(TRUE.fixed_ms + HOP_S * 1000.0, rel=1e-6)
    assert cal.cost.per_seq_ms == pytest.approx(TRUE.per_seq_ms, rel=1e-6)
    assert cal.cost.per_batched_token_ms == pytest.approx(TRUE.per_batched_token_ms, rel=1e-6)
    assert cal.cost.per_context_token_ms == pytest.approx(TRUE.per_context_token_ms, rel=1e-6)
    assert cal.skipped == 3  # the last step of each wave was followed by idle time

    # The model alone (profile_steps) misses the hand-back: what the simulator lacked.
    alone = profile_steps(CostedModel(host.clock), repeats=1, warmup=0, timer=host.now)
    assert alone.fit.fixed_ms == pytest.approx(TRUE.fixed_ms, rel=1e-6)


def test_the_spread_over_the_typical_step_is_the_runs_own_and_keeps_the_mean():
    # Steps of a run: their typical cost, and one step in twenty stalled 4-12x as long.
    stalls = tuple(float(v) for v in np.r_[np.ones(95), np.linspace(4.0, 12.0, 6)])
    stalling = dataclasses.replace(TRUE, spread=stalls)
    run = busy_run(stalling, n=1500)
    cal = calibrate(run)
    assert len(cal.measured_ms) > 1500  # some 80 stalls
    # The typical step is fitted without the stalls; least squares over all would not be.
    assert cal.cost.fixed_ms == pytest.approx(TRUE.fixed_ms, rel=0.02)
    assert cal.cost.per_batched_token_ms == pytest.approx(TRUE.per_batched_token_ms, rel=0.02)
    blocks = [cal.cost.block_of(t) for t in (0.0, *cal.cost.spread_edges_ms)]
    assert len(cal.cost.spread) == SPREAD_QUANTILES * len(blocks)
    for q in blocks:  # every size stalled alike: each has the run's tail
        assert q[50] == pytest.approx(1.0, abs=1e-6)
        assert q[-1] == pytest.approx(12.0, rel=0.15) and q[-3] > 3.0
    assert 0.03 < (~cal.typical).mean() < 0.08
    # The model's mean step (typical x its size's mean factor) is about the measured mean.
    drawn = [t * np.mean(cal.cost.block_of(t / 1000.0)) for t in cal.predicted_ms.tolist()]
    assert np.mean(drawn) == pytest.approx(cal.measured_ms.mean(), rel=0.1)
    assert "off the typical fit" in repr(cal)
    # Replayed with the spread, the steps spread as measured: the same tail.
    again = calibrate(busy_run(cal.cost, n=1500, seed=1))
    assert np.percentile(again.measured_ms, 99) == pytest.approx(
        np.percentile(cal.measured_ms, 99), rel=0.25
    )


def test_short_and_long_steps_keep_their_own_spread():
    # Below 4 ms a step in ten stalls 5-30x; from 4 ms on, at most 3x (as live at load 13).
    short = np.r_[np.ones(90), np.linspace(5.0, 30.0, 11)]
    long = np.r_[np.ones(90), np.linspace(1.5, 3.0, 11)]
    sized = dataclasses.replace(
        TRUE, spread=tuple(float(v) for v in np.r_[short, long]), spread_edges_ms=(4.0,)
    )
    cal = calibrate(busy_run(sized, n=1500))
    assert cal.cost.fixed_ms == pytest.approx(TRUE.fixed_ms, rel=0.02)
    edges = cal.cost.spread_edges_ms
    assert 4.0 in edges and len(edges) >= 1
    for lo in (0.0, *edges):
        q = cal.cost.block_of(lo / 1000.0)
        if lo < 4.0:
            assert q[-1] == pytest.approx(30.0, rel=0.2)
        else:
            assert q[-1] == pytest.approx(3.0, rel=0.1)  # not the short steps' 30x
    # Replayed, a long step's tail stays its own: p99 of measured / typical under 3.5x.
    again = calibrate(busy_run(cal.cost, n=1500, seed=1))
    ratio = again.measured_ms / again.predicted_ms
    assert np.percentile(ratio[again.predicted_ms >= 4.0], 99) < 3.5
    assert np.percentile(ratio[again.predicted_ms < 4.0], 99.5) > 5.0
    assert "4-8 ms" in repr(cal) or ">= 4 ms" in repr(cal)


def test_a_sized_spread_is_checked():
    with pytest.raises(ValueError, match="2 blocks"):
        StepCost(1.0, spread=(1.0, 2.0, 3.0), spread_edges_ms=(4.0,))
    with pytest.raises(ValueError, match="spread_edges_ms"):
        StepCost(1.0, spread=(1.0, 2.0, 1.0, 2.0), spread_edges_ms=(-1.0,))
    with pytest.raises(ValueError, match="spread_edges_ms"):
        StepCost(1.0, spread_edges_ms=(4.0,))  # edges without a spread
    with pytest.raises(ValueError, match="in order"):
        StepCost(1.0, spread=(1.0, 2.0, 3.0, 1.0), spread_edges_ms=(4.0,))
    cost = StepCost(1.0, spread=(1.0, 1.0, 2.0, 2.0), spread_edges_ms=(4.0,))
    assert cost.block_of(0.003) == (1.0, 1.0) and cost.block_of(0.004) == (2.0, 2.0)
    assert "2 step sizes" in repr(cost)


def test_the_wake_from_idle_is_measured_from_the_arrivals():
    waking = dataclasses.replace(TRUE, wake_ms=0.7)
    run = simulate_generation(
        GenerationConfig(), waking, n_requests=60, input_len=16, output_len=8, rate=5.0, seed=3
    )
    # Each lone request's TTFT is the wake plus its prefill step.
    assert np.min(run.ttft_s) * 1000.0 > 0.7
    assert calibrate(run, arrival_s=run.arrival_s).cost.wake_ms == pytest.approx(0.7, rel=1e-6)
    assert calibrate(run).cost.wake_ms == 0.0


def test_a_search_on_the_calibrated_cost_chooses_as_one_on_the_true_cost():
    # The new-user path on virtual time: a run of a model whose short steps stall more than
    # its long ones, calibrate, search, against the same search on the cost that made the run.
    short = np.r_[np.ones(90), np.linspace(3.0, 10.0, 11)]
    long = np.r_[np.ones(90), np.linspace(1.2, 2.0, 11)]
    true = StepCost(
        2.0, per_seq_ms=0.2, spread=tuple(float(v) for v in np.r_[short, long]),
        spread_edges_ms=(4.0,),
    )  # fmt: skip
    ran = simulate_generation(
        GenerationConfig(max_num_seqs=16), true, n_requests=1500, input_len="uniform:4:16",
        output_len="uniform:4:16", rate=120.0,
    )  # fmt: skip
    # At 120 req/s the run holds steps of every size the grid runs (at 300 it held no short
    # ones: their spread went unseen, and max_num_seqs 1 and 4 came out 77% fast).
    cal = calibrate(ran)
    assert cal.cost.fixed_ms == pytest.approx(2.0, rel=0.02)
    assert cal.cost.per_seq_ms == pytest.approx(0.2, rel=0.05)
    assert cal.cost.block_of(0.002)[99] == pytest.approx(true.block_of(0.002)[99], rel=0.15)
    assert cal.cost.block_of(0.005)[99] == pytest.approx(true.block_of(0.005)[99], rel=0.15)
    kw: dict[str, Any] = dict(grid={"max_num_seqs": [1, 4, 16]}, duration_s=4.0, warmup_s=0.5)
    work = labserve.PoissonWorkload(8, 8)
    on_true = labserve.search_generation(work, "ttft:100 tpot:8", cost=true, **kw)
    on_cal = labserve.search_generation(work, "ttft:100 tpot:8", cost=cal.cost, **kw)
    assert on_cal.best["max_num_seqs"] == on_true.best["max_num_seqs"]
    assert on_cal.best["max_rate"] == pytest.approx(on_true.best["max_rate"], rel=0.045)
    rates = {r["max_num_seqs"]: r["max_rate"] for r in on_true.rows}
    for row in on_cal.rows:  # the rest near their edge, where 4 s of draws decide (seen: +24%)
        assert row["max_rate"] == pytest.approx(rates[row["max_num_seqs"]], rel=0.3)


@pytest.mark.parametrize("memory", [0.0, 0.8])
def test_the_spread_s_memory_is_measured_from_runs_of_slow_steps(memory):
    # Slow steps in runs (a step keeps the last one's place with chance `memory`) or not.
    spread = tuple(float(v) for v in np.linspace(0.8, 3.0, 101))
    run = busy_run(dataclasses.replace(TRUE, spread=spread, spread_memory=memory), n=1500)
    assert calibrate(run).cost.spread_memory == 0.0  # measured, not used, by default
    cal = calibrate(run, memory=True)
    assert cal.cost.spread_memory == cal.memory == pytest.approx(memory, abs=0.08)
    assert f"memory {cal.memory:.2f};" in repr(cal)
    # With memory the mean step over 128 steps varies more than drawn afresh: TPOT's tail.
    steps = calibrate(busy_run(cal.cost, n=1500, seed=1))
    ratio = steps.measured_ms / steps.predicted_ms
    means = [ratio[i : i + 128].mean() for i in range(0, len(ratio) - 128, 128)]
    assert (np.std(means) > 0.09) == (memory > 0)  # afresh: 0.64 / sqrt(128) = 0.056


def test_a_memory_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match="spread_memory"):
        StepCost(1.0, spread=(1.0, 2.0), spread_memory=1.0)
