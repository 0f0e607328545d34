"""A shared-prefix workload over HTTP: each arrival a session of turns that resend their history.

:class:`WorkloadSender` is the :class:`~labserve.load.generation.sender.GenerationSender`
whose requests come from a :class:`~labserve.generation.workload.SharedPrefixWorkload`: an
arrival (or a closed-loop client's next request) starts session ``k``; its turn ``t`` is
sent ``think_time_s`` after turn ``t - 1``'s stream ended, and carries the whole history
with the replies the server streamed (their text, as it came). To ``/v1/chat/completions``
the turn goes as ``messages`` (the prefix as the system message); to ``/v1/completions``
as one ``prompt``, the pieces joined. Each turn is a request of the run's record, with
its session and turn, timed from its intended send time (its session's arrival, or the
end of the last reply plus the think time). A session whose turn is not served ends there.
Loop-only.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from labserve.base.vocabulary import SERVED
from labserve.generation.workload import SharedPrefixWorkload
from labserve.load.generation.sender import GenerationSender
from labserve.load.generation.stream import CompletionStream, GenRecord
from labserve.load.records import clock_s

__all__ = ["WorkloadSender"]


class WorkloadSender(GenerationSender):
    """Sends session ``k`` of a workload, turn after turn, and records every turn. Loop-only."""

    def __init__(self, url: str, workload: SharedPrefixWorkload, **options: Any) -> None:
        super().__init__(url, **options)
        self.workload = workload
        self._session_of: dict[int, int] = {}  # the record's row of a first turn -> session

    def new_slot(self, rec: GenRecord, intended_s: float) -> int:
        """A row for the next session's first turn."""
        k = len(self._session_of)
        n = self.workload.lengths(k, 0)[0] + self.workload.prefix_len
        row = rec.new_slot(intended_s, n, self.workload.max_tokens(k, 0), session=k, turn=0)
        self._session_of[row] = k
        return row

    def body(self, k: int, turn: int, replies: list[str]) -> bytes:
        """Turn ``turn`` of session ``k`` as the JSON this URL takes."""
        w = self.workload
        request: dict[str, Any] = {"model": self.model or ""}
        if self.chat:
            request["messages"] = w.messages(k, turn, replies)
        else:
            request["prompt"] = w.prompt_text(k, turn, replies)
        request |= {
            "max_tokens": w.max_tokens(k, turn),
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.mix.ignore_eos:
            request["ignore_eos"] = True
        return json.dumps(request).encode()

    async def send(self, rec: GenRecord, k: int) -> None:
        """Session of row ``k``: its turns, each after the last reply and the think time."""
        w = self.workload
        session = self._session_of[k]
        replies: list[str] = []
        row = k
        for turn in range(w.turns):
            if turn:
                intended = rec.end[row] - rec.t0 + w.think_time_s
                await asyncio.sleep(max(rec.t0 + intended - clock_s(), 0.0))
                n = len(w.prompt_text(session, turn, replies))
                out = w.max_tokens(session, turn)
                row = rec.new_slot(intended, n, out, session=session, turn=turn)
            reply = await self._turn(rec, row, self.body(session, turn, replies))
            if reply is None:
                return
            replies.append(reply)

    async def _turn(self, rec: GenRecord, row: int, body: bytes) -> str | None:
        """Stream one turn into row ``row``; the reply's text when it was served."""
        assert self.pool is not None
        data = self.target.request("POST", self.target.path, self.headers, body)
        stream = CompletionStream(rec, row, keep_text=True)
        written_at = await self.pool.send(data, stream, self.timeout_s, idle_timeout=True)
        if rec.turn[row] == 0:  # only a session's arrival is on the run's schedule
            rec.went_out(row, written_at or clock_s())
        if rec.outcome[row] != SERVED or stream.text is None:
            return None
        return "".join(stream.text)
