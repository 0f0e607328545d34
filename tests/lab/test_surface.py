"""profile_tokens: the cost surface of a padded model over batch size and padded width."""

import json
import pathlib

import numpy as np
import pytest

import labserve
from labserve.lab.surface import (
    MINILM_SURFACE,
    CostSurface,
    TokenCost,
    load_surface,
    profile_tokens,
)


class VirtualTime:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


CLOCK = VirtualTime()


class Padded(labserve.Runnable):
    """Costs 2 ms + 0.1 ms per item + 0.01 ms per padded token, on the virtual clock."""

    @labserve.method(batchable=True, pad=labserve.Padding(axis=1))
    def encode(self, ids, lengths):
        assert (lengths == lengths[0]).all()
        n, width = ids.shape
        CLOCK.now += (2.0 + 0.1 * n + 0.01 * n * width) / 1000.0
        return ids.sum(axis=1)


def test_the_surface_and_its_fit_recover_each_cost_term():
    runner = labserve.Runner(Padded, name="p")
    try:
        surface = profile_tokens(
            runner.encode,
            example=lambda n: np.ones((1, n), dtype=np.int64),
            sizes=(1, 4, 16),
            widths=(8, 32, 128),
            repeats=2,
            timer=CLOCK,
        )
    finally:
        runner.stop()
    assert surface.fit.fixed_ms == pytest.approx(2.0)
    assert surface.fit.per_item_ms == pytest.approx(0.1)
    assert surface.fit.per_token_ms == pytest.approx(0.01)
    assert surface.median_s[2][1] == pytest.approx((2.0 + 1.6 + 0.01 * 16 * 32) / 1000.0)
    # Between measured points it interpolates; beyond them it uses the fit.
    assert surface(4, 4 * 20) == pytest.approx((2.0 + 0.4 + 0.01 * 80) / 1000.0)
    assert surface(64, 64 * 256) == pytest.approx(surface.fit.seconds(64, 64 * 256))
    assert "0.01000 ms x padded tokens" in surface.table()


def test_a_method_without_a_ragged_axis_is_refused():
    from labserve.lab.demo import SleepModel

    runner = labserve.Runner(SleepModel(a_ms=0.0, b_ms=0.0), name="s")
    try:
        with pytest.raises(TypeError, match="no ragged axis"):
            profile_tokens(runner.predict, example=lambda n: np.ones((1, n)))
    finally:
        runner.stop()


def test_token_cost_terms_are_named_by_what_they_count_and_checked():
    cost = TokenCost(fixed_ms=1.0, per_item_ms=0.5, per_token_ms=0.01)
    assert cost(2, 100) == pytest.approx(0.003)
    with pytest.raises(ValueError, match="per_token_ms must be a number >= 0"):
        TokenCost(fixed_ms=1.0, per_token_ms=-1.0)


def test_the_fit_keeps_every_term_nonnegative():
    # Times that fall with more items would give a negative per-item term: it is dropped.
    points = CostSurface(
        (1, 2), (10,), ((0.003,), (0.002,)), TokenCost(0.0)
    )  # a surface can be built by hand too
    assert points(1, 10) == pytest.approx(0.003)
    from labserve.lab.surface import _fit

    fit = _fit([(1, 10, 0.003), (2, 20, 0.0025), (4, 40, 0.002)])
    assert fit.per_item_ms >= 0 and fit.per_token_ms >= 0


def test_the_shipped_minilm_profile_is_the_benchmarks_one_and_loads():
    # Lesson 08 simulates from the package's copy: it must not drift from the measured one.
    benchmark = pathlib.Path(__file__).parents[2] / "benchmarks" / "tokens" / "minilm_surface.json"
    assert json.loads(MINILM_SURFACE.read_text()) == json.loads(benchmark.read_text())
    surface = load_surface()
    assert surface.sizes[0] == 1 and surface.widths[-1] == 256
    assert surface(1, 8) == pytest.approx(surface.median_s[0][0])  # a measured point
    assert surface(64, 64 * 16) > surface(64, 64 * 8)  # wider costs more


def test_load_surface_reads_a_saved_profile(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"sizes": [1, 4], "widths": [8], "median_s": [[0.01], [0.02]],
                                "fit": {"fixed_ms": 5.0, "per_token_ms": 0.1}}))  # fmt: skip
    surface = load_surface(path)
    assert surface(4, 32) == pytest.approx(0.02) and surface.fit.fixed_ms == 5.0
