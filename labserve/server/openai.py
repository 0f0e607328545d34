"""OpenAI-compatible routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``.

What generation servers (vLLM, TGI, SGLang, llama.cpp) offer, so that the ``openai``
client and benchmarks work unchanged: a JSON reply with ``usage``, or with
``"stream": true`` server-sent events ending in ``data: [DONE]``. Parameters labserve does
not support get a 400 naming them (:mod:`labserve.server.openai_request` reads a request);
errors use OpenAI's body shape (an unknown model is a 404). The routes drive a
:class:`Generator` (what a served generative method gives) found through the server's
:class:`~labserve.server.exchange.Backend`. Framework-neutral handlers over the HTTP core;
loop-only.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

from labserve.base.errors import LabServeError, NotFoundError, ServerError
from labserve.generation.api import Finish, GenerateRequest, GenerationStream, Generator
from labserve.server.exchange import Exchange, Reply, Route, Verb, error_reply, json_reply
from labserve.server.openai_request import (
    IGNORED,
    NEUTRAL,
    ROLES,
    SEED_RANGE,
    STOP_MAX,
    SUPPORTED,
    chat_prompt,
    generate_request,
)
from labserve.wire.codec import JSON, load_json

__all__ = [
    "CHAT_PATH",
    "COMPLETIONS_PATH",
    "IGNORED",
    "NEUTRAL",
    "ROLES",
    "ROUTES",
    "SEED_RANGE",
    "SUPPORTED",
    "chat_prompt",
    "generate_request",
]

_ids = itertools.count(1)


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
        "seed": {"type": "integer", "minimum": SEED_RANGE[0], "maximum": SEED_RANGE[1]},
        "stop": {"type": "array", "maxItems": STOP_MAX, "items": {"type": "string"}},
        "ignore_eos": {"type": "boolean"},
        "stream": {"type": "boolean"},
        "stream_options": {
            "type": "object",
            "description": 'only with "stream": true',
            "properties": {
                "include_usage": {"type": "boolean"},
                "continuous_usage_stats": {
                    "type": "boolean",
                    "description": "accepted (vLLM's); usage still comes once, in the last chunk",
                },
            },
        },
    }
    body = {"type": "object", "required": ["model", own], "properties": properties}
    return {"requestBody": {"required": True, "content": {JSON: {"schema": body}}}}


_MESSAGES = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"type": "string", "enum": list(ROLES)},
            "content": {"type": "string"},
        },
    },
}

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"

ROUTES = (
    Route("/v1/models", {"GET": Verb(_models, "The served generative models (OpenAI's shape)")}),
    Route(
        COMPLETIONS_PATH,
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
        CHAT_PATH,
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
