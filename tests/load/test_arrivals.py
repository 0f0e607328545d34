import ast
import dataclasses
import math
import pathlib
from collections.abc import Callable

import numpy as np
import pytest

from labserve.load.arrivals import (
    ARRIVAL_KINDS,
    Arrivals,
    BurstArrivals,
    ConstantArrivals,
    PoissonArrivals,
    RampArrivals,
    StepArrivals,
    TraceArrivals,
    _unit_poisson,
    arrivals,
)

EXAMPLES: dict[str, Callable[[], Arrivals]] = {
    "constant": lambda: ConstantArrivals(300),
    "poisson": lambda: PoissonArrivals(300),
    "step": lambda: StepArrivals([(0, 100), (1.5, 900), (2.5, 0), (3, 400)]),
    "step-constant": lambda: StepArrivals([(0, 100), (1.5, 900)], poisson=False),
    "burst": lambda: BurstArrivals(base_rps=50, burst_rps=2000, every_s=1, length_s=0.2),
    "ramp-up": lambda: RampArrivals(0, 800),
    "ramp-down": lambda: RampArrivals(800, 0),
    "trace": lambda: TraceArrivals([5.0, 5.0, 5.25, 6.0, 9.5]),
}
RANDOM = ["poisson", "step", "burst", "ramp-up", "ramp-down"]


def _within_sd(count: int, expected: float, sds: float = 4.0) -> bool:
    """A Poisson count of mean ``expected`` lies within ``sds`` standard deviations of it."""
    return abs(count - expected) <= sds * math.sqrt(expected)


def _count(times: np.ndarray, start: float, end: float) -> int:
    return int(np.count_nonzero((times >= start) & (times < end)))


@pytest.mark.parametrize("name", list(EXAMPLES))
@pytest.mark.parametrize("duration_s", [1e-4, 0.37, 3.7, 10.0])
def test_times_are_sorted_float64_within_the_run(name, duration_s):
    for seed in range(3):
        t = EXAMPLES[name]().times(duration_s, seed=seed)
        assert t.dtype == np.float64
        assert t.ndim == 1
        assert np.all(np.diff(t) >= 0)
        if t.size:
            assert t[0] >= 0.0
            assert t[-1] < duration_s


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_same_seed_gives_identical_arrays(name):
    a, b = EXAMPLES[name](), EXAMPLES[name]()
    np.testing.assert_array_equal(a.times(7.0, seed=42), b.times(7.0, seed=42))
    np.testing.assert_array_equal(a.times(7.0), a.times(7.0, seed=0))


@pytest.mark.parametrize("name", RANDOM)
def test_different_seeds_give_different_arrays(name):
    a = EXAMPLES[name]()
    first, second = a.times(5.0, seed=1), a.times(5.0, seed=2)
    assert first.shape != second.shape or not np.array_equal(first, second)


def test_poisson_count_is_near_rate_times_duration():
    for seed in range(5):
        t = PoissonArrivals(2000).times(10.0, seed=seed)
        assert _within_sd(len(t), 20_000)


def test_poisson_gaps_look_exponential():
    t = PoissonArrivals(5000).times(20.0, seed=3)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(1 / 5000, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.02)
    # The exponential's memorylessness: P(gap > mean) = 1/e.
    assert np.mean(gaps > 1 / 5000) == pytest.approx(math.exp(-1), abs=0.01)


def test_poisson_small_rates_keep_their_mean_over_many_seeds():
    counts = [len(PoissonArrivals(3).times(1.0, seed=s)) for s in range(2000)]
    assert np.mean(counts) == pytest.approx(3.0, abs=4 * math.sqrt(3 / 2000))
    assert np.var(counts) == pytest.approx(3.0, rel=0.15)


def test_unit_poisson_continues_across_chunks():
    class TinyGaps:
        def standard_exponential(self, size):
            return np.full(size, 0.01)

    # Each chunk covers only 0.23 of the horizon: the draw must go on, seamlessly.
    events = _unit_poisson(TinyGaps(), 1.0)
    assert len(events) in (99, 100)
    np.testing.assert_allclose(np.diff(events), 0.01)
    assert events[-1] < 1.0


def test_constant_gaps_are_exact_and_start_at_zero():
    t = ConstantArrivals(250).times(2.0, seed=9)
    assert len(t) == 500
    assert t[0] == 0.0
    np.testing.assert_allclose(np.diff(t), 1 / 250, rtol=1e-12)
    np.testing.assert_array_equal(t, np.arange(500) / 250)


def test_constant_ignores_the_seed_and_cuts_at_the_duration():
    a = ConstantArrivals(3)
    np.testing.assert_array_equal(a.times(1.0, seed=1), a.times(1.0, seed=2))
    np.testing.assert_array_equal(a.times(1.0), [0.0, 1 / 3, 2 / 3])
    np.testing.assert_array_equal(a.times(1.01), [0.0, 1 / 3, 2 / 3, 1.0])


def test_step_rates_measured_per_segment_match():
    steps = [(0, 500), (4, 3000), (7, 0), (8, 1000)]
    t = StepArrivals(steps).times(10.0, seed=5)
    ends = [4, 7, 8, 10]
    for (start, rate), end in zip(steps, ends, strict=True):
        count = _count(t, start, end)
        if rate == 0:
            assert count == 0
        else:
            assert _within_sd(count, rate * (end - start)), (start, count)


def test_step_without_poisson_spaces_evenly_within_each_step():
    t = StepArrivals([(0, 4), (1, 10), (2, 0), (2.5, 2)], poisson=False).times(4.0)
    expected = np.concatenate([np.arange(4) / 4, 1 + np.arange(10) / 10, [2.5, 3.0, 3.5]])
    np.testing.assert_allclose(t, expected, rtol=0, atol=1e-12)


def test_step_changes_after_the_run_are_ignored():
    a = StepArrivals([(0, 500), (4, 3000)])
    assert a.mean_rate(3.0) == 500.0
    assert a.mean_rate(8.0) == pytest.approx((500 * 4 + 3000 * 4) / 8)
    assert _within_sd(len(a.times(3.0, seed=1)), 1500)


def test_step_normalises_its_rates_to_a_hashable_tuple():
    a = StepArrivals([[0, 1], (2, 3)])
    assert a.rates == ((0.0, 1.0), (2.0, 3.0))
    assert a == StepArrivals(((0, 1), (2, 3)))
    assert hash(a) == hash(StepArrivals(((0, 1), (2, 3))))


def test_ramp_rate_in_first_and_last_tenth_is_near_start_and_end():
    for start, end in [(1000, 5000), (5000, 1000), (0, 4000), (3000, 3000)]:
        t = RampArrivals(start, end).times(10.0, seed=11)
        slope = (end - start) / 10.0
        # The expected count of a tenth is the integral of the linear rate over it.
        first = start * 1.0 + slope / 2
        last = start * 1.0 + slope * 9.5
        assert _within_sd(_count(t, 0.0, 1.0), first), (start, end)
        assert _within_sd(_count(t, 9.0, 10.0), last), (start, end)
        assert _within_sd(len(t), (start + end) / 2 * 10)


def test_ramp_follows_the_rate_in_every_tenth():
    t = RampArrivals(200, 6200).times(10.0, seed=2)
    for k in range(10):
        expected = 200 + 600 * (k + 0.5)
        assert _within_sd(_count(t, k, k + 1), expected), k


def test_burst_windows_carry_the_burst_rate():
    a = BurstArrivals(base_rps=200, burst_rps=5000, every_s=2.0, length_s=0.5)
    t = a.times(10.0, seed=4)
    for k in range(1, 6):
        window = (2.0 * k - 0.5, 2.0 * k)
        calm = (2.0 * (k - 1), 2.0 * k - 0.5)
        assert _within_sd(_count(t, *window), 5000 * 0.5), k
        assert _within_sd(_count(t, *calm), 200 * 1.5), k
    assert a.mean_rate(10.0) == pytest.approx((200 * 7.5 + 5000 * 2.5) / 10)


def test_burst_cut_by_the_run_end_counts_only_its_part():
    a = BurstArrivals(base_rps=0, burst_rps=1000, every_s=1.0, length_s=0.4)
    assert a.mean_rate(0.6) == 0.0
    assert a.mean_rate(0.8) == pytest.approx(1000 * 0.2 / 0.8)
    t = a.times(0.8, seed=1)
    assert t.size and t.min() >= 0.6


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_mean_rate_matches_the_measured_rate(name):
    a = EXAMPLES[name]()
    counts = [len(a.times(4.0, seed=s)) for s in range(20)]
    expected = a.mean_rate(4.0) * 4.0
    assert np.mean(counts) == pytest.approx(expected, abs=4 * math.sqrt(expected / 20) + 1e-9)


def test_trace_round_trips_recorded_times():
    recorded = PoissonArrivals(1000).times(3.0, seed=8)
    replayed = TraceArrivals(recorded + 100.0).times(10.0)
    np.testing.assert_allclose(replayed, recorded - recorded[0], rtol=0, atol=1e-9)
    constant = ConstantArrivals(10).times(2.0)
    np.testing.assert_array_equal(TraceArrivals(constant).times(2.0), constant)


def test_trace_shifts_to_zero_keeps_ties_and_cuts_at_the_duration():
    a = TraceArrivals(iter([5, 5, 5.25, 6, 9.5]))
    np.testing.assert_array_equal(a.timestamps, [0.0, 0.0, 0.25, 1.0, 4.5])
    np.testing.assert_array_equal(a.times(1.0), [0.0, 0.0, 0.25])
    assert a.span_s == 4.5
    assert a.mean_rate(2.0) == 2.0


def test_trace_results_are_the_callers_to_mutate():
    a = TraceArrivals((0.0, 1.0, 2.0))
    t = a.times(5.0)
    t[:] = 7.0
    np.testing.assert_array_equal(a.times(5.0), [0.0, 1.0, 2.0])
    with pytest.raises(ValueError):
        a.timestamps[0] = 3.0


def test_trace_equality_and_hash_follow_the_timestamps():
    assert TraceArrivals([1, 2, 4]) == TraceArrivals(np.array([0.0, 1.0, 3.0]))
    assert hash(TraceArrivals([1, 2, 4])) == hash(TraceArrivals([0.0, 1.0, 3.0]))
    assert TraceArrivals([1, 2, 4]) != TraceArrivals([1, 2, 5])


@pytest.mark.parametrize(
    ("timestamps", "error", "detail"),
    [
        ([0.0, 2.0, 1.0], ValueError, "got 1.0 at index 2 after 2.0"),
        ([0.0, math.nan], ValueError, "got nan at index 1"),
        ([0.0, math.inf], ValueError, "got inf at index 1"),
        ([], ValueError, "got an empty sequence"),
        (np.empty(0), ValueError, "got an empty sequence"),
        ([[0.0, 1.0]], TypeError, "shape (1, 2)"),
        (["0", "1"], TypeError, "dtype <U1"),
        ("012", TypeError, "got '012'"),
        (None, TypeError, "got None"),
        (3.0, TypeError, "got 3.0"),
    ],
)
def test_trace_rejects_bad_timestamps(timestamps, error, detail):
    with pytest.raises(error) as info:
        TraceArrivals(timestamps)
    message = str(info.value)
    assert "timestamps must be a non-empty, non-decreasing 1-d sequence" in message
    assert detail in message


def test_bad_parameter_message_names_field_rule_and_value():
    with pytest.raises(ValueError) as info:
        PoissonArrivals(-1)
    assert str(info.value) == "rate_rps must be a finite number > 0, got -1"


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: ConstantArrivals(0), ValueError, "rate_rps must be a finite number > 0, got 0"),
        (lambda: PoissonArrivals(math.inf), ValueError, "rate_rps must be a finite number > 0"),
        (lambda: PoissonArrivals(math.nan), ValueError, "rate_rps must be a finite number > 0"),
        (lambda: PoissonArrivals("5"), TypeError, "rate_rps must be a finite number > 0, got '5'"),
        (lambda: PoissonArrivals(True), TypeError, "rate_rps must be a finite number > 0"),
        (lambda: PoissonArrivals(None), TypeError, "rate_rps must be a finite number > 0"),
        (lambda: StepArrivals([]), ValueError, "rates must hold at least one"),
        (lambda: StepArrivals(5), TypeError, "rates must be a sequence of"),
        (lambda: StepArrivals([(0, 1, 2)]), TypeError, "rates[0] must be a (start_s, rate_rps)"),
        (lambda: StepArrivals([(1, 5)]), ValueError, "rates[0] start_s must be 0"),
        (lambda: StepArrivals([(0, 5), (2, 1), (2, 3)]), ValueError, "rates[2] start_s must be >"),
        (
            lambda: StepArrivals([(0, -5)]),
            ValueError,
            "rates[0] rate_rps must be a finite number >= 0",
        ),
        (lambda: StepArrivals([(0, 0), (1, 0)]), ValueError, "must include a rate_rps > 0"),
        (lambda: StepArrivals([(0, 1)], poisson=1), TypeError, "poisson must be True or False"),
        (
            lambda: BurstArrivals(-1, 10, 1, 0.1),
            ValueError,
            "base_rps must be a finite number >= 0",
        ),
        (lambda: BurstArrivals(1, 0, 1, 0.1), ValueError, "burst_rps must be a finite number > 0"),
        (lambda: BurstArrivals(1, 10, 0, 0.1), ValueError, "every_s must be a finite number > 0"),
        (lambda: BurstArrivals(1, 10, 1, 0), ValueError, "length_s must be a finite number > 0"),
        (lambda: BurstArrivals(1, 10, 1, 1), ValueError, "length_s must be < every_s (1)"),
        (lambda: RampArrivals(-1, 10), ValueError, "start_rps must be a finite number >= 0"),
        (lambda: RampArrivals(1, math.inf), ValueError, "end_rps must be a finite number >= 0"),
        (lambda: RampArrivals(0, 0), ValueError, "end_rps must be > 0 when start_rps is 0"),
    ],
)
def test_bad_parameters_raise_with_the_rule(build, error, message):
    with pytest.raises(error) as info:
        build()
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("duration_s", "seed", "error", "message"),
    [
        (0, 0, ValueError, "duration_s must be a finite number > 0, got 0"),
        (-1.0, 0, ValueError, "duration_s must be a finite number > 0"),
        (math.nan, 0, ValueError, "duration_s must be a finite number > 0"),
        ("10", 0, TypeError, "duration_s must be a finite number > 0, got '10'"),
        (1.0, -1, ValueError, "seed must be an integer >= 0, got -1"),
        (1.0, 1.5, TypeError, "seed must be an integer >= 0, got 1.5"),
        (1.0, True, TypeError, "seed must be an integer >= 0, got True"),
    ],
)
def test_times_rejects_a_bad_duration_or_seed(duration_s, seed, error, message):
    for make in EXAMPLES.values():
        with pytest.raises(error) as info:
            make().times(duration_s, seed=seed)
        assert message in str(info.value)


def test_numpy_scalars_are_accepted_and_stored_as_floats():
    a = PoissonArrivals(np.int64(100))
    assert a.rate_rps == 100.0 and type(a.rate_rps) is float
    assert len(a.times(np.float64(1.0), seed=np.int64(3))) == len(a.times(1.0, seed=3))


def test_arrivals_are_frozen():
    a = PoissonArrivals(100)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.rate_rps = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        TraceArrivals([0, 1]).timestamps = np.zeros(2)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("arrival", "text"),
    [
        (ConstantArrivals(100), "constant 100 req/s"),
        (PoissonArrivals(2000), "poisson 2000 req/s"),
        (PoissonArrivals(2.5), "poisson 2.5 req/s"),
        (
            StepArrivals([(0, 100), (10, 500)]),
            "step 100 req/s from 0 s, 500 req/s from 10 s (poisson)",
        ),
        (StepArrivals([(0, 100)], poisson=False), "step 100 req/s from 0 s (constant)"),
        (BurstArrivals(100, 2000, 5, 0.5), "burst 100 req/s, 2000 req/s for 0.5 s every 5 s"),
        (RampArrivals(100, 1000), "ramp 100 -> 1000 req/s"),
        (TraceArrivals([3, 4, 5.5]), "trace 3 arrivals over 2.5 s"),
    ],
)
def test_str_is_readable(arrival, text):
    assert str(arrival) == text


def test_factory_maps_every_kind_to_its_class():
    built = {
        "constant": arrivals("constant", rate_rps=5),
        "poisson": arrivals("poisson", rate_rps=5),
        "step": arrivals("step", rates=[(0, 5)], poisson=False),
        "burst": arrivals("burst", base_rps=1, burst_rps=5, every_s=2, length_s=1),
        "ramp": arrivals("ramp", start_rps=1, end_rps=5),
        "trace": arrivals("trace", timestamps=[0, 1]),
    }
    assert tuple(built) == ARRIVAL_KINDS
    assert built["constant"] == ConstantArrivals(5)
    assert built["poisson"] == PoissonArrivals(5)
    assert built["step"] == StepArrivals([(0, 5)], poisson=False)
    assert built["burst"] == BurstArrivals(1, 5, 2, 1)
    assert built["ramp"] == RampArrivals(1, 5)
    assert built["trace"] == TraceArrivals([0, 1])


def test_factory_lists_the_known_kinds_for_an_unknown_name():
    with pytest.raises(ValueError) as info:
        arrivals("uniform", rate_rps=5)
    assert str(info.value) == (
        "kind must be one of constant, poisson, step, burst, ramp, trace, got 'uniform'"
    )
    with pytest.raises(TypeError, match="kind must be one of"):
        arrivals(None)  # type: ignore[arg-type]


def test_factory_names_unknown_and_missing_parameters():
    with pytest.raises(TypeError) as info:
        arrivals("poisson", rate=5)
    assert str(info.value) == "poisson arrivals take rate_rps; got unknown rate"
    with pytest.raises(TypeError) as info:
        arrivals("burst", base_rps=1, burst_rps=5)
    assert str(info.value) == (
        "burst arrivals take base_rps, burst_rps, every_s, length_s; got no every_s, length_s"
    )
    with pytest.raises(ValueError, match="rate_rps must be a finite number > 0, got -1"):
        arrivals("poisson", rate_rps=-1)


def test_the_load_package_exports_the_processes_and_leaves_the_module_name_free():
    import labserve.load
    import labserve.load.arrivals as module

    # The factory shares the module's name, so the package exports the classes only:
    # ``labserve.load.arrivals`` stays the module; the factory is ``...arrivals.arrivals``.
    assert labserve.load.arrivals is module
    assert set(labserve.load.__all__) == set(module.__all__) - {"arrivals"}


def test_the_module_is_pure_numpy_with_no_clock_thread_or_loop():
    import labserve.load.arrivals as module

    tree = ast.parse(pathlib.Path(module.__file__).read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    allowed = {
        "__future__",
        "abc",
        "collections",
        "dataclasses",
        "math",
        "numbers",
        "numpy",
        "typing",
    }
    assert imported, "the probe must see the module's imports"
    assert imported <= allowed, imported - allowed
