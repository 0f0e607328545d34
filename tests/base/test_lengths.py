from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labserve.base.lengths import (
    EmpiricalLengths,
    FixedLength,
    LognormalLength,
    TraceLengths,
    UniformLength,
    parse_length,
)

lengths = st.integers(min_value=1, max_value=10_000)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@st.composite
def distributions(draw):
    kind = draw(st.sampled_from(["fixed", "uniform", "lognormal", "list", "trace"]))
    if kind == "fixed":
        return FixedLength(draw(lengths))
    if kind == "uniform":
        low = draw(lengths)
        return UniformLength(low, low + draw(st.integers(0, 5_000)))
    if kind == "lognormal":
        median = draw(st.floats(1.0, 2_000.0))
        max_len = draw(st.one_of(st.none(), st.integers(1, 50_000)))
        if draw(st.booleans()):
            return LognormalLength(
                median, p99=median * draw(st.floats(1.01, 20.0)), max_len=max_len
            )
        return LognormalLength(median, sigma=draw(st.floats(0.01, 1.5)), max_len=max_len)
    values = draw(st.lists(lengths, min_size=1, max_size=20))
    return EmpiricalLengths(values) if kind == "list" else TraceLengths(values)


def _bounds(d) -> tuple[int, float]:
    if isinstance(d, FixedLength):
        return d.n, d.n
    if isinstance(d, UniformLength):
        return d.low, d.high
    if isinstance(d, LognormalLength):
        return 1, math.inf if d.max_len is None else d.max_len
    return min(d.values), max(d.values)


@settings(max_examples=200, deadline=None)
@given(distributions(), st.integers(0, 300), st.integers(0, 2**32 - 1))
def test_samples_are_int64_lengths_within_the_distributions_bounds(d, n, seed):
    out = d.sample(_rng(seed), n)
    assert out.dtype == np.int64 and out.shape == (n,)
    low, high = _bounds(d)
    assert np.all(out >= low) and np.all(out <= high)


@settings(max_examples=50, deadline=None)
@given(distributions(), st.integers(0, 2**32 - 1))
def test_a_seed_fixes_every_draw(d, seed):
    np.testing.assert_array_equal(d.sample(_rng(seed), 50), d.sample(_rng(seed), 50))


@pytest.mark.parametrize(
    "d",
    [
        FixedLength(64),
        UniformLength(1, 512),
        LognormalLength(16, p99=128),
        LognormalLength(100, sigma=0.5, max_len=150),
        LognormalLength(1.2, sigma=1.0),  # most of the mass is clamped up to 1
        EmpiricalLengths((8, 16, 32, 32)),
        TraceLengths((3, 5, 700)),
    ],
)
def test_mean_matches_a_large_sample(d):
    sample = d.sample(_rng(7), 400_000)
    # Five standard errors: fails only if mean() and sample() disagree.
    se = sample.std() / math.sqrt(sample.size)
    assert abs(sample.mean() - d.mean()) <= 5 * se + 1e-9


def test_lognormal_from_p99_puts_one_percent_above_it():
    d = LognormalLength(16, p99=128)
    sample = d.sample(_rng(1), 200_000)
    assert np.median(sample) == 16
    above = np.mean(sample > 128)
    assert 0.009 < above < 0.011
    assert math.isclose(d.sigma_log, math.log(8) / 2.3263478740408408)


def test_lognormal_clamps_to_max_len():
    d = LognormalLength(100, sigma=2.0, max_len=120)
    sample = d.sample(_rng(2), 10_000)
    assert sample.max() == 120 and sample.min() >= 1


def test_uniform_reaches_both_ends():
    sample = UniformLength(3, 5).sample(_rng(0), 1_000)
    assert set(sample.tolist()) == {3, 4, 5}


def test_trace_replays_in_order_and_wraps():
    d = TraceLengths([4, 1, 9])
    assert d.sample(_rng(0), 7).tolist() == [4, 1, 9, 4, 1, 9, 4]
    assert d.sample(_rng(99), 2).tolist() == [4, 1]  # every call replays from the start


def test_empirical_draws_only_its_values_and_all_of_them():
    d = EmpiricalLengths([8, 16, 32])
    assert set(d.sample(_rng(0), 500).tolist()) == {8, 16, 32}
    assert d.values == (8, 16, 32)  # stored as a tuple: hashable, frozen
    hash(d)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("64", FixedLength(64)),
        (64, FixedLength(64)),
        (np.int64(5), FixedLength(5)),
        (" fixed:7 ", FixedLength(7)),
        ("uniform:1:512", UniformLength(1, 512)),
        ("UNIFORM:2:2", UniformLength(2, 2)),
        ("lognormal:16:128", LognormalLength(16.0, p99=128.0)),
        ("lognormal:16:128:2048", LognormalLength(16.0, p99=128.0, max_len=2048)),
        ("list:8,16,32", EmpiricalLengths((8, 16, 32))),
        ("trace:8, 16 ,32", TraceLengths((8, 16, 32))),
    ],
)
def test_parse_length(spec, expected):
    assert parse_length(spec) == expected


def test_parse_length_passes_a_distribution_through():
    d = UniformLength(1, 4)
    assert parse_length(d) is d


def test_parse_length_reads_a_trace_file(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("12\n7, 3\n\n40\n")
    assert parse_length(f"trace:@{path}") == TraceLengths((12, 7, 3, 40))
    assert parse_length(f"list:@{path}") == EmpiricalLengths((12, 7, 3, 40))


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "'' is not an integer"),
        ("0", "must be an integer >= 1, got 0"),
        ("-3", "got -3"),
        ("abc", "'abc' is not an integer"),
        ("uniform:5:2", "high must be >= low"),
        ("uniform:1", "wrong number of fields"),
        ("uniform:1:x", "'x' is not an integer"),
        ("lognormal:16:8", "p99 must be a number > median"),
        ("lognormal:0:8", "median must be a number > 0"),
        ("gamma:1:2", "unknown kind 'gamma'"),
        ("list:", "at least one length"),
        ("list:1,0", "values[1] must be an integer >= 1"),
        ("trace:@/nonexistent/lengths.txt", "cannot read the file"),
    ],
)
def test_parse_length_names_what_was_wrong_and_the_syntax(spec, fragment):
    with pytest.raises(ValueError, match="expected N, fixed:N") as e:
        parse_length(spec, name="--output-len")
    assert fragment in str(e.value)
    assert str(e.value).startswith(f"--output-len {spec!r} is not a length spec")


@pytest.mark.parametrize("spec", [True, 2.5, None, [1, 2]])
def test_parse_length_refuses_other_types(spec):
    with pytest.raises(TypeError, match="--input-len must be a length spec"):
        parse_length(spec, name="--input-len")


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: FixedLength(0), ValueError, "n must be an integer >= 1, got 0"),
        (lambda: FixedLength(True), TypeError, "n must be an integer >= 1, got True"),
        (lambda: FixedLength(2.0), TypeError, "n must be an integer >= 1, got 2.0"),
        (lambda: UniformLength(0, 3), ValueError, "low must be an integer >= 1"),
        (lambda: LognormalLength(16), ValueError, "exactly one of p99 or sigma"),
        (lambda: LognormalLength(16, p99=64, sigma=1.0), ValueError, "exactly one of p99"),
        (lambda: LognormalLength(16, sigma=0), ValueError, "sigma must be a number > 0"),
        (lambda: LognormalLength(float("nan"), sigma=1), ValueError, "median must be"),
        (lambda: LognormalLength(16, sigma=1, max_len=0), ValueError, "max_len must be"),
        (lambda: EmpiricalLengths(()), ValueError, "at least one length"),
        (lambda: TraceLengths("123"), TypeError, "values must be a sequence of integers"),
    ],
)
def test_invalid_distributions_are_refused_with_the_rule(make, error, message):
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize("n", [-1, 1.5, True])
def test_sample_refuses_a_bad_count(n):
    with pytest.raises(ValueError, match=r"n must be an integer >= 0"):
        FixedLength(3).sample(_rng(), n)


def test_sample_refuses_a_legacy_random_state():
    with pytest.raises(TypeError, match=r"numpy\.random\.Generator"):
        UniformLength(1, 3).sample(np.random.RandomState(0), 3)  # type: ignore[arg-type]


def test_lognormal_mean_without_max_len_for_huge_median_asks_for_one():
    with pytest.raises(ValueError, match="give max_len"):
        LognormalLength(1e6, sigma=1.0).mean()
    assert LognormalLength(1e6, sigma=1.0, max_len=1_000).mean() == pytest.approx(1_000)
