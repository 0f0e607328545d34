"""What a generation run measured, per request and per step, as vLLM and DistServe define it.

TTFT = first token's time - arrival; ITL = the gaps between a sequence's tokens;
TPOT = (e2e - TTFT) / (output tokens - 1); e2e = last token's time - arrival; goodput =
requests per second that meet both a TTFT and a TPOT target. Arrival is the intended
arrival time, so queueing counts (no coordinated omission). Plain numpy arrays: the
simulator and the live runtime build the same object, so one table or chart shows both.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from labserve.generation.sequence import SEQ_OUTCOMES, Finished, StepRecord

__all__ = ["GenerationResult", "StepSeries"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

_PERCENTILES = (50.0, 90.0, 95.0, 99.0)


@dataclass(frozen=True)
class StepSeries:
    """Per-step records as columns (times in seconds): what a lesson plots step by step.

    A step is *chained* when the next one started as soon as it ended (sequences were still
    running or waiting after it); the start of a chained step to the next one's start is its
    whole cost to the run: the model, sampling, detokenising and the driver's hand-offs.
    """

    start_s: F64
    end_s: F64
    num_seqs: I64
    num_prefill_tokens: I64
    num_decode_tokens: I64
    num_running: I64
    num_waiting: I64
    kv_blocks_used: I64
    num_preempted: I64
    num_context_tokens: I64
    """Context tokens read by each step's attention (0 where the recorder was not told)."""
    num_cache_queries: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    """Prompt tokens each step's admissions looked up in the prefix cache."""
    num_cache_hits: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    """Of those, the tokens found cached (not computed)."""

    @classmethod
    def from_records(cls, records: Sequence[StepRecord]) -> StepSeries:
        """Columns from step records, in order."""

        def f64(name: str) -> F64:
            return np.fromiter((getattr(r, name) for r in records), np.float64, len(records))

        def i64(name: str) -> I64:
            return np.fromiter((getattr(r, name) for r in records), np.int64, len(records))

        return cls(
            start_s=f64("start_s"),
            end_s=f64("end_s"),
            num_seqs=i64("num_seqs"),
            num_prefill_tokens=i64("num_prefill_tokens"),
            num_decode_tokens=i64("num_decode_tokens"),
            num_running=i64("num_running"),
            num_waiting=i64("num_waiting"),
            kv_blocks_used=i64("kv_blocks_used"),
            num_preempted=i64("num_preempted"),
            num_context_tokens=i64("num_context_tokens"),
            num_cache_queries=i64("num_cache_queries"),
            num_cache_hits=i64("num_cache_hits"),
        )

    def __len__(self) -> int:
        return len(self.start_s)

    @property
    def num_batched_tokens(self) -> I64:
        """New tokens computed by each step (prefill and decode)."""
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def chained(self) -> npt.NDArray[np.bool_]:
        """Which steps the next step followed at once (work was left; the last step: no).

        A step after which nothing ran or waited was followed by idle time until the next
        arrival, so its start-to-next-start span is not its cost.
        """
        out = np.zeros(len(self), np.bool_)
        if len(self) > 1:
            out[:-1] = (self.num_running[:-1] + self.num_waiting[:-1]) > 0
        return out

    @property
    def span_s(self) -> F64:
        """Each step's start to the next one's start, seconds; NaN where not :attr:`chained`."""
        out = np.full(len(self), np.nan)
        ok = self.chained
        out[ok] = self.start_s[1:][ok[:-1]] - self.start_s[:-1][ok[:-1]]
        return out


def _gaps(done: Sequence[Finished], counts: npt.NDArray[np.int64]) -> F64:
    """Every request's inter-token gaps, request after request.

    One ``np.diff`` of all the token times, with the gaps across two requests taken out
    (a diff per request took 0.17 s of a 2.9 s profile of one 120 s search point).
    """
    total = int(counts.sum())
    if total < 2:
        return np.zeros(0)
    times = np.fromiter(
        itertools.chain.from_iterable(f.token_times_s for f in done), np.float64, total
    )
    starts = np.cumsum(counts) - counts  # each request's first token in ``times``
    across = starts[(starts > 0) & (starts < total)] - 1  # the gap before it
    return np.delete(np.diff(times), across)


@dataclass(frozen=True)
class GenerationResult:
    """Per-request measurements of a generation run (times in seconds), and its steps.

    Requests are in arrival order. ``first_token_s`` is NaN for a request that produced no
    token; ``itl_s`` holds every request's inter-token gaps, request ``i``'s at
    ``itl_s[itl_offsets[i]:itl_offsets[i + 1]]``.
    """

    arrival_s: F64
    first_token_s: F64
    end_s: F64
    prompt_len: I64
    num_output: I64
    outcome: I64
    """Index into :data:`~labserve.generation.sequence.SEQ_OUTCOMES`."""
    num_preemptions: I64
    itl_s: F64
    itl_offsets: I64
    steps: StepSeries
    refused: int = 0
    """Requests refused at admission (not in the arrays)."""

    @classmethod
    def from_finished(
        cls,
        finished: Sequence[Finished],
        steps: Sequence[StepRecord] | StepSeries,
        refused: int = 0,
    ) -> GenerationResult:
        """Build from each sequence's outcome (any order) and the steps (records or columns)."""
        done = sorted(finished, key=lambda f: (f.arrival_s, f.seq_id))
        n = len(done)
        counts = np.fromiter((len(f.token_times_s) for f in done), np.int64, n)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.maximum(counts - 1, 0), out=offsets[1:])
        code = {o: i for i, o in enumerate(SEQ_OUTCOMES)}
        return cls(
            arrival_s=np.fromiter((f.arrival_s for f in done), np.float64, n),
            first_token_s=np.fromiter(
                (f.token_times_s[0] if f.token_times_s else np.nan for f in done), np.float64, n
            ),
            end_s=np.fromiter((f.end_s for f in done), np.float64, n),
            prompt_len=np.fromiter((f.prompt_len for f in done), np.int64, n),
            num_output=counts,
            outcome=np.fromiter((code[f.outcome] for f in done), np.int64, n),
            num_preemptions=np.fromiter((f.num_preemptions for f in done), np.int64, n),
            itl_s=_gaps(done, counts),
            itl_offsets=offsets,
            steps=steps if isinstance(steps, StepSeries) else StepSeries.from_records(steps),
            refused=refused,
        )

    def __len__(self) -> int:
        return len(self.arrival_s)

    # -- per-request latencies (served requests only) ---------------------------------

    @property
    def served(self) -> npt.NDArray[np.bool_]:
        """Which requests ended with all their tokens (outcome ``served``)."""
        return np.asarray(self.outcome == SEQ_OUTCOMES.index("served"))

    @property
    def ttft_s(self) -> F64:
        """Time to first token of each served request."""
        ok = self.served
        return np.asarray(self.first_token_s[ok] - self.arrival_s[ok])

    @property
    def e2e_s(self) -> F64:
        """End-to-end latency of each served request: its last token's time - arrival."""
        ok = self.served
        return np.asarray(self.end_s[ok] - self.arrival_s[ok])

    @property
    def tpot_s(self) -> F64:
        """Time per output token after the first, of each served request with 2+ tokens."""
        ok = self.served & (self.num_output > 1)
        decode = self.end_s[ok] - self.first_token_s[ok]
        return np.asarray(decode / (self.num_output[ok] - 1))

    @property
    def served_itl_s(self) -> F64:
        """The inter-token gaps of the served requests."""
        ok = np.flatnonzero(self.served)
        parts = [self.itl_s[self.itl_offsets[i] : self.itl_offsets[i + 1]] for i in ok]
        return np.concatenate(parts) if parts else np.zeros(0)

    def percentiles_ms(self, metric: str) -> dict[str, float]:
        """p50/p90/p95/p99 of ``ttft``, ``itl``, ``tpot`` or ``e2e``, in milliseconds."""
        values = {
            "ttft": self.ttft_s,
            "itl": self.served_itl_s,
            "tpot": self.tpot_s,
            "e2e": self.e2e_s,
        }[metric]
        if values.size == 0:
            return {f"p{p:g}": float("nan") for p in _PERCENTILES}
        got = np.percentile(values, _PERCENTILES) * 1000.0
        return {f"p{p:g}": float(v) for p, v in zip(_PERCENTILES, got, strict=True)}

    # -- rates ----------------------------------------------------------------------------

    @property
    def span_s(self) -> float:
        """From the first arrival to the last request's end."""
        if len(self) == 0:
            return 0.0
        return float(self.end_s.max() - self.arrival_s.min())

    @property
    def output_tokens_per_s(self) -> float:
        """Output tokens of every request over the run's span."""
        span = self.span_s
        return float(self.num_output.sum()) / span if span > 0 else 0.0

    @property
    def input_tokens_per_s(self) -> float:
        """Prompt tokens of the served requests over the run's span."""
        span = self.span_s
        return float(self.prompt_len[self.served].sum()) / span if span > 0 else 0.0

    def meeting(self, ttft_slo_ms: float, tpot_slo_ms: float) -> npt.NDArray[np.bool_]:
        """Which requests were served within both targets (a target of 0 is no target).

        A request of one token has no TPOT and meets that target, as vLLM counts it.
        """
        ok = self.served.copy()
        if ttft_slo_ms > 0:
            ok &= self.first_token_s - self.arrival_s <= ttft_slo_ms / 1000.0
        if tpot_slo_ms > 0:
            many = self.num_output > 1
            tpot = np.where(
                many, (self.end_s - self.first_token_s) / np.maximum(self.num_output - 1, 1), 0.0
            )
            ok &= tpot <= tpot_slo_ms / 1000.0
        return np.asarray(ok, dtype=np.bool_)

    def goodput(self, ttft_slo_ms: float, tpot_slo_ms: float) -> float:
        """Requests per second meeting both targets (0: no target), over the run's span."""
        span = self.span_s
        if span <= 0:
            return 0.0
        return float(self.meeting(ttft_slo_ms, tpot_slo_ms).sum()) / span

    def summary(self) -> dict[str, float]:
        """The headline figures: rates and the p50/p99 of each latency, in ms."""
        out: dict[str, float] = {
            "requests": float(len(self)),
            "served": float(self.served.sum()),
            "output_tokens_per_s": self.output_tokens_per_s,
            "preemptions": float(self.num_preemptions.sum()),
        }
        for metric in ("ttft", "itl", "tpot", "e2e"):
            p = self.percentiles_ms(metric)
            out[f"{metric}_p50_ms"] = p["p50"]
            out[f"{metric}_p99_ms"] = p["p99"]
        return out
