r"""Server-sent events, parsed as the bytes come: what a streamed generation is made of.

A generation server (labserve, vLLM, TGI, SGLang, llama.cpp, OpenAI) streams its reply as
``data: <json>`` events separated by a blank line, then ``data: [DONE]``. The load
generator needs each event's payload the moment its last byte arrives, so the parser is
fed whatever a read returned (an event may be split across reads, or several share one)
and hands back the payloads it completed. Only ``data`` fields matter here; comments
(``:``), ``event``, ``id`` and ``retry`` lines are skipped. Line ends may be LF, CRLF or
CR, as the standard allows. Pure and synchronous; one parser per stream, not thread-safe.

>>> p = SseParser()
>>> p.feed(b'data: {"a": 1}\n\ndata: [DO')
[b'{"a": 1}']
>>> p.feed(b"NE]\n\n")
[b'[DONE]']
"""

from __future__ import annotations

__all__ = ["SseParser"]

# An event larger than this is not a token's: the stream is not SSE (or is broken).
MAX_EVENT_BYTES = 4 * 1024 * 1024


class SseError(ValueError):
    """Raised when a stream cannot be SSE: an event past :data:`MAX_EVENT_BYTES`."""


class SseParser:
    """Splits a byte stream into the ``data`` payloads of its events. Not thread-safe."""

    __slots__ = ("_buf", "_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._cr = False  # the stream uses CR or CRLF line ends: normalised on the way in

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return the payloads of the events it completed, in order.

        Raises:
            SseError: the unfinished event outgrew :data:`MAX_EVENT_BYTES`.
        """
        if self._cr or b"\r" in data:
            self._cr = True
            return self._feed_cr(data)
        buf = self._buf + data if self._buf else data
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._keep(buf)
            return []
        self._buf = buf[end + 2 :]
        return [p for block in buf[:end].split(b"\n\n") if (p := _payload(block)) is not None]

    def _feed_cr(self, data: bytes) -> list[bytes]:
        buf = self._buf + data
        # A CR at the very end may be the first half of a CRLF: wait for the next byte.
        held = b"\r" if buf.endswith(b"\r") else b""
        if held:
            buf = buf[:-1]
        buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._keep(buf + held)
            return []
        self._buf = buf[end + 2 :] + held
        return [p for block in buf[:end].split(b"\n\n") if (p := _payload(block)) is not None]

    def _keep(self, buf: bytes) -> None:
        if len(buf) > MAX_EVENT_BYTES:
            raise SseError(f"an event longer than {MAX_EVENT_BYTES} bytes: not a token stream")
        self._buf = buf

    @property
    def pending(self) -> bool:
        """True when an event has begun and not ended (a stream cut here lost it)."""
        return bool(self._buf.strip())


def _payload(block: bytes) -> bytes | None:
    """The ``data`` of one event block (its data lines joined by LF); None if it has none."""
    if block.startswith(b"data:") and b"\n" not in block:  # the usual event: one line
        value = block[5:]
        return value[1:] if value.startswith(b" ") else value
    lines = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
        elif line == b"data":
            lines.append(b"")
    return b"\n".join(lines) if lines else None
