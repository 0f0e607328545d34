"""The generation dashboard's seven Bokeh charts over one ColumnDataSource of ticks.

TTFT and inter-token latency against their targets, sequences running and waiting (and
preempted), tokens per step split into prefill and decode against the step's budget, KV
blocks used and cached against the cache's, throughput (served requests, goodput, output
tokens), and the prefix cache (hit rate, prefill tokens saved per second).
Every chart shares one time axis that the kernel moves in steps (``axes.py``), and one
source (one row per tick, ``series.py``). Whoever streams into them must be the only
writer of their document (the dashboard's pump). Not thread-safe.
"""

from __future__ import annotations

from typing import Any

from bokeh.models import FixedTicker, LayoutDOM, LinearAxis
from bokeh.palettes import Category10

from ..axes import SteppedAxes
from ..charts_base import ChartsBase
from .series import GEN_COLUMNS

__all__ = ["GenerationCharts"]

_C = Category10[10]


class GenerationCharts(ChartsBase):
    """TTFT, ITL, sequences, tokens per step, KV, throughput, prefix cache: last ``follow_s``."""

    def __init__(
        self, *, follow_s: float = 60.0, hz: float = 5.0, width: int = 470, height: int = 210
    ) -> None:
        super().__init__(GEN_COLUMNS, follow_s=follow_s, hz=hz, width=width, height=height)
        self.axes: SteppedAxes
        src = self.ticks

        def timeline(title: str, y_label: str, columns: list[str], **kw: Any) -> Any:
            log = kw.get("log", False)
            # Ticks that move with the range (axes.log_ticks): 1, 2, 5 per decade over a few
            # decades, the decades only over more (fixed 1, 2, 5 ticks heaped up there).
            ticker = FixedTicker() if log else None
            stacked = kw.get("stacked", False)
            caps = kw.get("caps", ())
            y_range = self.axes.y(columns, log=log, stacked=stacked, ticker=ticker, caps=caps)
            return self._figure(title, y_label, self.axes.x, y_range, ticker)

        ttft = timeline("Time to first token (window)", "ms",
                        ["ttft_p50", "ttft_p99", "ttft_slo_ms"], log=True)  # fmt: skip
        ttft.line("t", "ttft_p50", source=src, color=_C[2], line_width=2, legend_label="p50")
        ttft.line("t", "ttft_p99", source=src, color=_C[3], line_width=2, legend_label="p99")
        ttft.step("t", "ttft_slo_ms", source=src, color=_C[2], line_dash="dashed", mode="after",
                  line_width=2, legend_label="ttft_slo_ms")  # fmt: skip

        itl = timeline("Inter-token latency (window)", "ms",
                       ["itl_p50", "itl_p99", "tpot_p99", "tpot_slo_ms"], log=True)  # fmt: skip
        itl.line("t", "itl_p50", source=src, color=_C[2], line_width=2, legend_label="ITL p50")
        itl.line("t", "itl_p99", source=src, color=_C[3], line_width=2, legend_label="ITL p99")
        itl.line("t", "tpot_p99", source=src, color=_C[1], line_dash="dotted", line_width=2,
                 legend_label="TPOT p99")  # fmt: skip
        itl.step("t", "tpot_slo_ms", source=src, color=_C[2], line_dash="dashed", mode="after",
                 line_width=2, legend_label="tpot_slo_ms")  # fmt: skip

        seqs = timeline("Sequences (now; preempted: last 1 s)", "sequences",
                        ["num_running", "num_waiting", "max_num_seqs", "preempted"],
                        caps=["max_num_seqs"])  # fmt: skip
        seqs.step("t", "num_running", source=src, color=_C[0], mode="after", line_width=2,
                  legend_label="running")  # fmt: skip
        seqs.step("t", "num_waiting", source=src, color=_C[1], mode="after", line_width=2,
                  legend_label="waiting")  # fmt: skip
        seqs.step("t", "max_num_seqs", source=src, color=_C[3], mode="after", line_dash="dashed",
                  legend_label="max_num_seqs")  # fmt: skip
        seqs.line("t", "preempted", source=src, color=_C[4], legend_label="preempted")

        # A bar per tick (a tick without steps has none). The y axis follows the tokens, not
        # the budget: a step of a few decode tokens under a budget of thousands stays
        # readable; the budget's line shows when the steps come near it.
        step = timeline("Tokens per step (mean of each tick's steps)", "tokens",
                        ["prefill_per_step", "decode_per_step"], stacked=True)  # fmt: skip
        step.vbar_stack(["decode_per_step", "prefill_per_step"], x="t", width=0.8 / hz,
                        source=src, color=[_C[0], _C[1]], line_width=0,
                        legend_label=["decode", "prefill"])  # fmt: skip
        step.step("t", "max_num_batched_tokens", source=src, color=_C[3], mode="after",
                  line_dash="dashed", legend_label="max_num_batched_tokens")  # fmt: skip

        # Cached blocks beside the blocks used: a cached block no sequence holds is free
        # (evicted when a new block is needed), so it may stand above the used line.
        kv = timeline("KV cache (now)", "blocks",
                      ["kv_blocks_used", "kv_blocks_cached", "num_kv_blocks"],
                      caps=["num_kv_blocks"])  # fmt: skip
        kv.step("t", "kv_blocks_used", source=src, color=_C[0], mode="after", line_width=2,
                legend_label="blocks used")  # fmt: skip
        kv.step("t", "kv_blocks_cached", source=src, color=_C[2], mode="after", line_width=2,
                legend_label="blocks cached (prefix)")  # fmt: skip
        kv.step("t", "num_kv_blocks", source=src, color=_C[3], mode="after", line_dash="dashed",
                legend_label="num_kv_blocks")  # fmt: skip

        rate = timeline("Throughput (window)", "requests / s", ["requests_per_s", "goodput"])
        rate.line("t", "requests_per_s", source=src, color=_C[0], line_width=2,
                  legend_label="served req/s")  # fmt: skip
        rate.line("t", "goodput", source=src, color=_C[2], line_width=2,
                  legend_label="goodput req/s")  # fmt: skip
        self._right_line(rate, "output_tokens_per_s", "output tokens / s",
                         "output tokens/s (right)")  # fmt: skip

        prefix = self._prefix_cache(timeline)

        self.figures = {"ttft": ttft, "itl": itl, "sequences": seqs, "tokens_per_step": step,
                        "kv": kv, "throughput": rate, "prefix_cache": prefix}  # fmt: skip
        self.layout: LayoutDOM = self._grid(
            [["ttft", "itl"], ["sequences", "tokens_per_step"], ["kv", "throughput"],
             ["prefix_cache", None]]
        )  # fmt: skip

    def _prefix_cache(self, timeline: Any) -> Any:
        """Hit rate (window) on the left; prefill tokens saved per second on the right."""
        src = self.ticks
        fig = timeline("Prefix cache (window)", "hit rate (%)", ["prefix_hit_pct"])
        fig.line("t", "prefix_hit_pct", source=src, color=_C[2], line_width=2,
                 legend_label="hit rate % of prompt tokens")  # fmt: skip
        self._right_line(fig, "prefill_saved_per_s", "prefill tokens saved / s",
                         "prefill tokens saved/s (right)")  # fmt: skip
        return fig

    def _right_line(self, fig: Any, column: str, axis_label: str, legend: str) -> None:
        """``column`` as a dashed line on an axis of its own on ``fig``'s right."""
        fig.extra_y_ranges = {column: self.axes.y([column])}
        fig.add_layout(LinearAxis(y_range_name=column, axis_label=axis_label), "right")
        fig.line("t", column, source=self.ticks, color=_C[7], line_dash="dashed",
                 y_range_name=column, legend_label=legend)  # fmt: skip

    def set_window(self, window_s: float) -> None:
        """Say in the window charts' titles how long the window is."""
        for name, what in (("ttft", "Time to first token"), ("itl", "Inter-token latency"),
                           ("throughput", "Throughput"),
                           ("prefix_cache", "Prefix cache")):  # fmt: skip
            title = f"{what} (last {window_s:.0f} s)"
            fig = self.figures[name]
            if fig.title.text != title:
                fig.title.text = title
