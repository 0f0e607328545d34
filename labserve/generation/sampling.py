"""What labserve does with a step's output for one sequence: pick the token, say its text, stop.

Pure and per sequence, so that a sequence's tokens never depend on what else shares its
step: greedy decoding takes the first of the highest logits (numpy's ``argmax``: ties go to
the lowest token id); sampling with a temperature draws from the sequence's own generator,
seeded by its ``seed`` when one is given. Text comes out incrementally and never splits a
UTF-8 character; a stop string ends the sequence and is not part of its text (OpenAI's
rule), and text that may be the start of a stop string is held back until it is not.
"""

from __future__ import annotations

import codecs
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from labserve.base.errors import InputError

__all__ = ["SamplingParams", "SequenceSampler", "TextDecoder"]

_MAX_STOPS = 4


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence is generated. Frozen, validated.

    >>> SamplingParams(max_tokens=8, temperature=0.0).greedy
    True
    """

    max_tokens: int = 16
    """The most tokens to generate (>= 1)."""
    temperature: float = 1.0
    """0 is greedy; above 0 samples from softmax(logits / temperature)."""
    seed: int | None = None
    """Fixes a sampled sequence's draws (None: fresh randomness)."""
    stop: tuple[str, ...] = ()
    """Strings that end the sequence (up to 4); not included in its text."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the sequence (the token counts as generated; its text is not shown)."""
    ignore_eos: bool = False
    """Generate ``max_tokens`` even past the model's end-of-sequence token (as vLLM accepts)."""
    priority: int = 0
    """The waiting queue's order under ``scheduling_policy="priority"`` (lowest first)."""

    def __post_init__(self) -> None:
        m = self.max_tokens
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 1:
            raise InputError(f"max_tokens must be an integer >= 1, got {m!r}", sent=m)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise InputError(f"temperature must be a finite number >= 0, got {t!r}", sent=t)
        s = self.seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, numbers.Integral)):
            raise InputError(f"seed must be an integer or None, got {s!r}", sent=s)
        stops = self.stop
        if isinstance(stops, str):
            object.__setattr__(self, "stop", (stops,))
            stops = self.stop
        if len(stops) > _MAX_STOPS or not all(isinstance(x, str) and x for x in stops):
            raise InputError(
                f"stop must be up to {_MAX_STOPS} non-empty strings, got {stops!r}", sent=stops
            )
        p = self.priority
        if isinstance(p, bool) or not isinstance(p, numbers.Integral):
            raise InputError(f"priority must be an integer, got {p!r}", sent=p)

    @property
    def greedy(self) -> bool:
        """Whether the highest logit is always taken."""
        return self.temperature == 0


class TextDecoder:
    """A sequence's text, token by token, never splitting a UTF-8 character.

    Built from a model's ``token_bytes(id) -> bytes`` (exact, incremental), or from its
    ``decode(ids) -> str`` (the text of the ids so far, minus what was shown; a trailing
    replacement character is held back, as it may be half a character).
    """

    def __init__(
        self,
        token_bytes: Callable[[int], bytes] | None = None,
        decode: Callable[[Sequence[int]], str] | None = None,
    ) -> None:
        if token_bytes is None and decode is None:
            raise TypeError("a TextDecoder needs token_bytes or decode")
        self._bytes = token_bytes
        self._decode = decode
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._ids: list[int] = []
        self._shown = 0  # characters of decode(ids) already given out

    def push(self, token_id: int) -> str:
        """The new text this token completes (may be empty)."""
        if self._bytes is not None:
            return self._utf8.decode(self._bytes(token_id))
        assert self._decode is not None
        self._ids.append(token_id)
        text = self._decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        piece = text[self._shown :]
        self._shown = len(text)
        return piece

    def flush(self) -> str:
        """What is left at the end (an incomplete character, as a replacement character)."""
        if self._bytes is not None:
            return self._utf8.decode(b"", final=True)
        assert self._decode is not None
        text = self._decode(self._ids) if self._ids else ""
        piece = text[self._shown :]
        self._shown = len(text)
        return piece


class SequenceSampler:
    """One sequence's sampling, text and stop rules. Used by one thread at a time.

    ``push(row)`` takes the step's logits row for the sequence (or a token id), returns the
    token, the text it adds (held back while it may start a stop string) and whether the
    sequence stops here.
    """

    __slots__ = ("_held", "_rng", "_stop_ids", "_text", "params", "text_out")

    def __init__(
        self, params: SamplingParams, text: TextDecoder, eos_token_id: int | None = None
    ) -> None:
        self.params = params
        self._text = text
        self._rng = None if params.greedy else np.random.default_rng(params.seed)
        stop_ids = set(params.stop_token_ids)
        if eos_token_id is not None and not params.ignore_eos:
            stop_ids.add(eos_token_id)
        self._stop_ids = frozenset(stop_ids)
        self._held = ""  # text not given out yet: it may be the start of a stop string
        self.text_out = ""
        """The text given out so far."""

    def choose(self, row: npt.NDArray[np.float64] | int) -> int:
        """The next token from the logits ``row`` (or the token the model chose)."""
        if isinstance(row, numbers.Integral):
            return int(row)
        if self._rng is None:
            return int(np.argmax(row))
        z = np.asarray(row, dtype=np.float64) / self.params.temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        return int(self._rng.choice(p.size, p=p))

    def push(self, token_id: int, last: bool) -> tuple[str, bool]:
        """Account for ``token_id``; return (text to give out, whether it stops the sequence).

        ``last``: the sequence reaches ``max_tokens`` with this token (held text is let out).
        """
        if token_id in self._stop_ids:
            return self._let_out(self._held + self._text.flush()), True
        held = self._held + self._text.push(token_id)
        stops = self.params.stop
        if stops:
            for s in stops:
                at = held.find(s)
                if at >= 0:
                    return self._let_out(held[:at]), True
            if not last:
                keep = _longest_stop_prefix(held, stops)
                out = self._let_out(held[: len(held) - keep])
                self._held = held[len(held) - keep :] if keep else ""
                return out, False
        if last:
            held += self._text.flush()
        self._held = ""
        return self._let_out(held), False

    def _let_out(self, text: str) -> str:
        self._held = ""
        self.text_out += text
        return text


def _longest_stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of ``text`` that begin some stop string (held back)."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
