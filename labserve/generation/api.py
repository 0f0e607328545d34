"""What a served generative method offers its callers: a request, its stream, its ending.

The runtime's continuous-batching engine (:mod:`labserve.runtime.generation.method`) implements
these protocols; the OpenAI-compatible routes (:mod:`labserve.server.openai`) drive any
:class:`Generator` through the server's :class:`~labserve.server.exchange.Backend`, so a
stand-in plugs in as well.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "ChatPrompt",
    "Completion",
    "Finish",
    "GenerateRequest",
    "GenerationStream",
    "Generator",
]

ChatMessages = tuple[tuple[str, str], ...]
"""A chat's messages as (role, content) pairs, in order."""


@dataclass(frozen=True)
class ChatPrompt:
    """A chat as a prompt: its messages, and labserve's own template of them as ``text``.

    A model with a chat template (``apply_chat_template(messages)`` returning token ids, as
    :class:`~labserve.lab.hf.HFDecoder` with a tokenizer that has one) makes the ids from
    ``messages``; any other model encodes ``text``.
    """

    messages: ChatMessages
    text: str


@dataclass(frozen=True)
class GenerateRequest:
    """One generation asked for, checked. Immutable."""

    model: str
    prompt: str
    max_tokens: int | None = None
    """The most tokens to generate (None: the generator's own limit)."""
    temperature: float = 1.0
    """0 is greedy."""
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    """Generate ``max_tokens`` even past the end-of-sequence token (as vLLM accepts it)."""
    messages: ChatMessages = ()
    """A chat's messages (empty for a completion); ``prompt`` is then labserve's template of
    them, for a model without a chat template of its own."""


@dataclass(frozen=True)
class Finish:
    """How a generation ended, and its token counts."""

    reason: str
    """``"stop"`` (a stop string, EOS) or ``"length"`` (``max_tokens`` reached)."""
    prompt_tokens: int
    completion_tokens: int

    @property
    def usage(self) -> dict[str, int]:
        """OpenAI's ``usage``."""
        total = self.prompt_tokens + self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": total,
        }


@dataclass(frozen=True)
class Completion:
    """A whole generation: its text, the token ids generated, and how it ended."""

    text: str
    token_ids: tuple[int, ...]
    finish: Finish

    @property
    def finish_reason(self) -> str:
        """``"stop"`` or ``"length"``."""
        return self.finish.reason


class GenerationStream(Protocol):
    """Text pieces as they come, then :attr:`finish`; raises the sequence's typed error.

    Closing it early (``aclose()``) frees the sequence at the next step.
    """

    def __aiter__(self) -> AsyncIterator[str]: ...

    @property
    def finish(self) -> Finish | None:
        """How it ended, once the iteration stopped (None before)."""

    async def aclose(self) -> None:
        """Give up the generation (idempotent)."""


class Generator(Protocol):
    """What the routes drive: a served generative method."""

    def start(self, request: GenerateRequest) -> GenerationStream:
        """Admit one generation; its stream yields the text as it is generated."""
