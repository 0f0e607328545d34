"""A shared-prefix workload in this process: sessions of turns sent to a generative method.

:func:`start_workload_load` sends a :class:`~labserve.generation.workload.SharedPrefixWorkload`
to ``runner.<method>`` from the runner's background loop: session ``k`` starts at the
arrival process's ``k``-th time, and each of its turns streams the prompt the workload makes
from the history (the model's real replies, as token ids) with ``ignore_eos`` and
temperature 0; the next turn goes ``think_time_s`` after the last reply ended (a closed loop
within a session). Every turn is a row of :attr:`WorkloadLoad.rows`, with its TTFT from
its intended start (no coordinated omission) and its one outcome.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import numpy as np

from labserve.base.errors import LabServeError
from labserve.generation.workload import SharedPrefixWorkload, ttft_by_turn
from labserve.lab.generation.load import ScheduledLoad
from labserve.load.arrivals import Arrivals
from labserve.runtime.generation.method import GenerativeMethod

__all__ = ["TurnRow", "WorkloadLoad", "start_workload_load"]

_MAX_WORKLOAD_ID = ord("z")  # the workload's ids are lowercase ASCII and spaces


@dataclass
class TurnRow:
    """One turn of one session as it went. Times in seconds from the run's start."""

    session: int
    turn: int
    intended_s: float
    prompt: tuple[int, ...]
    first_token_s: float = math.nan
    end_s: float = math.nan
    outcome: str = "cancelled"
    """``served``, the error's type name (``QueueFullError``...), or ``cancelled``."""
    reply: tuple[int, ...] = ()

    @property
    def ttft_s(self) -> float:
        """First text piece - intended start (NaN unless it came)."""
        return self.first_token_s - self.intended_s


class WorkloadLoad(ScheduledLoad):
    """Sessions sent to a method in this process on its runner's loop (see the module).

    Thread-safe: :attr:`running`, :attr:`sent` (sessions started, as an HTTP session load
    counts them; turns: ``rows``) and :meth:`stop` from any thread; read :attr:`rows` and
    :meth:`per_turn` once the run ended (``result()``).
    """

    def __init__(
        self, method: GenerativeMethod, workload: SharedPrefixWorkload, times_s: np.ndarray
    ) -> None:
        self.workload = workload
        self.rows: list[TurnRow] = []
        """Every turn sent, in the order they went out."""
        super().__init__(method, times_s)

    def result(self, timeout: float | None = None) -> list[TurnRow]:
        """Wait for the run to end; its rows (raises what ended the run, if anything did)."""
        self._future.result(timeout)
        return self.rows

    def per_turn(self) -> dict[int, dict[str, float]]:
        """TTFT by turn index (count, mean, p50, p99 in ms) of the served turns."""
        ttft = np.asarray([r.ttft_s if r.outcome == "served" else math.nan for r in self.rows])
        return ttft_by_turn(ttft, np.asarray([r.turn for r in self.rows], dtype=np.int64))

    async def _arrival(self, k: int, start: float, at: float) -> None:
        """Session ``k``'s turns, each after the last one's reply and the think time."""
        w = self.workload
        replies: list[list[int]] = []
        intended, last_end = at, at
        for t in range(w.turns):
            if t:  # the next turn is due a think time after this session's last reply
                intended = last_end + w.think_time_s
                await asyncio.sleep(start + intended - asyncio.get_running_loop().time())
            row = TurnRow(k, t, intended, tuple(w.prompt_ids(k, t, replies)))
            self.rows.append(row)
            if not await self._turn(row, start) or self._stopped.is_set():
                return
            last_end = row.end_s
            replies.append(list(row.reply))

    async def _turn(self, row: TurnRow, start: float) -> bool:
        """Stream one turn into ``row``; True when it was served."""
        loop = asyncio.get_running_loop()
        max_tokens = self.workload.max_tokens(row.session, row.turn)
        stream = self.method.astream(
            list(row.prompt), max_tokens=max_tokens, ignore_eos=True, temperature=0.0
        )
        try:
            async for _ in stream:
                if math.isnan(row.first_token_s):
                    row.first_token_s = loop.time() - start
            done = await stream.result()
        except LabServeError as exc:  # refused, timed out, failed: counted, never silent
            row.outcome = type(exc).__name__
            return False
        finally:
            row.end_s = loop.time() - start
            await stream.aclose()
        row.reply = tuple(done.token_ids)
        row.outcome = "served"
        return True

    def __repr__(self) -> str:
        state = "running" if self.running else "done"
        return (
            f"<WorkloadLoad {self.method!r} {self.sent} sessions, {len(self.rows)} turns ({state})>"
        )


def start_workload_load(
    method: GenerativeMethod,
    workload: SharedPrefixWorkload,
    *,
    arrivals: Arrivals,
    duration_s: float,
) -> WorkloadLoad:
    """Start ``workload``'s sessions on ``method``, arriving at ``arrivals`` for ``duration_s``.

    Returns at once. The arrival times come from the workload's seed, so a seed fixes the
    whole run but the replies (the model's own).

    Raises:
        ValueError: the method's vocabulary cannot hold the workload's ids (bytes of
            lowercase ASCII), or the duration breaks its rule.

    >>> w = labserve.SharedPrefixWorkload(prefix_len=256, num_prefixes=4,  # doctest: +SKIP
    ...     input_len=32, output_len=64, turns=4, think_time_s=1.0)
    >>> run = start_workload_load(runner.generate, w, arrivals=poisson(2), duration_s=30)
    """
    vocab = method.vocab_size
    if vocab and vocab <= _MAX_WORKLOAD_ID:
        raise ValueError(
            f"a shared-prefix workload sends bytes of ASCII text as token ids (up to "
            f"{_MAX_WORKLOAD_ID}): {method!r} has vocab_size {vocab}"
        )
    times = arrivals.times(duration_s, seed=workload.seed)
    return WorkloadLoad(method, workload, np.asarray(times, dtype=float))
