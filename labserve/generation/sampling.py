"""What labserve does with a step's output for one sequence: pick the token, say its text, stop.

Pure and per sequence, so that a sequence's tokens never depend on what else shares its
step: greedy decoding takes the first of the highest logits (numpy's ``argmax``: ties go to
the lowest token id); sampling with a temperature draws from the sequence's own generator,
seeded by its ``seed`` when one is given. Text comes out incrementally and never splits a
UTF-8 character; a stop string ends the sequence and is not part of its text (OpenAI's
rule), and text that may be the start of a stop string is held back until it is not.

What a model hands back is checked here, per sequence, so that the driver can fail the one
sequence whose row or token is bad (a ``ValueError`` naming what was wrong and what was
expected) and no other: a logits row must be finite (NaN or an infinity anywhere is refused,
at every temperature), and a token id must lie in the vocabulary.
"""

from __future__ import annotations

import codecs
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from labserve.base.errors import InputError

__all__ = ["SamplingParams", "SequenceSampler", "TextDecoder"]

_MAX_STOPS = 4
_SEED_RANGE = 2**64  # numpy's generators take seeds in 0..2**64-1 (and larger, but not < 0)


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
    """Fixes a sampled sequence's draws (None: fresh randomness). Any integer: it is taken
    modulo 2**64 (numpy's generators take seeds >= 0 only), so -1 draws as 2**64 - 1 does."""
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
        """The new text this token completes (may be empty).

        Raises:
            ValueError: the model's ``token_bytes`` or ``decode`` gave something other than
                bytes or a string (whatever they raise themselves goes through as it is).
        """
        if self._bytes is not None:
            raw = self._bytes(token_id)
            if not isinstance(raw, (bytes, bytearray)):
                raise ValueError(
                    f"the model's token_bytes({token_id}) gave a {type(raw).__name__}; "
                    "expected bytes"
                )
            return self._utf8.decode(raw)
        assert self._decode is not None
        self._ids.append(token_id)
        text = self._text_of(self._ids)
        if text.endswith("\ufffd"):
            return ""
        piece = text[self._shown :]
        self._shown = len(text)
        return piece

    def flush(self) -> str:
        """What is left at the end (an incomplete character, as a replacement character)."""
        if self._bytes is not None:
            return self._utf8.decode(b"", final=True)
        text = self._text_of(self._ids) if self._ids else ""
        piece = text[self._shown :]
        self._shown = len(text)
        return piece

    def _text_of(self, ids: list[int]) -> str:
        assert self._decode is not None
        text = self._decode(ids)
        if not isinstance(text, str):
            raise ValueError(
                f"the model's decode() of {len(ids)} token ids gave a {type(text).__name__}; "
                "expected a string"
            )
        return text


class SequenceSampler:
    """One sequence's sampling, text and stop rules. Used by one thread at a time.

    ``choose(row)`` takes the step's logits row for the sequence (or the token id the model
    chose) and returns the token; ``push(token, last)`` returns the text it adds (held back
    while it may start a stop string) and whether the sequence stops here. Both raise a plain
    ``ValueError`` for a bad row or id; the caller fails this sequence alone with it.

    ``vocab_size``: the model's vocabulary (ids ``0..vocab_size-1``; a logits row has one
    value per id). None: a row's length bounds the ids drawn from it, and a token id the
    model chose must be >= 0.

    >>> s = SequenceSampler(SamplingParams(temperature=0), TextDecoder(bytes), vocab_size=3)
    >>> s.choose(np.array([0.5, 2.0, 2.0]))  # greedy: the first of the highest
    1
    """

    __slots__ = ("_held", "_rng", "_stop_ids", "_text", "_vocab", "params", "text_out")

    def __init__(
        self,
        params: SamplingParams,
        text: TextDecoder,
        eos_token_id: int | None = None,
        *,
        vocab_size: int | None = None,
    ) -> None:
        if vocab_size is not None and (
            isinstance(vocab_size, bool)
            or not isinstance(vocab_size, numbers.Integral)
            or vocab_size < 1
        ):
            raise ValueError(f"vocab_size must be an integer >= 1 or None, got {vocab_size!r}")
        self.params = params
        self._text = text
        self._vocab = None if vocab_size is None else int(vocab_size)
        seed = None if params.seed is None else int(params.seed) % _SEED_RANGE
        self._rng = None if params.greedy else np.random.default_rng(seed)
        stop_ids = set(params.stop_token_ids)
        if eos_token_id is not None and not params.ignore_eos:
            stop_ids.add(eos_token_id)
        self._stop_ids = frozenset(stop_ids)
        self._held = ""  # text not given out yet: it may be the start of a stop string
        self.text_out = ""
        """The text given out so far."""

    def choose(self, row: npt.ArrayLike | int) -> int:
        """The next token from the logits ``row`` (or the token id the model chose).

        Greedy takes numpy's ``argmax`` (the lowest id among equal highest logits). With a
        temperature ``T`` it draws from softmax(row / T), computed as exp((row - max) / T) so
        that no temperature in (0, 2] overflows: when ``T`` is so small that every other
        logit's term underflows, the draw is among the highest logits only, as T -> 0 asks.

        Raises:
            ValueError: the row is not one finite number per token of the vocabulary, or
                the id the model chose is outside the vocabulary.
        """
        if isinstance(row, numbers.Integral) and not isinstance(row, bool):
            return self._in_vocab(int(row), "the model chose token id")
        x = self._logits(row)
        if self._rng is None:
            return int(np.argmax(x))
        z = x.astype(np.result_type(x.dtype, np.float64))  # float64, or longdouble if wider
        # (row - max) / T is <= 0: it may overflow to -inf (logits 2e308 apart, or a
        # subnormal T), whose exp is the 0 it stands for; the max itself stays exp(0) = 1.
        with np.errstate(over="ignore", under="ignore"):
            z -= z.max()
            z /= self.params.temperature
            p = np.exp(z)
        p /= p.sum()
        return int(self._rng.choice(p.size, p=p.astype(np.float64, copy=False)))

    def _logits(self, row: npt.ArrayLike) -> npt.NDArray[Any]:
        """``row`` as a 1-D numeric array, checked: its length and that it is finite."""
        x = np.asarray(row)
        if x.dtype.kind not in "fiu":
            raise ValueError(
                f"the model's logits row for this sequence has dtype {x.dtype}; "
                "a row must hold real numbers"
            )
        if x.ndim != 1 or x.size == 0 or (self._vocab is not None and x.size != self._vocab):
            expected = "one value per token id" if self._vocab is None else f"{self._vocab} values"
            raise ValueError(
                f"the model's logits row for this sequence has shape {x.shape}; "
                f"expected one row of {expected}"
            )
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            nan = int(np.isnan(x).sum())
            inf = int(np.isinf(x).sum())
            what = " and ".join(f"{n} {name}" for n, name in ((nan, "NaN"), (inf, "infinite")) if n)
            raise ValueError(
                f"the model's logits row for this sequence has {what} of {x.size} values; "
                "a row must be finite"
            )
        return x

    def _in_vocab(self, token_id: int, what: str) -> int:
        if self._vocab is None:
            if token_id < 0:
                raise ValueError(f"{what} {token_id}; a token id must be >= 0")
        elif not 0 <= token_id < self._vocab:
            raise ValueError(f"{what} {token_id}, outside the vocabulary 0..{self._vocab - 1}")
        return token_id

    def push(self, token_id: int, last: bool) -> tuple[str, bool]:
        """Account for ``token_id``; return (text to give out, whether it stops the sequence).

        ``last``: the sequence reaches ``max_tokens`` with this token (held text is let out).

        Raises:
            ValueError: ``token_id`` is outside the vocabulary, or the model's detokeniser
                gave something other than text (what it raises goes through as it is).
        """
        self._in_vocab(int(token_id), "token id")
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
