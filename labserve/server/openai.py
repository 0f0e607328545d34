"""OpenAI-compatible routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``.

What generation servers (vLLM, TGI, SGLang, llama.cpp) offer, so that the ``openai``
client and benchmarks work unchanged: a JSON reply with ``usage``, or with
``"stream": true`` server-sent events ending in ``data: [DONE]``. Parameters labserve does
not support get a 400 naming them; errors use OpenAI's body shape (an unknown model is a
404). The routes drive a :class:`Generator` (what a served generative method gives) found
through the server's :class:`~labserve.server.exchange.Backend`. Framework-neutral
handlers over the HTTP core; loop-only.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from labserve.base.errors import InputError, LabServeError, NotFoundError, ServerError
from labserve.generation.api import Finish, GenerateRequest, GenerationStream, Generator
from labserve.server.exchange import Exchange, Reply, Route, Verb, error_reply, json_reply
from labserve.wire.codec import JSON, load_json

__all__ = [
    "IGNORED",
    "NEUTRAL",
    "ROLES",
    "ROUTES",
    "SEED_RANGE",
    "SUPPORTED",
    "chat_prompt",
    "generate_request",
]

SUPPORTED = frozenset(
    {"model", "max_tokens", "max_completion_tokens", "temperature", "seed", "stop"}
    | {"ignore_eos", "stream", "stream_options"}
)
"""Parameters the routes act on (besides ``prompt`` or ``messages``)."""
IGNORED = frozenset({"user", "metadata", "store", "service_tier"})
"""Parameters accepted and ignored: they change nothing a generation returns."""
NEUTRAL = {"n": 1, "best_of": 1, "top_p": 1, "frequency_penalty": 0, "presence_penalty": 0}
"""Parameters accepted only at the value that asks for nothing (the others are a 400)."""
_OFF = (None, False, 0)  # logprobs, top_logprobs, echo: accepted when they ask for nothing
_OFF_PARAMS = frozenset({"logprobs", "top_logprobs", "echo"})
_STOP_MAX = 4
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
"""The chat roles OpenAI's API accepts (``function`` is its deprecated form of ``tool``)."""
SEED_RANGE = (-(2**63), 2**64 - 1)
"""The seeds the routes take: any int64 (vLLM's range) or uint64 (what a hash gives)."""
_STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation"})  # the second: ignored
_ids = itertools.count(1)


def _int(body: Mapping[str, Any], key: str, low: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InputError(f"{key} must be an integer >= {low}, got {value!r}", param=key)
    return value


def _seed(value: Any) -> int | None:
    low, high = SEED_RANGE
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(
            f"seed must be an integer from -2**63 to 2**64-1, got {value!r:.40}", param="seed"
        )
    return value


def _text(value: str, param: str) -> str:
    r"""``value``, if it is text UTF-8 can carry: a lone surrogate (JSON ``"\ud800"``) is not."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InputError(
                f"{param} holds a lone surrogate ({value[exc.start]!r} at character "
                f"{exc.start}), which is not text: send valid Unicode (surrogates only in pairs)",
                sent=repr(value[exc.start]),
                param=param,
            ) from None
    return value


def _refuse_unsupported(body: Mapping[str, Any], own: str) -> None:
    """InputError naming the parameters labserve does not support, or does not know."""
    unknown = sorted(
        k
        for k, v in body.items()
        if k not in SUPPORTED | IGNORED | {own}
        and not (k in NEUTRAL and v in (None, NEUTRAL[k]))
        and not (k in _OFF_PARAMS and v in _OFF)
    )
    if unknown:
        raise InputError(
            f"labserve does not support {', '.join(unknown)} (it supports "
            f"{', '.join(sorted(SUPPORTED | {own}))}; n, best_of, top_p and the penalties "
            "only at their neutral values)",
            sent=unknown,
            param=unknown[0] if len(unknown) == 1 else None,
        )


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, list)
        or len(stops) > _STOP_MAX
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise InputError(
            f"stop must be a string or up to 4 non-empty strings, got {value!r:.80}", param="stop"
        )
    return tuple(_text(s, "stop") for s in stops)


def _stream(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """Whether to stream, and whether to end the stream with usage (OpenAI's rules)."""
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InputError(f'"stream" must be true or false, got {stream!r:.40}', param="stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise InputError(
            '"stream_options" is only allowed when "stream" is true', param="stream_options"
        )
    if not isinstance(options, dict):
        raise InputError(
            f'"stream_options" must be an object, got {options!r:.40}', param="stream_options"
        )
    unknown = sorted(set(options) - _STREAM_OPTIONS)
    if unknown:
        raise InputError(
            f"labserve does not support stream_options {', '.join(map(repr, unknown))} "
            f"(it takes {', '.join(sorted(_STREAM_OPTIONS))})",
            sent=unknown,
            param="stream_options",
        )
    for key in sorted(options):
        if not isinstance(options[key], (bool, type(None))):
            raise InputError(
                f"stream_options.{key} must be true or false, got {options[key]!r:.40}",
                param=f"stream_options.{key}",
            )
    return stream, bool(options.get("include_usage"))


def generate_request(body: Any, *, chat: bool) -> tuple[GenerateRequest, bool, bool]:
    """A request body as a generation, and whether to stream it and include usage in it.

    InputError (400) names what is wrong: a missing or ill-typed field, a parameter labserve
    does not support.
    """
    if not isinstance(body, dict):
        raise InputError("body must be a JSON object")
    own = "messages" if chat else "prompt"
    _refuse_unsupported(body, own)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InputError(
            f'"model" must be the name of a served model, got {model!r:.80}', param="model"
        )
    prompt = chat_prompt(body.get("messages")) if chat else _prompt(body.get("prompt"))
    max_tokens = _int(body, "max_completion_tokens", 1) or _int(body, "max_tokens", 1)
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not 0 <= temperature <= 2
    ):
        raise InputError(
            f"temperature must be a number from 0 to 2, got {temperature!r:.40}",
            param="temperature",
        )
    stream, include_usage = _stream(body)
    ignore_eos = body.get("ignore_eos") or False
    if not isinstance(ignore_eos, bool):
        raise InputError(
            f"ignore_eos must be true or false, got {ignore_eos!r:.40}", param="ignore_eos"
        )
    request = GenerateRequest(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=float(temperature),
        seed=_seed(body.get("seed")),
        stop=_stop(body.get("stop")),
        ignore_eos=ignore_eos,
    )
    return request, stream, include_usage


def _prompt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]  # a batch of one prompt
    if not isinstance(value, str):
        raise InputError(
            f'"prompt" must be a string (or a list of one), got {value!r:.80}', param="prompt"
        )
    return _text(value, "prompt")


def chat_prompt(messages: Any) -> str:
    """The prompt of a chat, by labserve's minimal template (for models without their own).

    One line per message (its role, a colon and a space, its content, a newline), then
    ``"assistant: "``: the model continues as the assistant. A message's role is one of
    :data:`ROLES`; its content is a string or a list of text parts.
    """
    if not isinstance(messages, list) or not messages:
        raise InputError(
            '"messages" must be a non-empty list of {"role", "content"} objects', param="messages"
        )
    lines = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InputError(
                f'messages[{i}] must be an object with "role" and "content"',
                param=f"messages[{i}]",
            )
        role = message.get("role")
        if role not in ROLES:
            raise InputError(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r:.40}",
                sent=role if isinstance(role, str) else None,
                expected=list(ROLES),
                param=f"messages[{i}].role",
            )
        lines.append(f"{role}: {_content(message.get('content'), i)}\n")
    return "".join(lines) + "assistant: "


def _content(content: Any, i: int) -> str:
    param = f"messages[{i}].content"
    if isinstance(content, str):
        return _text(content, param)
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return _text("".join(p["text"] for p in content), param)
    raise InputError(f"{param} must be a string or a list of text parts", param=param)


async def _models(ex: Exchange) -> Reply:
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "labserve"}
        for name in ex.backend.generators()
    ]
    return json_reply({"object": "list", "data": data})


async def _completions(ex: Exchange) -> Reply:
    return await _generate(ex, chat=False)


async def _chat(ex: Exchange) -> Reply:
    return await _generate(ex, chat=True)


async def _generate(ex: Exchange, *, chat: bool) -> Reply:
    request, stream, include_usage = generate_request(load_json(ex.body, "request body"), chat=chat)
    served = ex.backend.generators()
    generator = served.get(request.model)
    if generator is None:
        raise NotFoundError("model", request.model, served=served)
    # Until the reply (a whole one, or a stream's status line) is ready, a client that goes
    # away cancels this: the generation is withdrawn (counted cancelled), not run to its end.
    # Once streaming, the adapter closes the stream instead.
    return await ex.until_gone(_reply(generator, request, chat, stream, include_usage))


async def _reply(
    generator: Generator, request: GenerateRequest, chat: bool, stream: bool, include_usage: bool
) -> Reply:
    reply = _Replies(request.model, chat)
    pieces = generator.start(request)
    # The first piece before the status line: a refusal at admission is an HTTP error.
    it = aiter(pieces)
    try:
        first = await anext(it)
    except StopAsyncIteration:
        first = None
    except BaseException:
        await pieces.aclose()
        raise
    if stream:
        events = _events(reply, pieces, it, first, include_usage)
        return Reply(200, headers=_SSE, stream=events)
    text = [first or ""]
    try:
        text += [piece async for piece in it]
    finally:
        await pieces.aclose()
    return json_reply(reply.whole("".join(text), _finished(pieces)))


_SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _finished(pieces: GenerationStream) -> Finish:
    finish = pieces.finish
    if finish is None:
        raise ServerError("the generation ended without saying how it ended")
    return finish


async def _events(
    reply: _Replies,
    pieces: GenerationStream,
    it: AsyncIterator[str],
    first: str | None,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """The stream's server-sent events, ``data: [DONE]`` last; closes the generation."""
    try:
        if reply.chat:
            yield _event(reply.chunk(None, role=True))
        if first:
            yield _event(reply.chunk(first))
        try:
            async for piece in it:
                if piece:
                    yield _event(reply.chunk(piece))
        except LabServeError as error:  # after the status line: said in the stream
            yield b"data: " + error_reply(error, style="openai").body + b"\n\n"
            return
        finish = _finished(pieces)
        yield _event(reply.chunk(None, finish=finish.reason))
        if include_usage:
            yield _event(reply.usage_chunk(finish))
        yield b"data: [DONE]\n\n"
    finally:
        await pieces.aclose()


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


class _Replies:
    """The reply bodies of one generation, in OpenAI's shapes."""

    def __init__(self, model: str, chat: bool) -> None:
        self.model = model
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{next(_ids)}"

    def _head(self, kind: str) -> dict[str, Any]:
        # created: labserve keeps no wall clock on the request path (OpenAI's is Unix time).
        return {"id": self.id, "object": kind, "created": 0, "model": self.model}

    def whole(self, text: str, finish: Finish) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish.reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
            choice["logprobs"] = None
        else:
            choice |= {"text": text, "logprobs": None}
        kind = "chat.completion" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [choice], "usage": finish.usage}

    def chunk(
        self, text: str | None, *, role: bool = False, finish: str | None = None
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
            kind = "chat.completion.chunk"
        else:
            choice["text"] = text or ""
            kind = "text_completion"
        return {**self._head(kind), "choices": [choice]}

    def usage_chunk(self, finish: Finish) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [], "usage": finish.usage}


def _body(own: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI request body of a generation route: ``model`` and ``own`` required."""
    properties = {
        "model": {"type": "string"},
        own: schema,
        "max_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "seed": {"type": "integer"},
        "stop": {"type": "array", "maxItems": _STOP_MAX, "items": {"type": "string"}},
        "ignore_eos": {"type": "boolean"},
        "stream": {"type": "boolean"},
    }
    body = {"type": "object", "required": ["model", own], "properties": properties}
    return {"requestBody": {"required": True, "content": {JSON: {"schema": body}}}}


_MESSAGES = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "required": ["role", "content"],
        "properties": {"role": {"type": "string"}, "content": {"type": "string"}},
    },
}

ROUTES = (
    Route("/v1/models", {"GET": Verb(_models, "The served generative models (OpenAI's shape)")}),
    Route(
        "/v1/completions",
        {
            "POST": Verb(
                _completions,
                "OpenAI-compatible completion; stream: server-sent events",
                body=(JSON,),
                openapi=_body("prompt", {"type": "string"}),
            )
        },
    ),
    Route(
        "/v1/chat/completions",
        {
            "POST": Verb(
                _chat,
                "OpenAI-compatible chat completion; stream: server-sent events",
                body=(JSON,),
                openapi=_body("messages", _MESSAGES),
            )
        },
    ),
)
"""The OpenAI-compatible routes, in matching order."""
