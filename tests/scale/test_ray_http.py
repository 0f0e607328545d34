"""The Ray adapter: events ready together go as one chunk, and the path it routes.

No cluster: the adapter's chunk generator is driven as Starlette drives it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from starlette.requests import Request

from labserve.ray.http import Routes, _response
from labserve.server.exchange import Head, Reply


class Events:
    """An SSE-like stream: ``burst`` events at once, then one per loop turn; records closing."""

    def __init__(self, n: int, burst: int, fail: bool = False) -> None:
        self.n, self.burst, self.fail = n, burst, fail
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[bytes]:
        try:
            for i in range(self.n):
                if i >= self.burst:
                    await asyncio.sleep(0)
                yield f"data: {i}\n\n".encode()
            if self.fail:
                raise RuntimeError("the model failed mid-stream")
        finally:
            self.closed = True

    async def aclose(self) -> None:
        self.closed = True


def chunks_of(reply: Reply, take: int | None = None, interval_s: float = 0.0) -> list[bytes]:
    async def main() -> list[bytes]:
        response = _response(reply, interval_s)
        got: list[bytes] = []
        iterator = response.body_iterator
        async for chunk in iterator:
            got.append(bytes(chunk))
            if take is not None and len(got) == take:
                await iterator.aclose()  # type: ignore[attr-defined]
                break
        return got

    return asyncio.run(main())


def test_events_ready_together_go_as_one_chunk_and_the_bytes_are_the_same():
    events = Events(6, burst=4)
    got = chunks_of(Reply(200, b"head\n", {}, events))
    expected = b"head\n" + b"".join(f"data: {i}\n\n".encode() for i in range(6))
    assert b"".join(got) == expected
    assert len(got) < 1 + 6  # some events shared a chunk
    assert events.closed


def test_a_stream_error_still_ends_the_reply_with_it():
    events = Events(3, burst=0, fail=True)
    with pytest.raises(RuntimeError, match="mid-stream"):
        chunks_of(Reply(200, b"", {}, events))


def test_with_an_interval_the_first_event_goes_at_once_and_the_rest_together(monkeypatch):
    # No clock: the adapter's wait is recorded, and lets the stream run a few loop turns.
    real_sleep = asyncio.sleep
    waits: list[float] = []

    async def sleep(delay: float) -> None:
        if delay > 0:
            waits.append(delay)
            for _ in range(20):
                await real_sleep(0)
        else:
            await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    got = chunks_of(Reply(200, b"", {}, Events(6, burst=0)), interval_s=3600.0)
    assert got[0] == b"data: 0\n\n"  # at once: the time to the first token is not delayed
    assert got[1] == b"".join(f"data: {i}\n\n".encode() for i in range(1, 6))
    assert len(waits) == 1 and 3500 < waits[0] <= 3600


def test_a_client_that_goes_away_closes_the_stream():
    events = Events(1000, burst=0)
    got = chunks_of(Reply(200, b"", {}, events), take=2)
    assert len(got) == 2 and events.closed


class Seen(Exception):
    """Raised by :class:`PathCore` with the head the adapter built."""


class PathCore:
    """A stand-in HTTP core that only records the path it is asked to route."""

    def begin(self, head: Head):
        raise Seen(head.path)


@pytest.mark.parametrize(
    ("mount", "root", "path", "routed"),
    [
        ("", "", "/v1/models", "/v1/models"),  # an application at "/"
        ("", "/lm", "/lm/healthz", "/healthz"),  # Serve passes the whole path
        ("", "/lm", "/lm", "/"),
        ("/v1", "/v1", "/v1/completions", "/v1/completions"),  # the ingress at /v1
        ("/v1", "/lm/v1", "/lm/v1/chat/completions", "/v1/chat/completions"),
    ],
)
def test_the_routes_read_the_path_after_the_route_prefix(mount, root, path, routed):
    scope = {"type": "http", "method": "GET", "path": path, "root_path": root, "headers": []}
    with pytest.raises(Seen) as seen:
        asyncio.run(Routes(PathCore(), mount=mount)(Request(scope)))  # type: ignore[arg-type]
    assert seen.value.args == (routed,)
