"""What an OpenAI-compatible request asks for: its body checked and read, parameter by parameter.

The rules are OpenAI's where labserve supports the parameter (and vLLM's where OpenAI has
none: ``ignore_eos``, the seed's range); a parameter labserve does not support is refused by
name, never ignored silently. Every refusal is an InputError (400) whose ``param`` names the
parameter at fault, as the request spells it (``"messages[1].role"``), where one is.
Pure functions, any thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labserve.base.errors import InputError
from labserve.generation.api import GenerateRequest

__all__ = [
    "IGNORED",
    "NEUTRAL",
    "ROLES",
    "SEED_RANGE",
    "STOP_MAX",
    "SUPPORTED",
    "chat_messages",
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
STOP_MAX = 4
"""The most stop strings a request may give (OpenAI's limit)."""
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
"""The chat roles OpenAI's API accepts (``function`` is its deprecated form of ``tool``)."""
SEED_RANGE = (-(2**63), 2**64 - 1)
"""The seeds the routes take: any int64 (vLLM's range) or uint64 (what a hash gives)."""
# include_obfuscation (OpenAI's padding against length side channels) changes nothing on the
# wire labserve needs: ignored. continuous_usage_stats is vLLM's "usage on every chunk":
# guidellm 0.8.1 sends it on every streamed request (a 400 failed all of them) and aiperf with
# --per-chunk-usage; labserve answers it with usage in the last chunk only, as include_usage
# does (a stream learns its token count when it ends), and both clients read the last usage.
_STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation", "continuous_usage_stats"})


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
        or len(stops) > STOP_MAX
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
    messages = chat_messages(body.get("messages")) if chat else ()
    prompt = _template(messages) if chat else _prompt(body.get("prompt"))
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
        messages=messages,
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
    return _template(chat_messages(messages))


def _template(messages: tuple[tuple[str, str], ...]) -> str:
    return "".join(f"{role}: {content}\n" for role, content in messages) + "assistant: "


def chat_messages(messages: Any) -> tuple[tuple[str, str], ...]:
    """A chat's messages, checked, as (role, content) pairs (a content's text parts joined).

    InputError (400) names the message at fault.
    """
    if not isinstance(messages, list) or not messages:
        raise InputError(
            '"messages" must be a non-empty list of {"role", "content"} objects', param="messages"
        )
    out = []
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
        out.append((str(role), _content(message.get("content"), i)))
    return tuple(out)


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
