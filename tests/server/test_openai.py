"""The OpenAI-compatible routes, driven by the official ``openai`` client over real sockets.

The generator behind them here is a stand-in (the continuous-batching engine plugs into
the same protocol): it says its prompt back reversed, one character per token, so every
reply can be checked exactly. ``max_retries=0``: a failure is seen, not retried.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import tornado.httpserver
import tornado.netutil

from labserve.base.errors import InputError
from labserve.generation.api import Finish
from labserve.runtime.loop import background_loop
from labserve.server.app import make_app
from labserve.server.core import HttpCore
from labserve.server.exchange import Backend
from labserve.server.openai import chat_prompt
from labserve.server.state import ServerState

openai = pytest.importorskip("openai")


class Echo:
    """Says the prompt back reversed, a character a token; ``forever`` never stops."""

    def __init__(self, *, forever: bool = False, fail_after: int | None = None) -> None:
        self.forever = forever
        self.fail_after = fail_after
        self.requests = []
        self.closed = 0

    def start(self, request):
        if len(request.prompt) > 200:
            raise InputError(f"the prompt has {len(request.prompt)} tokens, over 200")
        self.requests.append(request)
        return _Stream(self, request)


class _Stream:
    def __init__(self, owner: Echo, request) -> None:
        self.owner = owner
        self.request = request
        self.finish = None
        self._closed = False

    def __aiter__(self):
        return self._pieces()

    async def _pieces(self):
        text = self.request.prompt[::-1]
        limit = self.request.max_tokens
        out = 0
        while self.owner.forever or out < len(text):
            if limit is not None and out == limit:
                self.finish = Finish("length", len(self.request.prompt), out)
                return
            if self.owner.fail_after is not None and out == self.owner.fail_after:
                raise InputError("the stand-in's model failed mid-stream")
            piece = text[out % len(text)]
            if piece in self.request.stop:
                break
            await asyncio.sleep(0.001)
            yield piece
            out += 1
        self.finish = Finish("stop", len(self.request.prompt), out)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self.owner.closed += 1


@pytest.fixture
def serve_generators():
    """``serve_generators({name: generator}, token_everywhere=False)``: a server's base URL."""
    bg = background_loop()
    servers = []

    def start(generators, *, token_everywhere=False):
        state = ServerState(
            runners={}, token="sesame", token_everywhere=token_everywhere, max_body_bytes=65536
        )
        core = HttpCore(state, Backend(state, generators))

        def listen():
            sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
            server = tornado.httpserver.HTTPServer(make_app(state, core))
            server.add_sockets(sockets)
            return server, sockets[0].getsockname()[1]

        server, port = bg.call(listen)
        servers.append(server)
        return f"http://127.0.0.1:{port}/v1"

    yield start

    async def close(server):
        server.stop()
        await server.close_all_connections()

    for server in servers:
        bg.run(close(server), timeout=10)


def client(base_url, api_key="unused"):
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=10)


def test_models_lists_the_served_generators(serve_generators):
    with client(serve_generators({"echo": Echo(), "echo.generate": Echo()})) as c:
        assert sorted(m.id for m in c.models.list()) == ["echo", "echo.generate"]


def test_a_completion_with_usage(serve_generators):
    echo = Echo()
    with client(serve_generators({"echo": echo})) as c:
        reply = c.completions.create(model="echo", prompt="abcd", max_tokens=3, seed=7)
        assert reply.choices[0].text == "dcb" and reply.choices[0].finish_reason == "length"
        assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (4, 3)
        assert reply.usage.total_tokens == 7
        whole = c.completions.create(model="echo", prompt="abcd", temperature=0)
        assert (whole.choices[0].text, whole.choices[0].finish_reason) == ("dcba", "stop")
    asked = echo.requests[0]
    assert (asked.max_tokens, asked.seed, asked.temperature) == (3, 7, 1.0)
    assert echo.requests[1].temperature == 0.0
    assert echo.closed == 2  # every generation closed once its reply was written


def test_a_streamed_completion_ends_with_usage_and_done(serve_generators):
    with client(serve_generators({"echo": Echo()})) as c:
        chunks = list(
            c.completions.create(
                model="echo",
                prompt="hello",
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
        )
    texts = [ch.choices[0].text for ch in chunks if ch.choices]
    assert "".join(texts) == "olleh" and len(texts) >= 5  # a token per event, then the end
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5


@pytest.mark.parametrize("include_usage", [True, False])
def test_vllms_continuous_usage_stats_is_taken_and_usage_comes_once_at_the_end(
    serve_generators, include_usage
):
    # guidellm 0.8.1 sends this option on every streamed request: a 400 failed all of them.
    options = {"include_usage": include_usage, "continuous_usage_stats": True}
    with client(serve_generators({"echo": Echo()})) as c:
        chunks = list(
            c.completions.create(model="echo", prompt="hello", stream=True, stream_options=options)
        )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == "olleh"
    with_usage = [i for i, ch in enumerate(chunks) if ch.usage is not None]
    assert with_usage == ([len(chunks) - 1] if include_usage else [])
    if include_usage:
        assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.prompt_tokens == 5


def test_a_chat_completion_uses_the_documented_template(serve_generators):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    expected = chat_prompt(messages)
    assert expected == "system: be brief\nuser: hi\nassistant: "
    with client(serve_generators({"echo": Echo()})) as c:
        reply = c.chat.completions.create(model="echo", messages=messages)
        assert reply.choices[0].message.role == "assistant"
        assert reply.choices[0].message.content == expected[::-1]
        assert reply.usage.prompt_tokens == len(expected)
        stream = c.chat.completions.create(
            model="echo", messages=messages, max_completion_tokens=4, stream=True
        )
        chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert content == expected[::-1][:4] and chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"extra_body": {"best_of": 3}}, "best_of"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
    ],
)
def test_unsupported_parameters_are_a_400_that_names_them(serve_generators, extra, named):
    echo = Echo()
    with (
        client(serve_generators({"echo": echo})) as c,
        pytest.raises(openai.BadRequestError) as info,
    ):
        c.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "hi"}], **extra
        )
    assert f"does not support {named}" in info.value.message
    assert info.value.body["code"] == "InputError"
    assert echo.requests == []  # refused before any generation


def test_neutral_values_of_unsupported_parameters_are_accepted(serve_generators):
    with client(serve_generators({"echo": Echo()})) as c:
        reply = c.completions.create(
            model="echo", prompt="ab", n=1, top_p=1, presence_penalty=0, user="me"
        )
    assert reply.choices[0].text == "ba"


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (dict(model="nope", prompt="a"), "NotFoundError", "no model 'nope' (served: echo)"),
        (dict(model="echo", prompt="a", temperature=3), "BadRequestError", "temperature"),
        (dict(model="echo", prompt="a", max_tokens=0), "BadRequestError", "max_tokens"),
        (dict(model="echo", prompt="a", stop=["x"] * 5), "BadRequestError", "stop must be"),
        (dict(model="echo", prompt="a" * 201), "BadRequestError", "over 200"),
        (dict(model="echo", prompt="a" * 201, stream=True), "BadRequestError", "over 200"),
    ],
)
def test_errors_have_openais_shape_and_status(serve_generators, call, error, words):
    with (
        client(serve_generators({"echo": Echo()})) as c,
        pytest.raises(getattr(openai, error)) as info,
    ):
        c.completions.create(**call)
    assert words in info.value.message


def test_the_api_key_is_the_servers_token_where_one_is_required(serve_generators):
    url = serve_generators({"echo": Echo()}, token_everywhere=True)
    with client(url, api_key="wrong") as c, pytest.raises(openai.AuthenticationError):
        c.models.list()
    with client(url, api_key="sesame") as c:
        assert [m.id for m in c.models.list()] == ["echo"]


def test_a_failure_mid_stream_reaches_the_client_as_an_error(serve_generators):
    with client(serve_generators({"echo": Echo(fail_after=2)})) as c:
        stream = c.completions.create(model="echo", prompt="abcdef", stream=True)
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            list(stream)


def test_a_client_that_leaves_mid_stream_closes_the_generation(serve_generators):
    echo = Echo(forever=True)
    with client(serve_generators({"echo": echo})) as c:
        stream = c.completions.create(model="echo", prompt="ab", stream=True)
        first = next(iter(stream))
        assert first.choices[0].text == "b"
        stream.close()
    deadline = time.monotonic() + 10
    while echo.closed == 0:
        assert time.monotonic() < deadline, "the endless generation was never closed"
        time.sleep(0.01)
    assert echo.closed == 1


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("call", "param", "words"),
    [
        (dict(prompt="a", temperature=3), "temperature", "temperature must be a number"),
        (dict(prompt="a", max_tokens=0), "max_tokens", "max_tokens must be"),
        (dict(prompt="a", stop=["x"] * 5), "stop", "stop must be"),
        (dict(prompt="a", seed=2**64), "seed", "seed must be an integer from -2**63"),
        (dict(prompt="a", seed=-(2**63) - 1), "seed", "seed must be an integer from -2**63"),
        (dict(prompt=["a", "b"]), "prompt", '"prompt" must be a string'),
        (dict(prompt="a", extra_body={"frobnicate": 1}), "frobnicate", "does not support"),
        (dict(prompt="a", extra_body={"ignore_eos": 1}), "ignore_eos", "ignore_eos must be"),
        (dict(prompt="a", extra_body={"stream": "yes"}), "stream", '"stream" must be'),
    ],
)
def test_an_error_about_one_parameter_names_it_in_param(serve_generators, call, param, words):
    with (
        client(serve_generators({"echo": Echo()})) as c,
        pytest.raises(openai.BadRequestError) as info,
    ):
        c.completions.create(model="echo", **call)
    assert words in info.value.message
    assert info.value.param == param == info.value.body["param"]


def test_seeds_span_int64_and_uint64(serve_generators):
    echo = Echo()
    with client(serve_generators({"echo": echo})) as c:
        for seed in (-(2**63), -1, 0, 2**64 - 1):
            c.completions.create(model="echo", prompt="ab", seed=seed)
    assert [r.seed for r in echo.requests] == [-(2**63), -1, 0, 2**64 - 1]


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant", "tool", "function"])
def test_the_chat_roles_openai_accepts_are_accepted(serve_generators, role):
    with client(serve_generators({"echo": Echo()})) as c:
        reply = c.chat.completions.create(
            model="echo", messages=[{"role": role, "content": "x"}, *HI]
        )
    assert (
        reply.choices[0].message.content == chat_prompt([{"role": role, "content": "x"}, *HI])[::-1]
    )


@pytest.mark.parametrize("role", ["robot", "User", "", None, 3])
def test_an_unknown_chat_role_is_a_400_naming_the_roles(serve_generators, role):
    echo = Echo()
    with (
        client(serve_generators({"echo": echo})) as c,
        pytest.raises(openai.BadRequestError) as info,
    ):
        c.chat.completions.create(model="echo", messages=[*HI, {"role": role, "content": "x"}])
    assert "messages[1].role must be one of system, developer, user, assistant, tool" in (
        info.value.message
    )
    assert info.value.param == "messages[1].role"
    assert echo.requests == []


@pytest.mark.parametrize(
    ("where", "call", "param"),
    [
        ("prompt", dict(prompt="ab\ud800c"), "prompt"),
        ("stop", dict(prompt="ab", stop=["\udfff"]), "stop"),
        (
            "chat",
            dict(messages=[*HI, {"role": "user", "content": "\ud800"}]),
            "messages[1].content",
        ),
        (
            "chat parts",
            dict(messages=[{"role": "user", "content": [{"type": "text", "text": "x\udc00"}]}]),
            "messages[0].content",
        ),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_it(serve_generators, where, call, param):
    # The openai client cannot send one (it encodes UTF-8); JSON's escapes can.
    echo = Echo()
    url = serve_generators({"echo": echo})
    route = "chat/completions" if "messages" in call else "completions"
    body = json.dumps({"model": "echo", **call})
    assert "\\ud800" in body or "\\udfff" in body or "\\udc00" in body
    reply = httpx.post(
        f"{url}/{route}", content=body, headers={"Content-Type": "application/json"}, timeout=10
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert "lone surrogate" in error["message"] and error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert echo.requests == []


@pytest.mark.parametrize(
    ("call", "param", "words"),
    [
        (
            dict(stream_options={"include_usage": True}),
            "stream_options",
            '"stream_options" is only allowed when "stream" is true',
        ),
        (
            dict(stream=False, stream_options={"include_usage": False}),
            "stream_options",
            '"stream_options" is only allowed when "stream" is true',
        ),
        (
            dict(stream=True, stream_options={"include_usage": "yes"}),
            "stream_options.include_usage",
            "stream_options.include_usage must be true or false",
        ),
        (
            dict(stream=True, stream_options={"include_usage": 1}),
            "stream_options.include_usage",
            "stream_options.include_usage must be true or false",
        ),
        (dict(stream=True, stream_options=[]), "stream_options", "must be an object"),
        (
            dict(stream=True, stream_options={"frequency": 2}),
            "stream_options",
            "does not support stream_options 'frequency'",
        ),
    ],
)
def test_stream_options_follow_openais_rules(serve_generators, call, param, words):
    echo = Echo()
    with (
        client(serve_generators({"echo": echo})) as c,
        pytest.raises(openai.BadRequestError) as info,
    ):
        c.completions.create(model="echo", prompt="ab", **call)
    assert words in info.value.message and info.value.param == param
    assert echo.requests == []


def test_a_base_url_without_v1_gets_an_openai_404_saying_to_add_it(serve_generators):
    url = serve_generators({"echo": Echo()}).removesuffix("/v1")
    with client(url) as c:
        for call in (
            lambda: c.completions.create(model="echo", prompt="ab"),
            lambda: c.chat.completions.create(model="echo", messages=HI),
            lambda: c.models.list(),
        ):
            with pytest.raises(openai.NotFoundError) as info:
                call()
            assert f"add /v1 to the base URL ({url}/v1)" in info.value.message
            assert info.value.body["type"] == "not_found_error"


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "GET", "TRACE", "PROPFIND"])
def test_a_method_a_v1_route_does_not_answer_is_an_openai_405(serve_generators, method):
    url = serve_generators({"echo": Echo()})
    reply = httpx.request(method, f"{url}/completions", json={}, timeout=10)
    assert reply.status_code == 405 and reply.headers["Allow"] == "POST, OPTIONS"
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"] == f"Method Not Allowed: {method} /v1/completions"
