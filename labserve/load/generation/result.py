"""What a generation load measured, as a client: TTFT, ITL, TPOT, e2e, tokens/s, goodput.

The latencies are taken from the stream's arrival times as the client read them, from
each request's *intended* send time (no coordinated omission), with the definitions the
simulator and the runtime use (:class:`~labserve.generation.results.GenerationResult`,
which holds them here too): TTFT = the first content chunk's arrival - intended send;
ITL = the gaps between a request's content chunks; TPOT = (e2e - TTFT) / (output tokens
- 1); e2e = the end of the stream (``data: [DONE]``) - intended send. Output tokens are
the server's ``usage.completion_tokens`` when the stream carries it, else the number of
content chunks (a chunk that carries several tokens then counts as one, as it does for
``vllm bench serve``). Goodput counts served requests meeting every target given
(:mod:`labserve.load.generation.goodput`) per second of the run's span. Immutable; thread-safe.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from labserve.base.vocabulary import CANCELLED, OUTCOMES, SERVED, TIMEOUT
from labserve.generation.results import GenerationResult, StepSeries
from labserve.generation.sequence import SEQ_OUTCOMES, SeqOutcome
from labserve.generation.workload import ttft_by_turn
from labserve.load.generation.server_view import server_percentile_key, server_percentile_ms
from labserve.load.generation.stream import GenRecord

__all__ = ["GenerationLoadResult", "build_result"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
_METRICS = ("ttft", "itl", "tpot", "e2e")
_QS = (50.0, 90.0, 95.0, 99.0)
_SIDE_BY_SIDE = ("p50", "p90", "p95", "p99")  # the client's and the server's, in the summary


@dataclass(frozen=True)
class GenerationLoadResult:
    """A generation load run as its client saw it, request by request (in send order)."""

    generation: GenerationResult
    """Per-request times (seconds from the run's start) and counts, in the shared type."""
    outcome: I64
    """Each request's outcome as the client saw it: an index into ``OUTCOMES``."""
    tokens_from_usage: npt.NDArray[np.bool_]
    """Whether each request's output tokens are the server's usage (else its chunk count)."""
    asked_input: I64
    """Each request's drawn input length (bytes of prompt)."""
    asked_output: I64
    """Each request's ``max_tokens``."""
    duration_s: float
    """How long requests were sent for."""
    goodput_ms: dict[str, float] = field(default_factory=dict)
    """The goodput targets, ms by key (``ttft``, ``tpot``, ``e2el``); empty: none."""
    send_lag_s: F64 | None = None
    """Open loop: how late each request went out after its intended time."""
    errors: dict[str, int] = field(default_factory=dict)
    """What the failed requests were told (the message, by count)."""
    server: dict[str, Any] | None = None
    """Against labserve: its ``/stats`` for the model over the run (see ``server_view``)."""
    label: str = ""
    clock_t0_s: float = 0.0
    """The run's time 0 on ``time.monotonic`` (to line its times up with a server's)."""
    session: I64 | None = None
    """A session load: each request's session (None for a load of single requests)."""
    turn: I64 | None = None
    """A session load: each request's turn in its session."""

    def __len__(self) -> int:
        return len(self.outcome)

    @property
    def served(self) -> npt.NDArray[np.bool_]:
        """Which requests were served: their stream ended as it should."""
        return np.asarray(self.outcome == SERVED)

    def goodput_rps(self) -> float:
        """Served requests per second meeting every goodput target, over the run's span."""
        g = self.generation
        span = g.span_s
        if span <= 0:
            return 0.0
        return float(self._good().sum()) / span

    def _good(self) -> npt.NDArray[np.bool_]:
        g = self.generation
        ok = self.served.copy()
        limits = self.goodput_ms
        if "ttft" in limits:
            ok &= (g.first_token_s - g.arrival_s) * 1000.0 <= limits["ttft"]
        if "tpot" in limits:
            many = g.num_output > 1
            tpot = np.where(
                many, (g.end_s - g.first_token_s) / np.maximum(g.num_output - 1, 1), 0.0
            )
            ok &= tpot * 1000.0 <= limits["tpot"]
        if "e2el" in limits:
            ok &= (g.end_s - g.arrival_s) * 1000.0 <= limits["e2el"]
        return np.asarray(ok)

    @property
    def textless(self) -> int:
        """Served requests whose stream carried no text: they have no TTFT or TPOT."""
        return int((self.served & np.isnan(self.generation.first_token_s)).sum())

    def percentiles_ms(self, metric: str) -> dict[str, float]:
        """Mean, p50, p90, p95 and p99 of ``ttft``, ``itl``, ``tpot`` or ``e2e`` (served), ms.

        TTFT and TPOT leave out the served requests whose stream carried no text (no first
        token to time: see :attr:`textless`), instead of being NaN for the whole run.
        """
        values = {
            "ttft": self.generation.ttft_s,
            "itl": self.generation.served_itl_s,
            "tpot": self.generation.tpot_s,
            "e2e": self.generation.e2e_s,
        }[metric]
        values = values[~np.isnan(values)]
        if values.size == 0:
            return {"mean": math.nan} | {f"p{q:g}": math.nan for q in _QS}
        got = np.percentile(values, _QS) * 1000.0
        return {"mean": float(values.mean() * 1000.0)} | {
            f"p{q:g}": float(v) for q, v in zip(_QS, got, strict=True)
        }

    def per_turn(self) -> dict[int, dict[str, float]]:
        """TTFT by turn index (count, mean, p50, p99 in ms) of the served requests.

        A load of single requests has one turn, 0.
        """
        g = self.generation
        ttft = np.where(self.served, g.first_token_s - g.arrival_s, np.nan)
        turn = self.turn if self.turn is not None else np.zeros(len(self), np.int64)
        return ttft_by_turn(ttft, turn)

    def _turn_lines(self) -> list[str]:
        if self.turn is None:
            return []
        lines = [f"{'by turn':<14}{'served':>9}{'TTFT p50':>10}{'TTFT p99':>10}  (ms)"]
        for t, v in self.per_turn().items():
            lines.append(f"  turn {t:<8}{int(v['n']):>9,}{v['p50']:>10.2f}{v['p99']:>10.2f}")
        return lines

    def summary(self) -> dict[str, Any]:
        """The headline figures: counts, rates, goodput, each latency's percentiles (ms)."""
        g = self.generation
        served = self.served
        span = g.span_s
        out_tokens = int(g.num_output[served].sum())
        out: dict[str, Any] = {
            "requests": len(self),
            "served": int(served.sum()),
            "outcomes": {
                OUTCOMES[o]: int(c) for o, c in sorted(Counter(self.outcome.tolist()).items())
            },
            "span_s": span,
            "served_rps": float(served.sum()) / span if span > 0 else 0.0,
            "input_tokens": int(g.prompt_len[served].sum()),
            "output_tokens": out_tokens,
            "output_tokens_per_s": out_tokens / span if span > 0 else 0.0,
            "tokens_from_usage": int(self.tokens_from_usage[served].sum()),
            "goodput_rps": self.goodput_rps(),
            "good": int(self._good().sum()),
            "textless": self.textless,
        }
        for metric in _METRICS:
            for key, value in self.percentiles_ms(metric).items():
                out[f"{metric}_{key}_ms"] = value
        if self.send_lag_s is not None and len(self.send_lag_s):
            out["send_lag_p99_ms"] = float(np.percentile(self.send_lag_s, 99) * 1000.0)
            out["send_lag_max_ms"] = float(self.send_lag_s.max() * 1000.0)
        if self.turn is not None:
            out["sessions"] = len(np.unique(self.session)) if self.session is not None else 0
            out["ttft_by_turn_ms"] = self.per_turn()
        return out

    def table(self) -> str:
        """The summary as a readable block: counts, rates, a latency table, the server's view."""
        s = self.summary()
        served = s["served"]
        others = {k: v for k, v in s["outcomes"].items() if k != "served"}
        outcomes = f" (not served: {', '.join(f'{k} {v}' for k, v in others.items())})"
        if not served:
            source = "the served requests: none"
        elif s["tokens_from_usage"] == served:
            source = "usage"
        elif s["tokens_from_usage"] == 0:
            source = "chunks: the stream carried no usage"
        else:
            source = f"usage for {s['tokens_from_usage']} of {served}, chunks for the rest"
        lines = [self.label] if self.label else []
        lines += [
            f"requests      {s['requests']:,} sent, {served:,} served{outcomes if others else ''}",
            f"tokens        {s['input_tokens']:,} in, {s['output_tokens']:,} out "
            f"(counted from {source})",
            f"throughput    {s['served_rps']:,.2f} req/s, {s['output_tokens_per_s']:,.1f} "
            f"output tokens/s over {s['span_s']:.1f} s",
            self._goodput_line(s),
            f"{'latency (ms)':<14}{'mean':>9}{'p50':>9}{'p90':>9}{'p95':>9}{'p99':>9}",
        ]
        for metric in _METRICS:
            row = "".join(f"{s[f'{metric}_{k}_ms']:>9.2f}" for k in ("mean", "p50", "p90"))
            row += "".join(f"{s[f'{metric}_{k}_ms']:>9.2f}" for k in ("p95", "p99"))
            lines.append(f"  {metric.upper():<12}{row}")
        if s["textless"]:
            lines.append(
                f"  TTFT and TPOT over {served - s['textless']:,} of {served:,} served: "
                f"{s['textless']:,} stream(s) carried no text to time a first token by"
            )
        if "send_lag_p99_ms" in s:
            lines.append(
                f"send lag      p99 {s['send_lag_p99_ms']:.2f} ms, max {s['send_lag_max_ms']:.2f} "
                "ms (latencies count from the intended send times)"
            )
        lines += self._turn_lines()
        lines += [f"error         {n} x {said}" for said, n in self.errors.items()]
        lines += self._server_lines()
        return "\n".join(lines)

    def _goodput_line(self, s: dict[str, Any]) -> str:
        if not self.goodput_ms:
            return "goodput       no targets given (--goodput ttft:MS tpot:MS e2el:MS)"
        targets = ", ".join(f"{k} <= {v:g} ms" for k, v in self.goodput_ms.items())
        share = s["good"] / s["requests"] if s["requests"] else 0.0
        return (
            f"goodput       {s['goodput_rps']:,.2f} req/s ({s['good']:,} of {s['requests']:,} "
            f"requests, {share:.0%}, met {targets})"
        )

    def _server_lines(self) -> list[str]:
        view = self.server
        if view is None:
            return ["server        its own view: not seen (no /stats entry for the model)"]
        lines = [f"server        its /stats for {view['model']}, beside this client's figures:"]
        shown = self._server_latencies(view, lines)
        grown = [f"{k} +{v:,.6g}" for k, v in view["over_run"].items() if v]
        lines += _wrapped("  over the run: ", grown or ["no counter moved"])
        groups: dict[str, list[str]] = {}
        for key, value in view["at_end"].items():
            if key in shown or value is None or key in _CLOCKS or key == "window_s":
                continue  # (the window is said by the rates' heading and the percentiles' note)
            group, _, name = key.rpartition(".")
            if not group and _is_rate(name):
                group = self._rates_heading(view)
            text = f"{value:,.6g}" if isinstance(value, float) else str(value)
            groups.setdefault(group, []).append(f"{name} {text}")
        for group, items in groups.items():
            lines += _wrapped(f"  {group or 'at the end'}: ", items)
        return lines

    def _rates_heading(self, view: dict[str, Any]) -> str:
        """The server's rates cover its window, not this run: the heading says which."""
        window = view["at_end"].get("window_s")
        if not isinstance(window, (int, float)) or isinstance(window, bool):
            return "over its own window, not this run"
        return f"over its last {window:g} s, not this run's {self.generation.span_s:.1f} s"

    def _window_note(self, view: dict[str, Any]) -> str:
        """What the server's percentiles cover: its window, and how it differs from the run."""
        window = view["at_end"].get("window_s")
        if not isinstance(window, (int, float)) or isinstance(window, bool):
            return "(the server's percentiles: over what its /stats holds)"
        span = self.generation.span_s
        note = f"(the server's percentiles: its last {window:g} s"
        if window - span > 0.05:
            before = window - span
            return f"{note}, from {before:.1f} s before this run: what it served then counts too)"
        if span - window > 0.05:
            return f"{note}, the end of this {span:.1f} s run: what ended before is not there)"
        return note + ")"

    def _server_latencies(self, view: dict[str, Any], lines: list[str]) -> set[str]:
        """Add the client's and the server's percentiles side by side; the keys shown."""
        shown: set[str] = set()
        rows = []
        for metric in _METRICS:
            ours = self.percentiles_ms(metric)
            cells = ""
            for q in _SIDE_BY_SIDE:
                key, theirs = server_percentile_key(view, metric, q)
                if key:
                    shown.add(key)
                cells += f"{ours[q]:>9.2f}{theirs:>9.2f}"
            if not all(math.isnan(server_percentile_ms(view, metric, q)) for q in ("p50", "p99")):
                rows.append(f"  {metric.upper():<12}{cells}")
        if rows:
            head = "".join(f"{q + ' here':>9}{'there':>9}" for q in _SIDE_BY_SIDE)
            lines += [f"{'latency (ms)':<14}{head}", *rows]
            lines += textwrap.wrap(
                self._window_note(view), 96, initial_indent="  ", subsequent_indent="   "
            )
        return shown

    def __str__(self) -> str:
        return self.table()


# A server's clock reading at the end of the run: its own epoch, meaningless beside the run's.
_CLOCKS = frozenset({"time_s", "now_s", "clock_s"})


def _is_rate(name: str) -> bool:
    """A per-second figure of the server's snapshot (over its window), by its name."""
    return name.endswith(("_per_s", "_rps", "_ps")) or name == "goodput"


def _wrapped(first: str, items: list[str], width: int = 96) -> list[str]:
    """``items`` joined by commas into lines of at most ``width``, the first led by ``first``."""
    lines, line = [], first
    for item in items:
        if len(line) + len(item) + 2 > width and line.strip():
            lines.append(line.rstrip(", ").rstrip() + ",")
            line = " " * len(first)
        line += item + ", "
    lines.append(line.rstrip(", "))
    return lines


# How the client's outcomes map onto a sequence's (the shared result type's vocabulary).
_SEQ: dict[int, SeqOutcome] = {SERVED: "served", CANCELLED: "cancelled", TIMEOUT: "timeout"}


def build_result(
    rec: GenRecord,
    duration_s: float,
    *,
    goodput_ms: dict[str, float] | None = None,
    server: dict[str, Any] | None = None,
    label: str = "",
    sessions: bool = False,
) -> GenerationLoadResult:
    """The result of a run's records (times become seconds from the run's start).

    ``sessions``: the run sent sessions of turns (the result keeps each request's).
    """
    n = len(rec.arrival)
    t0 = rec.t0
    end = np.asarray(rec.end, dtype=float) - t0
    if n and np.isnan(end).any():  # given up in flight: it ended when the run did
        last = float(np.nanmax(end)) if not np.isnan(end).all() else float(duration_s)
        end = np.where(np.isnan(end), last, end)
    first = np.fromiter((c[0] - t0 if c else math.nan for c in rec.chunks), float, n)
    gaps = [np.diff(np.asarray(c, dtype=float)) for c in rec.chunks]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum([len(g) for g in gaps], out=offsets[1:])
    seq_codes = {name: i for i, name in enumerate(SEQ_OUTCOMES)}
    seq_outcome = np.fromiter((seq_codes[_SEQ.get(o, "failed")] for o in rec.outcome), np.int64, n)
    generation = GenerationResult(
        arrival_s=np.asarray(rec.arrival, dtype=float),
        first_token_s=first,
        end_s=end,
        prompt_len=np.asarray(rec.prompt_tokens, dtype=np.int64),
        num_output=np.asarray(rec.out_tokens, dtype=np.int64),
        outcome=seq_outcome,
        num_preemptions=np.zeros(n, np.int64),
        itl_s=np.concatenate(gaps) if gaps else np.zeros(0),
        itl_offsets=offsets,
        steps=StepSeries.from_records([]),
    )
    return GenerationLoadResult(
        generation=generation,
        outcome=np.asarray(rec.outcome, dtype=np.int64),
        tokens_from_usage=np.asarray(rec.from_usage, dtype=bool),
        asked_input=np.asarray(rec.asked_input, dtype=np.int64),
        asked_output=np.asarray(rec.asked_output, dtype=np.int64),
        duration_s=float(duration_s),
        goodput_ms=dict(goodput_ms or {}),
        send_lag_s=np.asarray(rec.lag, dtype=float) if rec.lag else None,
        errors=dict(sorted(rec.errors.items(), key=lambda kv: -kv[1])),
        server=server,
        label=label,
        clock_t0_s=t0,
        session=np.asarray(rec.session, dtype=np.int64) if sessions else None,
        turn=np.asarray(rec.turn, dtype=np.int64) if sessions else None,
    )
