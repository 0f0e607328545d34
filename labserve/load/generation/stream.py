"""One streamed generation as the load generator reads it: events in, one record out. Loop-only.

A :class:`GenRecord` holds a run's per-request columns; a :class:`CompletionStream` (the
:class:`~labserve.load.http_client.connection.ReplyReader` of one request) parses its reply's
server-sent events as they arrive, keeps the arrival time of each content chunk (a
chunk whose text is not empty: a chat's opening role chunk and the closing
``finish_reason`` chunk carry none), the server's ``usage``, and writes the request's one
outcome into the record when the reply ends, however it ends:

- ``served``: the stream ended with ``data: [DONE]``, or cleanly after a ``finish_reason``;
  or a 2xx JSON reply (a server that does not stream: its first token counts at its end);
- ``failed``: an error event in the stream (the status line had already said 200), an event
  that is not JSON, a stream that ended cleanly without saying it was done;
- the reply's status otherwise (``rejected`` for 503/429, ``client_error`` for a 4xx...),
  or ``reset``, ``timeout``, ``connect_error`` from the connection;
- ``cancelled``: the run was interrupted first (the slot's initial outcome).
"""

from __future__ import annotations

import json
import math
from typing import Any

from labserve.base.vocabulary import CANCELLED, FAILED, SERVED
from labserve.load.generation.sse import SseError, SseParser
from labserve.load.http_client.connection import ReplyReader
from labserve.load.http_client.reply import outcome_of_status
from labserve.load.records import RunRecord

__all__ = ["CompletionStream", "GenRecord"]

_MAX_BODY = 1 << 20  # a non-streamed reply or an error body, at most (the rest is dropped)


class GenRecord(RunRecord):
    """Per-request columns of one generation run, filled on the loop.

    ``arrival`` (and ``lag``) are seconds from ``t0``, as every run's; a stream's chunk and
    end times are on ``clock_s`` itself.
    """

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[list[float]] = []
        """Arrival times (``clock_s``) of each request's content chunks."""
        self.end: list[float] = []
        """When each request ended (``clock_s``); NaN while in flight or given up."""
        self.outcome: list[int] = []
        self.out_tokens: list[int] = []
        self.from_usage: list[bool] = []
        self.prompt_tokens: list[int] = []
        self.asked_input: list[int] = []
        self.asked_output: list[int] = []
        self.session: list[int] = []
        """Each request's session (its own index when the load has no sessions)."""
        self.turn: list[int] = []
        """Each request's turn in its session (0 when the load has no sessions)."""

    def new_slot(
        self,
        intended_s: float,
        asked_input: int,
        asked_output: int,
        *,
        session: int | None = None,
        turn: int = 0,
    ) -> int:
        """Add a request intended at ``intended_s`` (from ``t0``); returns its index."""
        self.session.append(len(self.arrival) if session is None else session)
        self.turn.append(turn)
        self.arrival.append(intended_s)
        self.chunks.append([])
        self.end.append(math.nan)
        self.outcome.append(CANCELLED)
        self.out_tokens.append(0)
        self.from_usage.append(False)
        self.prompt_tokens.append(asked_input)
        self.asked_input.append(asked_input)
        self.asked_output.append(asked_output)
        return len(self.arrival) - 1

    def fail(self, k: int, outcome: int, detail: str, now: float) -> None:
        """Request ``k`` ended as ``outcome`` (not served) at ``now``, for ``detail``."""
        self.outcome[k] = outcome
        self.end[k] = now
        self.note_error(detail[:200])


class CompletionStream(ReplyReader):
    """The handler of request ``k``'s reply: SSE events to its record. Loop-only."""

    __slots__ = (
        "_body",
        "_done",
        "_error",
        "_finished",
        "_sse",
        "_status",
        "_usage",
        "k",
        "rec",
        "text",
    )

    wants_type = True  # a 2xx of text/event-stream is a stream, any other a whole reply

    def __init__(self, rec: GenRecord, k: int, *, keep_text: bool = False) -> None:
        self.rec = rec
        self.k = k
        self.text: list[str] | None = [] if keep_text else None
        """With ``keep_text``, the reply's content pieces (a session resends them)."""
        self._status = 0
        self._sse: SseParser | None = None
        self._body = b""
        self._done = self._finished = False
        self._error = ""
        self._usage: dict[str, Any] | None = None

    def head(self, status: int, content_type: str, now: float) -> None:
        """Note the status; a 200 of ``text/event-stream`` is parsed as events."""
        self._status = status
        if 200 <= status < 300 and content_type == "text/event-stream":
            self._sse = SseParser()

    def body(self, data: bytes, now: float) -> None:
        """Parse the events ``data`` completed (all arrived at ``now``)."""
        if self._sse is None:
            if len(self._body) < _MAX_BODY:
                self._body += data
            return
        if self._error:
            return  # the stream already failed: the rest does not count
        try:
            payloads = self._sse.feed(data)
        except SseError as exc:
            self._error = str(exc)
            return
        for payload in payloads:
            self._event(payload, now)

    def _event(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            self._done = True
            return
        try:
            event = json.loads(payload)
        except ValueError:
            self._error = f"an event that is not JSON: {payload[:80]!r}"
            return
        if not isinstance(event, dict):
            self._error = f"an event that is not a JSON object: {payload[:80]!r}"
            return
        choices = event.get("choices")
        if choices:
            choice = choices[0]
            text = choice.get("text")
            if text is None and (delta := choice.get("delta")):
                text = delta.get("content")
            if text:
                self.rec.chunks[self.k].append(now)
                if self.text is not None:
                    self.text.append(text)
            if choice.get("finish_reason"):
                self._finished = True
        usage = event.get("usage")
        if usage:
            self._usage = usage
        if "error" in event:
            self._error = _message(event) or f"an error event: {payload[:200]!r}"

    def ended(self, outcome: int | None, detail: str, now: float) -> None:
        """Write the request's one outcome (and its tokens) into the record."""
        rec, k = self.rec, self.k
        if outcome is not None:
            rec.fail(k, outcome, detail, now)
            return
        if not 200 <= self._status < 300:
            said = _message(_json(self._body)) or self._body[:200].decode("utf-8", "replace")
            rec.fail(k, outcome_of_status(self._status), f"{self._status}: {said}", now)
            return
        if self._sse is None:
            self._whole(now)
            return
        if self._error:
            rec.fail(k, FAILED, self._error, now)
            return
        if not (self._done or self._finished):
            rec.fail(k, FAILED, "the stream ended without data: [DONE]", now)
            return
        self._served(now)

    def _whole(self, now: float) -> None:
        """A 2xx reply that is not a stream: one JSON body, its tokens all at its end."""
        reply = _json(self._body)
        if not isinstance(reply, dict) or "error" in reply:
            said = _message(reply) or f"a reply that is not a completion: {self._body[:80]!r}"
            self.rec.fail(self.k, FAILED, said, now)
            return
        self._usage = reply.get("usage") or None
        self.rec.chunks[self.k].append(now)
        if self.text is not None:
            self.text.append(_reply_text(reply))
        self._served(now)

    def _served(self, now: float) -> None:
        rec, k = self.rec, self.k
        rec.outcome[k] = SERVED
        rec.end[k] = now
        usage = self._usage
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
            rec.out_tokens[k] = tokens
            rec.from_usage[k] = True
            prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
            if isinstance(prompt, int) and prompt >= 0:
                rec.prompt_tokens[k] = prompt
        else:
            rec.out_tokens[k] = len(rec.chunks[k])


def _json(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def _reply_text(reply: dict[str, Any]) -> str:
    """A whole completion's text (``choices[0].text`` or its message's content), or ''."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    text = choice.get("text")
    if text is None and isinstance(choice.get("message"), dict):
        text = choice["message"].get("content")
    return text if isinstance(text, str) else ""


def _message(reply: Any) -> str:
    """The message of an OpenAI-shaped error body (``{"error": {"message": ...}}``), or ''."""
    if not isinstance(reply, dict):
        return ""
    error = reply.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or "")
    return str(error) if error else ""
