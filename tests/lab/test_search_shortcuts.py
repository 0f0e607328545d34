"""The search's shortcuts against the reference (``exact=True``): what each one promises.

- A rate's run stopped by its misses (``Verdict``) stops only when the full run fails.
- A point reused across settings (``SharedPoints``) is the point that setting's own run gives,
  float for float (every column of both runs compared).
- Rates on the lattice: the answer depends on the edge, not on the start.
- The whole search: the same best setting and every ``max_rate`` within the tolerance of
  the reference's, with fewer simulated points.

All on virtual time; small workloads (a few simulated seconds), so the module stays fast.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import labserve
from labserve.config.generation import GenerationConfig
from labserve.generation.results import GenerationResult
from labserve.lab.bisection import highest_lattice_rate
from labserve.lab.generation.judging import (
    Point,
    RunFacts,
    SharedPoint,
    Verdict,
    attained,
    longest_want,
)
from labserve.lab.generation.search import (
    PoissonWorkload,
    _Judge,
    _refine_ties,
    _row,
    search_generation,
)
from labserve.sim.generation import StepCost, replay_generation

COST = StepCost(2.0, per_seq_ms=0.2, per_batched_token_ms=0.01)


def assert_same(a: GenerationResult, b: GenerationResult) -> None:
    """Every column of both results equal, exactly (floats included), NaN where NaN."""
    assert a.refused == b.refused
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "steps":
            for g in dataclasses.fields(x):
                np.testing.assert_array_equal(getattr(x, g.name), getattr(y, g.name), g.name)
        elif isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y, err_msg=f.name)


@st.composite
def requests(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 30))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.001, 0.004, 0.02, 0.1]), min_size=n, max_size=n))
    return {
        "arrival_s": np.cumsum(gaps),
        "prompt_lens": np.asarray(draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))),
        "output_lens": np.asarray(draw(st.lists(st.integers(1, 24), min_size=n, max_size=n))),
    }


@st.composite
def configs(draw: st.DrawFn) -> GenerationConfig:
    return GenerationConfig(
        strategy=draw(st.sampled_from(["continuous", "continuous", "static"])),
        scheduling_policy=draw(st.sampled_from(["fcfs", "fcfs", "priority"])),
        max_num_seqs=draw(st.integers(1, 12)),
        max_num_batched_tokens=draw(st.integers(8, 200)),
        enable_chunked_prefill=draw(st.booleans()),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 6])),
        block_size=draw(st.sampled_from([4, 16])),
        num_kv_blocks=draw(st.sampled_from([0, 0, 16])),  # 16 blocks: preemptions
        request_timeout_ms=draw(st.sampled_from([0.0, 0.0, 150.0])),
    )


def facts_of(config: GenerationConfig, work: dict) -> tuple[GenerationResult, RunFacts]:
    run = replay_generation(config, COST, **work)
    want = longest_want(config, work["prompt_lens"], work["output_lens"], run)
    return run, RunFacts.of(run, config, work["prompt_lens"], want)


@settings(max_examples=80, deadline=None)
@given(configs(), requests(), st.integers(0, 6), st.integers(0, 80), st.booleans(), st.booleans())
def test_a_setting_the_memo_serves_runs_the_same_steps(config, work, more_seqs, more, chunk, wide):
    """Caps drawn around what the first run asked of them: whenever the memo says the
    other setting runs alike, its own run is equal, column for column."""
    run, facts = facts_of(config, work)
    seats = facts.most_seqs + more_seqs if wide else max(1, facts.most_seqs - more_seqs)
    budget = facts.demand + more if wide else max(1, facts.demand - more)
    other = config.replace(
        max_num_seqs=max(seats, 1), max_num_batched_tokens=budget, enable_chunked_prefill=chunk
    )
    if SharedPoint(config, facts, Point(1.0, run)).serves(other):
        assert_same(run, replay_generation(other, COST, **work))


def test_the_memo_serves_a_setting_whose_caps_never_bound_and_not_one_that_bound():
    """Eight requests at once: a cap of 8 seats and 400 tokens never binds (so 16 seats
    and 4,000 tokens, chunking off, run alike); a cap of 4 seats holds four back."""
    work = {
        "arrival_s": np.zeros(8),
        "prompt_lens": np.full(8, 20),
        "output_lens": np.full(8, 5),
    }
    config = GenerationConfig(max_num_seqs=8, max_num_batched_tokens=400)
    run, facts = facts_of(config, work)
    entry = SharedPoint(config, facts, Point(1.0, run))
    wide = config.replace(
        max_num_seqs=16, max_num_batched_tokens=4000, enable_chunked_prefill=False
    )
    assert entry.serves(wide)
    assert_same(run, replay_generation(wide, COST, **work))
    narrow = config.replace(max_num_seqs=4)
    assert not entry.serves(narrow)
    assert replay_generation(narrow, COST, **work).ttft_s.max() > run.ttft_s.max()
    assert not entry.serves(config.replace(max_num_batched_tokens=100))  # 8 x 20 > 100


@settings(max_examples=60, deadline=None)
@given(
    configs(),
    requests(),
    st.sampled_from([{"ttft": 30.0}, {"ttft": 60.0, "tpot": 6.0}, {"e2el": 80.0}]),
    st.sampled_from([0.5, 0.9, 1.0]),
    st.sampled_from([0.0, 0.05]),
)
def test_a_run_stopped_by_its_misses_is_one_the_full_run_fails(
    config, work, targets, attainment, warmup_s
):
    full = replay_generation(config, COST, **work)
    judged = int((work["arrival_s"] >= warmup_s).sum())
    cuts = []
    for step_by_step in (False, True):
        verdict = Verdict(targets, attainment, warmup_s, judged)
        cuts.append(
            replay_generation(config, COST, stop_when=verdict, step_by_step=step_by_step, **work)
        )
    assert_same(*cuts)  # both paths stop after the same step
    if judged and verdict.best < attainment:
        assert attained(full, targets, warmup_s) < attainment
        assert attained(full, targets, warmup_s) <= verdict.best
    else:
        assert_same(cuts[0], full)  # never stopped: the whole run


def test_a_stopped_run_ends_every_admitted_sequence_once():
    work = {"arrival_s": np.linspace(0, 0.2, 20), "prompt_lens": np.full(20, 8)}
    work["output_lens"] = np.full(20, 30)
    seen: list[int] = []

    def stop(ended):
        seen.extend(f.seq_id for f in ended)
        return True  # at the first end

    cut = replay_generation(GenerationConfig(max_num_seqs=4), COST, stop_when=stop, **work)
    assert len(seen) == 1 and 1 < len(cut) < 20
    outcomes = cut.outcome.tolist()
    assert outcomes.count(0) == 1 and all(o == 1 for o in outcomes if o != 0)  # cancelled


@settings(max_examples=200, deadline=None)
@given(
    edge=st.floats(0.01, 1e5),
    starts=st.lists(st.floats(0.01, 1e5), min_size=2, max_size=2),
    tolerance=st.sampled_from([0.005, 0.02, 0.1]),
)
def test_lattice_bisection_answer_depends_on_the_edge_not_the_start(edge, starts, tolerance):
    a, b = (highest_lattice_rate(lambda r: r <= edge, start=s, tolerance=tolerance) for s in starts)
    assert a.rate == b.rate and a.miss == b.miss
    assert a.rate <= edge < a.miss <= a.rate * (1 + tolerance) * (1 + 1e-12)
    assert a.rate in a.tried and a.miss in a.tried


def test_lattice_bisection_gives_up_past_its_limits():
    assert highest_lattice_rate(lambda r: False, start=1.0, floor=0.5).rate == 0.0
    assert highest_lattice_rate(lambda r: True, start=1.0, ceiling=8.0).miss == math.inf
    with pytest.raises(ValueError, match="start must be within"):
        highest_lattice_rate(lambda r: True, start=0.0)


GRID = {
    "max_num_seqs": [1, 4, 16],
    "max_num_batched_tokens": [16, 1024],
    "enable_chunked_prefill": [True, False],
    "strategy": ["continuous", "static"],
}
WORK = PoissonWorkload(8, 8)
TARGETS = {"ttft": 60.0, "tpot": 5.0}
SEARCH = dict(cost=labserve.StepCost(2.0, per_seq_ms=0.2), duration_s=4.0, warmup_s=0.5)


@pytest.fixture(scope="module")
def both():
    return [search_generation(WORK, TARGETS, grid=GRID, exact=e, **SEARCH) for e in (True, False)]


def test_search_shortcuts_keep_the_best_setting_and_each_rate_within_the_tolerance(both):
    """On this grid the verdicts fall with the rate: both searches bracket the same edge."""
    exact, fast = both
    knobs = ("strategy", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill")
    assert [exact.best[k] for k in knobs] == [fast.best[k] for k in knobs]
    for e, f in zip(exact.rows, fast.rows, strict=True):
        assert [e[k] for k in knobs] == [f[k] for k in knobs]
        assert (e["max_rate"] == 0) == (f["max_rate"] == 0), e
        if e["max_rate"]:
            assert 1 / 1.02 <= f["max_rate"] / e["max_rate"] <= 1.02, (e, f)
    assert len({r["max_rate"] for r in fast.rows}) > 3  # the grid's settings do differ


def test_search_shortcuts_bracket_each_edge_by_full_runs(both):
    """What holds whatever the verdicts do: each setting's rate meets the targets in its
    full run, and the lattice's next rate misses them in its full run."""
    fast = both[1]
    for row in fast.rows:
        config = fast.base.replace(**{k: row[k] for k in GRID})
        judge = _Judge(config, WORK, SEARCH["cost"], TARGETS, 0.9, 4.0, 0.5, 4.0, 0)
        rate = row["max_rate"]
        assert rate > 0
        assert judge(rate) and judge.points[rate].result is not None
        assert not judge(rate * 1.02)


def test_search_shortcuts_simulate_fewer_points(both):
    exact, fast = both
    assert fast.evaluations < exact.evaluations / 2


class EdgeJudge:
    """A judge whose setting meets the targets up to ``edge`` req/s (a monotone verdict)."""

    def __init__(self, config: GenerationConfig, edge: float) -> None:
        self.config, self.edge = config, edge
        self.points: dict[float, Point] = {}
        self.simulated = 0

    def __call__(self, rate: float) -> bool:
        self.simulated += 1
        return rate <= self.edge


def test_settings_tied_at_the_top_rate_are_ranked_on_finer_rates():
    """Edges 10.16 and 10.30 share the 2% lattice's point below them (10.14); 10.30 wins."""
    judges = [EdgeJudge(GenerationConfig(max_num_seqs=s), e) for s, e in ((8, 10.16), (16, 10.30))]
    top = highest_lattice_rate(judges[0], start=10.0).rate
    assert top == highest_lattice_rate(judges[1], start=10.0).rate  # tied
    rows = [_row(j.config, top, None) for j in judges] + [_row(GenerationConfig(), top / 2, None)]
    judges.append(EdgeJudge(GenerationConfig(), top / 2))
    extra = _refine_ties(rows, judges, 0.02)
    assert extra > 0 and rows[2]["max_rate"] == top / 2  # not tied: left alone
    assert rows[0]["max_rate"] == top  # it missed the first finer rate
    assert top < rows[1]["max_rate"] <= 10.30 < rows[1]["max_rate"] * 1.02**0.5 * (1 + 1e-12)
    assert max(rows, key=lambda r: r["max_rate"]) is rows[1]
