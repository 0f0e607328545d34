"""The generation load generator against real sockets: labserve's /v1 routes and raw SSE servers.

The tornado server here is labserve's own (its real OpenAI-compatible routes) with a
stand-in generator whose tokens are known (the alphabet, one letter a token) and which
notes when it yielded each, on the clock the client uses. A raw asyncio server scripts
what tornado would not do: streams without usage, with CRLF, cut mid-stream, 503s. The
computation of TTFT, ITL, TPOT, e2e and goodput is checked exactly on records with known
times; over sockets only what cannot depend on the machine's speed is asserted.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tornado.httpserver
import tornado.netutil

import labserve
from labserve.base.errors import InputError, LoadTargetError
from labserve.base.vocabulary import OUTCOMES
from labserve.cli import main
from labserve.generation.api import Finish
from labserve.lab.demo import TinyLM
from labserve.load.arrivals import ConstantArrivals, PoissonArrivals
from labserve.load.generation import generation_load_test, start_generation_load
from labserve.load.generation.goodput import parse_goodput
from labserve.load.generation.prompts import GenerationMix
from labserve.load.generation.result import build_result
from labserve.load.generation.server_view import find_model_stats, generation_server_view
from labserve.load.generation.sse import SseParser
from labserve.load.generation.stream import CompletionStream, GenRecord
from labserve.load.http_client import ReplyReader
from labserve.load.http_client.connection import Connection
from labserve.runtime.loop import background_loop
from labserve.server.app import make_app
from labserve.server.core import HttpCore
from labserve.server.exchange import Backend
from labserve.server.state import ServerState

# A busy test machine may delay sends; what the warning says is not under test here.
pytestmark = pytest.mark.filterwarnings("ignore::labserve.LoadWarning")

ALPHABET = "abcdefghijklmnopqrstuvwxyz"


class Letters:
    """Yields ``max_tokens`` letters of the alphabet, 1 ms apart; notes every yield.

    ``fail_on`` and ``hang_on``: prompts of that many bytes fail after two tokens (an
    error the server puts in the stream) or stop yielding after two (a stalled stream).
    """

    def __init__(self, *, fail_on: int = -1, hang_on: int = -1) -> None:
        self.fail_on = fail_on
        self.hang_on = hang_on
        self.requests = []
        self.yields: dict[str, list[float]] = {}  # prompt -> when each token was yielded
        self.finished = 0

    def start(self, request):
        self.requests.append(request)
        return _LetterStream(self, request)


class _LetterStream:
    def __init__(self, owner: Letters, request) -> None:
        self.owner = owner
        self.request = request
        self.finish = None

    def __aiter__(self):
        return self._pieces()

    async def _pieces(self):
        n = self.request.max_tokens or 4
        times = self.owner.yields.setdefault(self.request.prompt, [])
        size = len(self.request.prompt)
        for i in range(n):
            if i == 2 and size == self.owner.fail_on:
                raise InputError("the stand-in failed mid-stream")
            if i == 2 and size == self.owner.hang_on:
                await asyncio.Event().wait()
            await asyncio.sleep(0.001)
            times.append(time.monotonic())
            yield ALPHABET[i % 26]
        self.owner.finished += 1
        self.finish = Finish("length", size, n)

    async def aclose(self) -> None:
        pass


class StatsBackend(Backend):
    """A Backend whose /stats holds a generator entry, as labserve's runtime will."""

    def __init__(self, state, generators, letters: Letters) -> None:
        super().__init__(state, generators)
        self.letters = letters

    async def stats(self):
        entry = {
            "served": self.letters.finished,
            "generation_tokens_total": sum(len(t) for t in self.letters.yields.values()),
            "num_requests_running": 0,
            "percentiles_ms": {"ttft": {"p50": 1.5, "p99": 2.5}, "tpot": {"p50": None}},
            "window_s": 10.0,
            "config": {"max_num_seqs": 8, "policy": "fcfs"},
        }
        return {"tiny": {"generate": entry}}


@pytest.fixture
def serve_letters():
    """``serve_letters(letters, names=..., stats=..., token_everywhere=...)``: its base URL."""
    bg = background_loop()
    servers = []

    def start(letters, *, names=("letters",), stats=False, token_everywhere=False):
        state = ServerState(
            runners={}, token="sesame", token_everywhere=token_everywhere, max_body_bytes=65536
        )
        generators = dict.fromkeys(names, letters)
        backend = StatsBackend(state, generators, letters) if stats else Backend(state, generators)
        core = HttpCore(state, backend)

        def listen():
            sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
            server = tornado.httpserver.HTTPServer(make_app(state, core))
            server.add_sockets(sockets)
            return server, sockets[0].getsockname()[1]

        server, port = bg.call(listen)
        servers.append(server)
        return f"http://127.0.0.1:{port}"

    yield start

    async def close(server):
        server.stop()
        await server.close_all_connections()

    for server in servers:
        bg.run(close(server), timeout=10)


class RawSse:
    """An HTTP/1.1 server that answers each POST with the next reply of a script (cycled).

    GETs (``/v1/models``, ``/stats``) get ``models`` listing one model ``raw`` and a 404.
    Kinds: ``stream`` (five tokens as SSE, no usage), ``crlf`` (the same with CRLF line
    ends and a comment), ``usage`` (usage says 9 tokens in three chunks), ``cut`` (two
    tokens, then the connection closes), ``nodone`` (tokens, then a clean end without
    [DONE] or a finish_reason), ``json`` (not streamed: one JSON body with usage),
    ``textless`` (two chunks of empty text, usage 2 tokens), ``503``.
    """

    def __init__(self, script) -> None:
        self.script = list(script)
        self.posts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._writers = []

    def __enter__(self):
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        )
        self._server = fut.result(5)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc):
        async def shut():
            self._server.close()
            for w in self._writers:
                w.transport.abort()
            await asyncio.sleep(0)

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    async def _handle(self, reader, writer):
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                if head.startswith(b"GET /v1/models"):
                    _reply(writer, 200, b'{"object": "list", "data": [{"id": "raw"}]}')
                    continue
                if head.startswith(b"GET "):
                    _reply(writer, 404, b"{}")
                    continue
                kind = self.script[self.posts % len(self.script)]
                self.posts += 1
                if not await self._act(kind, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def _act(self, kind, writer) -> bool:
        if kind == "503":
            _reply(writer, 503, b'{"error": {"message": "busy"}}')
            return True
        if kind == "json":
            body = {"choices": [{"text": "abc"}], "usage": {"completion_tokens": 3}}
            _reply(writer, 200, json.dumps(body).encode())
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        pieces = {
            "stream": [_event(c) for c in "abcde"] + [b"data: [DONE]\n\n"],
            "crlf": [b": a comment\r\n\r\n"]
            + [_event(c).replace(b"\n", b"\r\n") for c in "abcde"]
            + [b"data: [DONE]\r\n\r\n"],
            "usage": [
                _event("abc"),
                _event("def"),
                _event("ghi"),
                b'data: {"choices": [], "usage": {"completion_tokens": 9}}\n\n',
                b"data: [DONE]\n\n",
            ],
            "cut": [_event("a"), _event("b")],
            "nodone": [_event("a"), _event("b")],
            "textless": [  # tokens that decode to no text (say, half a UTF-8 character)
                _event(""),
                _event(""),
                b'data: {"choices": [], "usage": {"completion_tokens": 2}}\n\n',
                b"data: [DONE]\n\n",
            ],
        }[kind]
        for piece in pieces:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.001)
        if kind == "cut":
            writer.close()
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


def _event(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"text": text}]}).encode() + b"\n\n"


def _reply(writer, status: int, body: bytes) -> None:
    writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body))


@pytest.fixture
def raw_sse():
    started = []

    def make(script):
        server = RawSse(script).__enter__()
        started.append(server)
        return server

    yield make
    for server in started:
        server.__exit__()


def kinds(result) -> dict[str, int]:
    return result.summary()["outcomes"]


# -- over real sockets: labserve's routes ------------------------------------------------


def test_a_closed_loop_counts_every_token_from_usage(serve_letters):
    letters = Letters()
    url = serve_letters(letters) + "/v1/completions"
    r = generation_load_test(url, duration_s=0.4, concurrency=3, input_len=7, output_len=5)
    n = len(r)
    assert n == len(letters.requests) >= 3
    assert kinds(r) == {"served": n}
    assert r.generation.num_output.tolist() == [5] * n
    assert r.tokens_from_usage.all() and r.generation.prompt_len.tolist() == [7] * n
    assert np.diff(r.generation.itl_offsets).tolist() == [4] * n  # a gap between 5 chunks
    sent = letters.requests[0]
    assert (sent.model, sent.max_tokens, sent.ignore_eos, sent.temperature) == (
        "letters",
        5,
        True,
        0.0,
    )
    assert {len(q.prompt) for q in letters.requests} == {7}
    assert len({q.prompt for q in letters.requests}) == n  # no two prompts alike
    s = r.summary()
    assert s["output_tokens"] == 5 * n and s["input_tokens"] == 7 * n


def test_each_token_is_seen_after_the_server_yielded_it(serve_letters):
    letters = Letters()
    url = serve_letters(letters) + "/v1/completions"
    r = generation_load_test(url, duration_s=0.3, concurrency=1, output_len=4)
    g = r.generation
    # One client: requests in order; its prompts name them on the server's side.
    prompts = [q.prompt for q in letters.requests]
    for i, prompt in enumerate(prompts):
        yielded = np.asarray(letters.yields[prompt]) - r.clock_t0_s
        seen = g.first_token_s[i] + np.concatenate(
            [[0.0], np.cumsum(g.itl_s[g.itl_offsets[i] : g.itl_offsets[i + 1]])]
        )
        assert (seen >= yielded - 1e-9).all()
        assert g.end_s[i] >= seen[-1] and g.first_token_s[i] >= g.arrival_s[i]
    # TTFT, TPOT and e2e follow from the same arrays, by their definitions.
    assert np.allclose(r.generation.ttft_s, g.first_token_s - g.arrival_s)
    assert np.allclose(r.generation.tpot_s, (g.end_s - g.first_token_s) / 3)


def test_an_open_loop_sends_at_the_intended_times(serve_letters):
    url = serve_letters(Letters()) + "/v1/completions"
    arrivals = PoissonArrivals(40.0)
    r = generation_load_test(url, duration_s=0.5, arrivals=arrivals, output_len=3, seed=4)
    assert np.array_equal(r.generation.arrival_s, arrivals.times(0.5, seed=4))
    assert r.send_lag_s is not None and len(r.send_lag_s) == len(r)
    assert kinds(r) == {"served": len(r)}


def test_a_chat_counts_content_not_the_role_chunk(serve_letters):
    letters = Letters()
    url = serve_letters(letters) + "/v1/chat/completions"
    r = generation_load_test(url, duration_s=0.3, concurrency=2, input_len=5, output_len=4)
    assert kinds(r) == {"served": len(r)}
    assert np.diff(r.generation.itl_offsets).tolist() == [3] * len(r)  # 4 content chunks
    # labserve's template wraps the 5 bytes: the server's usage says how many tokens.
    assert r.generation.prompt_len.tolist() == [len("user: xxxxx\nassistant: ")] * len(r)


def test_lengths_follow_the_distributions_drawn(serve_letters):
    letters = Letters()
    url = serve_letters(letters) + "/v1/completions"
    r = generation_load_test(
        url, duration_s=0.4, concurrency=2, input_len="uniform:1:40", output_len="list:1,2,3"
    )
    asked = [(len(q.prompt), q.max_tokens) for q in letters.requests]
    assert sorted(asked) == sorted(
        zip(r.asked_input.tolist(), r.asked_output.tolist(), strict=True)
    )
    assert r.generation.num_output.tolist() == r.asked_output.tolist()
    one = r.generation.num_output == 1
    assert np.diff(r.generation.itl_offsets)[one].tolist() == [0] * int(one.sum())


def test_failures_each_get_one_outcome_with_what_the_server_said(serve_letters):
    letters = Letters(fail_on=3, hang_on=4)
    base = serve_letters(letters)
    r = generation_load_test(
        base + "/v1/completions",
        duration_s=0.3,
        arrivals=ConstantArrivals(30.0),
        input_len="trace:2,3,4",
        output_len=5,
        timeout_s=0.5,
    )
    n = len(r)
    assert n == len(letters.requests) == 9
    assert kinds(r) == {"served": 3, "failed": 3, "timeout": 3}
    assert r.errors == {"the stand-in failed mid-stream": 3, "no byte for 0.5 s": 3}
    failed = r.outcome == OUTCOMES.index("failed")
    assert r.generation.num_output[failed].tolist() == [0, 0, 0]  # not served: no tokens
    refused = generation_load_test(
        base + "/v1/completions", duration_s=0.2, concurrency=1, model="nope", output_len=2
    )
    assert set(kinds(refused)) == {"client_error"}
    assert list(refused.errors) == ["404: no model 'nope' (served: letters)"]


def test_a_stream_cut_or_refused_is_one_outcome_each(raw_sse):
    server = raw_sse(["stream", "cut", "503", "nodone", "crlf", "json", "usage"])
    r = generation_load_test(
        server.url + "/v1/completions", duration_s=0.3, arrivals=ConstantArrivals(23.3)
    )
    assert len(r) == server.posts == 7
    assert [OUTCOMES[o] for o in r.outcome] == [
        "served",
        "reset",
        "rejected",
        "failed",
        "served",
        "served",
        "served",
    ]
    g = r.generation
    # No usage: the chunks are the tokens; a JSON reply's tokens come from its usage.
    assert g.num_output.tolist() == [5, 0, 0, 0, 5, 3, 9]
    assert r.tokens_from_usage.tolist() == [False, False, False, False, False, True, True]
    assert g.first_token_s[5] == g.end_s[5]  # not streamed: its first token at its end
    assert np.diff(g.itl_offsets)[6] == 2  # three chunks carried the nine tokens
    assert "busy" in " ".join(r.errors) and "mid-stream" in " ".join(r.errors)
    assert "without data: [DONE]" in " ".join(r.errors)


def test_the_servers_view_shows_what_its_stats_hold(serve_letters):
    letters = Letters()
    base = serve_letters(letters, names=("tiny.generate",), stats=True)
    r = generation_load_test(base + "/v1/completions", duration_s=0.3, concurrency=2)
    view = r.server
    assert view is not None and view["model"] == "tiny.generate"
    assert view["over_run"]["served"] == len(r)
    assert view["over_run"]["generation_tokens_total"] == 128 * len(r)
    assert view["at_end"]["percentiles_ms.ttft.p50"] == 1.5
    assert view["at_end"]["config.policy"] == "fcfs"
    text = r.table()
    assert "its /stats for tiny.generate" in text and "its last 10 s" in text
    server_part = text[text.index("its /stats for") :]
    (ttft,) = [line.split() for line in server_part.splitlines() if line.startswith("  TTFT")]
    assert ttft[2] == "1.50" and ttft[-1] == "2.50"  # p50 and p99 there, beside here's
    assert "config: max_num_seqs 8, policy fcfs" in text


def test_against_labserve_serving_tinylm_the_server_counts_what_the_client_saw():
    runner = labserve.Runner(TinyLM, name="tinylm", max_num_seqs=4)
    server = labserve.serve(runner, port=0)
    try:
        r = generation_load_test(
            f"{server.url}/v1/completions",
            duration_s=0.3,
            concurrency=3,
            input_len="uniform:4:40",
            output_len="uniform:1:16",
        )
    finally:
        server.stop()
        runner.stop()
    assert kinds(r) == {"served": len(r)} and r.tokens_from_usage.all()
    assert r.generation.num_output.tolist() == r.asked_output.tolist()  # ignore_eos held
    assert r.generation.prompt_len.tolist() == r.asked_input.tolist()  # a byte is a token
    grown = r.server["over_run"]
    assert grown["outcomes.served"] == len(r)
    assert grown["output_tokens"] == r.summary()["output_tokens"]
    assert grown["prompt_tokens"] == r.summary()["input_tokens"]


def test_another_server_has_no_view_and_says_so(raw_sse):
    r = generation_load_test(
        raw_sse(["stream"]).url + "/v1/completions", duration_s=0.1, concurrency=1
    )
    assert r.server is None and "not seen" in r.table()


def test_the_model_comes_from_v1_models_or_must_be_named(serve_letters):
    base = serve_letters(Letters(), names=("a", "b"))
    with pytest.raises(LoadTargetError, match=r"say which model .* lists a, b"):
        generation_load_test(base + "/v1/completions", duration_s=0.1, concurrency=1)
    r = generation_load_test(base + "/v1/completions", duration_s=0.1, concurrency=1, model="b")
    assert kinds(r) == {"served": len(r)}


def test_stop_ends_the_sending_and_every_stream_still_ends(serve_letters):
    letters = Letters()
    url = serve_letters(letters) + "/v1/completions"
    run = start_generation_load(url, duration_s=30, concurrency=2, output_len=3)
    while run.sent < 4:
        time.sleep(0.01)
    run.stop()
    r = run.result(timeout=10)
    assert len(r) == len(letters.requests) and kinds(r) == {"served": len(r)}
    # One run type for both kinds; like a request run, it spans the time until stop().
    assert isinstance(run, labserve.LoadRun) and r.duration_s < 30


def test_load_test_drives_a_generation_url(serve_letters):
    url = serve_letters(Letters()) + "/v1/completions"
    r = labserve.load_test(url, duration_s=0.2, concurrency=1, output_len=2, goodput="ttft:1e6")
    assert isinstance(r, labserve.GenerationLoadResult) and r.summary()["good"] == len(r)
    with pytest.raises(TypeError, match="start_generation_load"):
        labserve.start_load(url, duration_s=1, concurrency=1)
    with pytest.raises(TypeError, match="for request loads"):
        labserve.load_test(url, duration_s=1, concurrency=1, example=[1.0])
    with pytest.raises(TypeError, match="for a /v1"):
        labserve.load_test(
            "http://127.0.0.1:1/runners/m/p", duration_s=1, concurrency=1, output_len=3
        )


# -- the numbers, on known times ---------------------------------------------------------


def _record(streams):
    """A record of requests given as (intended_s, [chunk times], end_s, usage tokens or None)."""
    rec = GenRecord()
    rec.t0 = 100.0
    for intended, chunks, end, usage in streams:
        k = rec.new_slot(intended, 4, len(chunks))
        handler = CompletionStream(rec, k)
        handler.head(200, "text/event-stream", 0.0)
        for t in chunks:
            handler.body(_event("x"), 100.0 + t)
        if usage is not None:
            tail = json.dumps({"choices": [], "usage": {"completion_tokens": usage}})
            handler.body(b"data: " + tail.encode() + b"\n\n", 100.0 + end)
        handler.body(b"data: [DONE]\n\n", 100.0 + end)
        handler.ended(None, "", 100.0 + end)
    return rec


def test_ttft_itl_tpot_and_e2e_follow_their_definitions():
    rec = _record(
        [
            (0.0, [0.1, 0.2, 0.4], 0.5, None),  # TTFT 100 ms, ITL 100 and 200, TPOT 200, e2e 500
            (1.0, [1.3], 1.3, None),  # one token: TTFT 300, no ITL or TPOT, e2e 300
            (2.0, [2.05, 2.1], 2.2, 5),  # usage says 5: TPOT (150 ms) / 4
        ]
    )
    r = build_result(rec, 3.0)
    assert r.percentiles_ms("ttft")["p50"] == pytest.approx(100.0)
    assert np.allclose(np.sort(r.generation.ttft_s), [0.05, 0.1, 0.3])
    assert np.allclose(r.generation.served_itl_s, [0.1, 0.2, 0.05])
    assert np.allclose(r.generation.tpot_s, [0.2, 0.0375])
    assert np.allclose(r.generation.e2e_s, [0.5, 0.3, 0.2])
    itl = r.percentiles_ms("itl")
    assert itl["p50"] == pytest.approx(100.0) and itl["mean"] == pytest.approx(350 / 3)
    assert itl["p90"] == pytest.approx(np.percentile([50, 100, 200], 90))
    assert r.generation.num_output.tolist() == [3, 1, 5]
    assert r.tokens_from_usage.tolist() == [False, False, True]
    s = r.summary()
    assert s["output_tokens"] == 9 and s["span_s"] == pytest.approx(2.2)
    assert s["output_tokens_per_s"] == pytest.approx(9 / 2.2)


@pytest.mark.parametrize(
    ("targets", "good"),
    [
        ({}, 3),
        ({"ttft": 100}, 2),  # the 300 ms TTFT misses
        ({"tpot": 100}, 2),  # the 200 ms TPOT misses; one token has TPOT 0 and meets it
        ({"e2el": 300}, 2),
        ({"ttft": 100, "tpot": 100}, 1),
        ({"ttft": 10}, 0),
    ],
)
def test_goodput_counts_requests_meeting_every_target(targets, good):
    rec = _record(
        [(0.0, [0.1, 0.2, 0.4], 0.5, None), (1.0, [1.3], 1.3, None), (2.0, [2.05, 2.1], 2.2, 5)]
    )
    r = build_result(rec, 3.0, goodput_ms=targets)
    assert r.summary()["good"] == good
    assert r.goodput_rps() == pytest.approx(good / 2.2)


def test_a_request_that_failed_is_not_good_and_has_no_latencies():
    rec = _record([(0.0, [0.1, 0.2], 0.3, None)])
    k = rec.new_slot(0.5, 4, 3)
    handler = CompletionStream(rec, k)
    handler.head(200, "text/event-stream", 0.0)
    handler.body(_event("x"), 100.6)
    handler.body(b'data: {"error": {"message": "boom"}}\n\n', 100.7)
    handler.ended(None, "", 100.7)
    r = build_result(rec, 1.0, goodput_ms={"ttft": 1e6})
    assert [OUTCOMES[o] for o in r.outcome] == ["served", "failed"]
    assert r.summary()["good"] == 1 and len(r.generation.ttft_s) == 1
    assert r.errors == {"boom": 1}


# -- the pieces ---------------------------------------------------------------------------


def test_sse_events_split_anywhere_come_out_whole():
    stream = (
        b'data: {"a": 1}\n\n: keep-alive\n\ndata: two\ndata: lines\n\n'
        b"event: x\r\ndata: crlf\r\n\r\ndata:nospace\n\ndata: [DONE]\n\n"
    )
    expected = [b'{"a": 1}', b"two\nlines", b"crlf", b"nospace", b"[DONE]"]
    for cut in range(1, len(stream)):
        p = SseParser()
        assert p.feed(stream[:cut]) + p.feed(stream[cut:]) == expected, cut
    p = SseParser()
    assert [e for i in range(len(stream)) for e in p.feed(stream[i : i + 1])] == expected


def test_prompts_have_the_drawn_length_and_differ():
    mix = GenerationMix("m", "uniform:1:3000", 7, seed=1)
    bodies = [json.loads(mix.body(k)[0]) for k in range(20)]
    assert [len(b["prompt"]) for b in bodies] == [mix.lengths(k)[0] for k in range(20)]
    assert len({b["prompt"] for b in bodies}) == 20
    assert all(set(b["prompt"]) <= set(ALPHABET + " ") for b in bodies)
    assert bodies[0]["stream_options"] == {"include_usage": True}
    again = GenerationMix("m", "uniform:1:3000", 7, seed=1)
    assert json.loads(again.body(0)[0]) == bodies[0]  # a seed fixes the prompts
    plain = GenerationMix("m", 4, 7, chat=True, ignore_eos=False)
    body = json.loads(plain.body(0)[0])
    assert "ignore_eos" not in body and body["messages"][0]["role"] == "user"


def test_goodput_targets_parse_as_vllm_takes_them():
    assert parse_goodput("ttft:300 tpot:30") == {"ttft": 300.0, "tpot": 30.0}
    assert parse_goodput(["e2el:1000"]) == {"e2el": 1000.0}
    assert parse_goodput({"ttft": 5}) == {"ttft": 5.0}
    for bad in ("ttft", "ttfb:3", "ttft:-1", "ttft:x", "ttft:1 ttft:2"):
        with pytest.raises(ValueError, match="goodput"):
            parse_goodput(bad)


def test_the_stats_entry_is_found_by_model_name():
    stats = {"tiny": {"generate": {"served": 1}}, "two": {"a": {}, "b": {}}, "flat": {"x": 2}}
    assert find_model_stats(stats, "tiny.generate") == {"served": 1}
    assert find_model_stats(stats, "tiny") == {"served": 1}  # the runner's only entry
    assert find_model_stats(stats, "flat") == {"x": 2}
    assert find_model_stats(stats, "two") is None  # which of two?
    assert find_model_stats(stats, "nope") is None and find_model_stats([], "x") is None
    view = generation_server_view(
        {"served": 3, "kv_cache_usage_perc": 0.5}, {"served": 5, "kv_cache_usage_perc": 0.2}, "m"
    )
    assert view == {"model": "m", "over_run": {"served": 2}, "at_end": {"kv_cache_usage_perc": 0.2}}


# -- the command line --------------------------------------------------------------------


def test_a_stream_without_text_leaves_the_others_ttft_and_tpot(raw_sse, capsys):
    # A served stream whose chunks all carried empty text has no first token to time: it is
    # left out of TTFT and TPOT (and said so), instead of making them NaN for the whole run.
    url = raw_sse(["stream", "textless", "stream"]).url + "/v1/completions"
    argv = ["load", url, "--rate", "20", "--duration", "0.15", "--loop", "asyncio"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower(), out
    said = re.search(
        r"TTFT and TPOT over (\d+) of (\d+) served: (\d+) stream\(s\) carried no text", out
    )
    assert said, out
    timed, served, textless = map(int, said.groups())
    assert served == timed + textless and textless >= 1 and timed >= 1
    url = raw_sse(["stream", "textless", "stream"]).url + "/v1/completions"
    r = generation_load_test(url, duration_s=0.15, arrivals=ConstantArrivals(20))
    assert kinds(r) == {"served": 3} and r.textless == 1
    assert r.generation.num_output.tolist() == [5, 2, 5]
    for metric in ("ttft", "tpot", "itl", "e2e"):
        figures = r.percentiles_ms(metric)
        assert all(math.isfinite(v) for v in figures.values()), (metric, figures)
    assert len(r.generation.e2e_s) == 3  # its end-to-end time still counts


def test_the_cli_prints_latencies_and_goodput(serve_letters, capsys):
    url = serve_letters(Letters()) + "/v1/completions"
    argv = ["load", url, "--rate", "20", "--duration", "0.3", "--output-len", "3"]
    assert main([*argv, "--goodput", "ttft:100000", "tpot:100000", "--loop", "asyncio"]) == 0
    out = capsys.readouterr().out
    for word in ("TTFT", "ITL", "TPOT", "E2E", "goodput", "output tokens/s", "served"):
        assert word in out
    assert "met ttft <= 100000 ms, tpot <= 100000 ms" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--goodput", "ttft"], "--goodput takes KEY:MS"),
        (["--goodput", "speed:3"], "--goodput takes KEY:MS"),
        (["--output-len", "lognormal:x"], "--output-len 'lognormal:x' is not a length spec"),
        (["--input-len", "0"], "--input-len '0' is not a length spec"),
        (["--burst", "1:2"], "--burst takes RPS:EVERY_S:LENGTH_S"),
        (["--burst", "10:1:2"], "length_s must be < every_s"),
        (["--concurrency", "2", "--burst", "10:5:1"], "--burst is an open loop"),
        (["--width", "4"], "--width and --binary are for request loads"),
        (["--rate", "0"], "--rate must be > 0"),
    ],
)
def test_bad_flags_exit_2_with_a_message(flags, message, capsys):
    url = "http://127.0.0.1:9/v1/completions"
    with pytest.raises(SystemExit) as info:
        main(["load", url, "--duration", "0.1", *flags])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_nothing_listening_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["load", "http://127.0.0.1:9/v1/completions", "--duration", "0.1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "the server is not reachable at http://127.0.0.1:9 (cannot connect" in err, err


def test_a_run_without_requests_has_no_latencies():
    r = build_result(GenRecord(), 1.0)
    assert len(r) == 0 and math.isnan(r.percentiles_ms("ttft")["p50"])
    assert r.summary()["served_rps"] == 0.0 and "0 sent" in r.table()


INTERRUPTED = """
import _thread, json, signal, threading, time, warnings
import labserve
from labserve.lab.demo import TinyLM

# Ctrl-C as a kernel has it, even when the suite runs as a background job (SIGINT ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)

warnings.simplefilter("ignore", labserve.LoadWarning)
runner = labserve.Runner(TinyLM, name="tinylm")
server = labserve.serve(runner, port=0)
run = labserve.start_generation_load(
    f"{server.url}/v1/completions", duration_s=60, concurrency=4, output_len=200
)

def interrupt_when_busy():
    while run.sent < 8:
        time.sleep(0.005)
    _thread.interrupt_main()

threading.Thread(target=interrupt_when_busy, daemon=True).start()
try:
    run.result()
    out = {"interrupted": False}
except labserve.LoadInterrupted as exc:
    sent = exc.sent
    time.sleep(0.5)  # a load still running would send more meanwhile
    r = exc.result
    out = {
        "interrupted": True,
        "sent": sent,
        "sent_later": run.sent,
        "recorded": len(r),
        "outcomes": sorted(r.summary()["outcomes"]),
    }
server.stop()
runner.stop()
print(json.dumps(out))
"""


def test_an_interrupt_stops_the_load_and_gives_up_the_streams_in_flight():
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPTED], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "never retrieved" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["interrupted"] and out["sent"] == out["sent_later"] == out["recorded"]
    assert "cancelled" in out["outcomes"] and set(out["outcomes"]) <= {"served", "cancelled"}


def test_the_cli_sends_bursts(serve_letters, capsys):
    letters = Letters()
    url = serve_letters(letters) + "/v1/completions"
    argv = ["load", url, "--rate", "5", "--burst", "100:0.3:0.1", "--duration", "0.6"]
    assert main([*argv, "--output-len", "2", "--loop", "asyncio"]) == 0
    out = capsys.readouterr().out
    assert "burst 5 req/s, 100 req/s for 0.1 s every 0.3 s" in out
    assert len(letters.requests) > 6  # the two bursts' 20 or so, with the calm between


class _Transport:
    def __init__(self):
        self.written = b""
        self.aborted = False

    def write(self, data):
        self.written += data

    def abort(self):
        self.aborted = True

    def is_closing(self):
        return self.aborted


class _Collected(ReplyReader):
    def __init__(self):
        self.status, self.data, self.ends = 0, b"", []

    def head(self, status, content_type, now):
        self.status = status

    def body(self, data, now):
        self.data += data

    def ended(self, outcome, detail, now):
        self.ends.append(outcome)


@pytest.mark.parametrize(
    ("reply", "body"),
    [
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: 1\r\n\r\n",
            b"hello world",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello"),
    ],
)
def test_a_reply_split_anywhere_reads_whole(reply, body):
    async def read(pieces):
        conn = Connection()
        conn.connection_made(_Transport())
        handler = _Collected()
        done = conn.send(b"GET / HTTP/1.1\r\n\r\n", handler)
        for piece in pieces:
            conn.data_received(piece)
        await done
        return handler, conn

    for cut in range(1, len(reply)):
        handler, conn = asyncio.run(read([reply[:cut], reply[cut:]]))
        assert (handler.status, handler.data, handler.ends) == (200, body, [None]), cut
        assert conn.reusable
    handler, _ = asyncio.run(read([reply[i : i + 1] for i in range(len(reply))]))
    assert handler.data == body and handler.ends == [None]


def test_requests_past_the_connections_wait_and_the_run_says_so(serve_letters):
    letters = Letters()
    url = serve_letters(letters) + "/v1/completions"
    with pytest.warns(labserve.LoadWarning, match="found all 1 connections streaming"):
        r = generation_load_test(
            url, duration_s=0.1, arrivals=ConstantArrivals(50.0), output_len=40, connections=1
        )
    assert kinds(r) == {"served": 5}
    # Each stream takes 40 tokens 1 ms apart at least: the fifth (due at 80 ms) went out
    # after four of them, at 160 ms or later.
    assert r.send_lag_s.max() >= 4 * 0.040 - 4 / 50.0


def test_the_token_goes_with_every_request(serve_letters):
    base = serve_letters(Letters(), token_everywhere=True)
    with pytest.raises(LoadTargetError, match="unauthorized: give the server's token"):
        generation_load_test(base + "/v1/completions", duration_s=0.1, concurrency=1)
    r = generation_load_test(
        base + "/v1/completions", duration_s=0.1, concurrency=1, token="sesame", output_len=2
    )
    assert kinds(r) == {"served": len(r)}
