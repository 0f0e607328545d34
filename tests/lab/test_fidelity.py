"""compare_generation: a simulation's p50 and p99 beside a live run's, on virtual time."""

from __future__ import annotations

import math

import pytest

import labserve
from labserve.config.generation import GenerationConfig
from labserve.lab.demo import TinyLM
from labserve.lab.generation.fidelity import FIDELITY_METRICS, compare_generation
from labserve.sim.generation import StepCost, simulate_generation

KW = dict(n_requests=80, input_len="uniform:4:64", output_len="uniform:2:32", rate=150.0)


def test_a_run_against_itself_hits_every_figure():
    run = simulate_generation(GenerationConfig(), StepCost(1.0, per_seq_ms=0.05), **KW)
    report = compare_generation(run, run)
    for m in FIDELITY_METRICS:
        for q in ("p50", "p99"):
            assert report.error_pct(m, q) == pytest.approx(0.0)
            assert report.hit(m, q)
    assert repr(report).startswith("GenerationFidelity(8 of 8 within 10%")


def test_a_slower_simulation_shows_its_error_per_figure_and_misses_past_the_tolerance():
    live = simulate_generation(GenerationConfig(), StepCost(1.0), **KW)
    slow = simulate_generation(GenerationConfig(), StepCost(1.5), **KW)
    report = compare_generation(live, slow, tolerance_pct=10)
    # Every step 1.5x: the gaps between tokens are 1.5x, queueing adds to TTFT.
    assert report.error_pct("itl", "p50") == pytest.approx(50.0)
    assert report.error_pct("ttft", "p50") >= 50.0 - 1e-9
    assert not report.hit("tpot", "p50")
    assert compare_generation(live, slow, tolerance_pct=60).hit("itl", "p50")
    table = report.table()
    assert "itl p50" in table and "+50.0% MISS" in table


def test_a_live_snapshot_is_read_through_its_percentiles_and_bad_input_is_refused():
    runner = labserve.Runner(TinyLM)
    try:
        runner.generate.run("hello", max_tokens=3)
        snap = runner.generate.stats()
    finally:
        runner.stop()
    run = simulate_generation(GenerationConfig(), StepCost(1.0), **KW)
    report = compare_generation(snap, run)
    assert report.live_ms["ttft"]["p50"] == snap.percentiles_ms["ttft"]["p50"]
    assert math.isfinite(report.error_pct("e2e", "p50"))
    with pytest.raises(TypeError, match="GenerationSnapshot or a GenerationResult"):
        compare_generation({"ttft": 1.0}, run)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tolerance_pct must be a number >= 0"):
        compare_generation(run, run, tolerance_pct=-1)
