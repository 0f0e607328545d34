"""Generation runs step by step, headless: each line holds the run's own per-step values."""

from __future__ import annotations

import numpy as np
import pytest
from bokeh.models import ColumnDataSource, GlyphRenderer, Legend
from jupyter_bokeh import BokehModel
from labserve.widgets import generation_steps_figure, plot_generation_steps

from labserve.config.generation import GenerationConfig
from labserve.sim.generation import StepCost, simulate_generation


@pytest.fixture(scope="module")
def runs():
    kw = dict(n_requests=40, input_len=8, output_len="uniform:1:64", seed=2)
    config = GenerationConfig(max_num_seqs=8, request_timeout_ms=0)
    return {
        "static": simulate_generation(config.replace(strategy="static"), StepCost(5.0), **kw),
        "continuous": simulate_generation(config, StepCost(5.0), **kw),
    }


def sources(fig) -> dict[str, ColumnDataSource]:
    return {s.name: s for s in fig.select({"type": ColumnDataSource})}


def test_one_step_line_per_run_holding_its_steps(runs):
    fig = generation_steps_figure(runs, y="num_seqs")
    by_name = sources(fig)
    assert set(by_name) == {"static", "continuous"}
    for name, run in runs.items():
        assert by_name[name].data["x"] == run.steps.start_s.tolist()
        assert by_name[name].data["y"] == run.steps.num_seqs.astype(float).tolist()
    steps = [r for r in fig.select({"type": GlyphRenderer}) if type(r.glyph).__name__ == "Step"]
    assert len(steps) == 2


def test_tokens_in_a_step_are_prefill_plus_decode(runs):
    data = sources(generation_steps_figure(runs, y="num_batched_tokens"))["continuous"].data
    steps = runs["continuous"].steps
    assert data["y"] == (steps.num_prefill_tokens + steps.num_decode_tokens).tolist()


def test_a_long_run_is_thinned_to_means_that_keep_its_total(runs):
    run = runs["static"]
    data = sources(generation_steps_figure({"s": run}, y="num_seqs", max_points=10))["s"].data
    assert len(data["y"]) == 10
    edges = np.linspace(0, len(run.steps), 11).astype(int)
    weighted = sum(m * n for m, n in zip(data["y"], np.diff(edges), strict=True))
    assert weighted == pytest.approx(run.steps.num_seqs.sum())


def test_bad_input_is_refused_with_what_was_expected(runs):
    with pytest.raises(ValueError, match="y must be one of"):
        generation_steps_figure(runs, y="latency")
    with pytest.raises(ValueError, match="at least one"):
        generation_steps_figure({})
    with pytest.raises(TypeError, match="no per-step records"):
        generation_steps_figure({"x": object()})


def test_plot_wraps_the_figure_in_a_widget(runs):
    chart = plot_generation_steps(runs, y="num_running")
    assert isinstance(chart, BokehModel)


def test_the_first_run_is_drawn_on_top_and_the_legend_takes_no_width(runs):
    # Lesson 09's chunked run vanished under the unchunked one drawn after it.
    fig = generation_steps_figure(runs, y="num_seqs")
    drawn = [r.data_source.name for r in fig.renderers]  # Bokeh draws in this order
    assert drawn == list(reversed(runs))
    (legend,) = fig.select({"type": Legend})
    assert [item.label.value for item in legend.items] == list(runs)
    assert legend in fig.above and legend.orientation == "horizontal"
    assert all(r.glyph.line_alpha < 1 for r in fig.renderers)  # where they overlap, both show


def test_fidelity_bars_hold_each_reports_errors_in_figure_order():
    from labserve.widgets import fidelity_figure, plot_fidelity

    import labserve

    kw = dict(n_requests=60, input_len=16, output_len=8, rate=100.0)
    live = simulate_generation(GenerationConfig(), StepCost(1.0), **kw)
    reports = {
        name: labserve.compare_generation(live, simulate_generation(GenerationConfig(), c, **kw))
        for name, c in (("close", StepCost(1.05)), ("slow", StepCost(1.3)))
    }
    fig = fidelity_figure(reports)
    by_name = sources(fig)
    assert list(fig.x_range.factors)[:2] == ["ttft p50", "ttft p99"]
    for name, report in reports.items():
        assert by_name[name].data["error"] == pytest.approx(
            [report.error_pct(m, q) for m in ("ttft", "itl", "tpot", "e2e") for q in ("p50", "p99")]
        )
    assert by_name["slow"].data["error"][2] == pytest.approx(30.0)  # ITL p50: every step 1.3x
    assert isinstance(plot_fidelity(reports), BokehModel)
    with pytest.raises(ValueError, match="at least one"):
        fidelity_figure({})


def test_search_plot_holds_every_setting_and_marks_the_frontier_and_best():
    from labserve.widgets import plot_search, search_figure

    import labserve

    found = labserve.search_generation(
        labserve.PoissonWorkload(8, 8),
        "ttft:60 tpot:5",
        grid={"max_num_seqs": [1, 4, 8]},
        cost=StepCost(2.0, per_seq_ms=0.2),
        duration_s=3.0,
        warmup_s=0.5,
        probe_s=1.0,
    )
    by_name = sources(search_figure(found))
    assert by_name["settings"].data["rate"] == [r["max_rate"] for r in found.rows]
    assert by_name["best"].data["rate"] == [found.best["max_rate"]]
    front = by_name["frontier"].data
    assert front["user"] == sorted(front["user"])  # the line runs left to right
    assert len(front["rate"]) == len(found.frontier()) >= 1
    assert isinstance(plot_search(found), BokehModel)


def test_search_plot_names_each_fleet_by_its_replicas_and_router():
    from labserve.widgets import search_figure

    import labserve

    found = labserve.search_generation(
        labserve.PoissonWorkload(8, 4),
        "ttft:60 tpot:5",
        grid={"replicas": [1, 2], "router": ["round_robin"]},
        cost=StepCost(2.0, per_seq_ms=0.2),
        duration_s=2.0,
        warmup_s=0.5,
    )
    labels = sources(search_figure(found))["settings"].data["setting"]
    assert [label.split(", ")[:2] for label in labels] == [
        ["replicas=1", "router=round_robin"],
        ["replicas=2", "router=round_robin"],
    ]
