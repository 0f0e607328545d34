"""What a generation load sends: prompts of drawn lengths, asking for drawn output lengths.

Request ``k`` draws an input length ``n`` and an output length ``m`` from the shared length
vocabulary (:mod:`labserve.base.lengths`; seeded, in the order requests go out), and asks
for a completion of a synthetic prompt of ``n`` bytes with ``max_tokens = m`` and
``ignore_eos`` (so the server generates exactly ``m`` tokens, as ``vllm bench serve
--ignore-eos`` does), streamed, with usage in the stream, at temperature 0.

The prompt is ``n`` bytes of ASCII: lowercase "words" of 1 to 8 letters separated by
single spaces, cut from a seeded random text at a random offset, so no two prompts share
more than a chance prefix (a server with a prefix cache gets no free hits). For a
byte-level model (TinyLM) one byte is one token, so ``n`` is the prompt's length in
tokens exactly. For a subword tokenizer the token count differs (random letters split
into more, shorter pieces than English does): the lengths are then approximate, and the
result reports the server's own ``usage.prompt_tokens`` where the server gives it. A chat
request sends the prompt as one user message; the server's chat template adds its own
tokens around it (labserve's adds 18 bytes).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from labserve.base.lengths import LengthDist, parse_length

__all__ = ["CHAT_PATH", "COMPLETIONS_PATH", "GenerationMix", "synthetic_text"]

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
_CHUNK = 1024  # lengths drawn at a time (a closed loop does not know how many it sends)
_TEXT_BYTES = 1 << 16  # the random text prompts are cut from


def synthetic_text(n_bytes: int, seed: int = 0) -> str:
    """``n_bytes`` of lowercase words (1-8 letters) and single spaces, fixed by ``seed``.

    >>> len(synthetic_text(100)), set(synthetic_text(100)) <= set("abcdefghijklmnopqrstuvwxyz ")
    (100, True)
    """
    rng = np.random.default_rng([seed, 21])
    letters = rng.integers(ord("a"), ord("z") + 1, size=n_bytes, dtype=np.uint8)
    # A space after each word of 1-8 letters: mark word ends, then put a space there.
    gaps = rng.integers(2, 10, size=n_bytes // 2 + 1)
    ends = np.cumsum(gaps) - 1
    letters[ends[ends < n_bytes]] = ord(" ")
    return letters.tobytes().decode("ascii")


class _Draws:
    """Request ``k``'s length from a distribution, drawn in order a chunk at a time."""

    def __init__(self, dist: LengthDist, rng: np.random.Generator) -> None:
        self.dist = dist
        self._rng = rng
        self._values = np.zeros(0, dtype=np.int64)

    def __getitem__(self, k: int) -> int:
        while k >= len(self._values):
            more = self.dist.sample(self._rng, _CHUNK)
            self._values = np.concatenate([self._values, more])
        return int(self._values[k])


class GenerationMix:
    """Request ``k``'s body: its prompt, its lengths, the JSON to send. Not thread-safe.

    ``input_len`` and ``output_len`` are length distributions or their strings
    (``"lognormal:16:128"``, ``"128"``); ``chat`` sends ``messages`` (to
    ``/v1/chat/completions``) instead of ``prompt``. ``ignore_eos=False`` leaves it out of
    the request (for servers that refuse the field): the output may then end early.

    Raises:
        ValueError, TypeError: a length spec breaks the vocabulary's rules.
    """

    def __init__(
        self,
        model: str,
        input_len: LengthDist | str | int,
        output_len: LengthDist | str | int,
        *,
        chat: bool = False,
        seed: int = 0,
        ignore_eos: bool = True,
    ) -> None:
        self.model = model
        self.input_len = parse_length(input_len, name="input_len")
        self.output_len = parse_length(output_len, name="output_len")
        self.chat = chat
        self.ignore_eos = ignore_eos
        self._inputs = _Draws(self.input_len, np.random.default_rng([seed, 22]))
        self._outputs = _Draws(self.output_len, np.random.default_rng([seed, 23]))
        self._offsets = np.random.default_rng([seed, 24])
        self._text = synthetic_text(_TEXT_BYTES, seed)

    def lengths(self, k: int) -> tuple[int, int]:
        """Request ``k``'s input length (bytes) and output length (``max_tokens``)."""
        return self._inputs[k], self._outputs[k]

    def prompt(self, n: int) -> str:
        """A fresh prompt of ``n`` bytes, cut from the text at a random offset."""
        text = self._text
        start = int(self._offsets.integers(0, len(text)))
        out = text[start : start + n]
        while len(out) < n:
            out += text[: n - len(out)]
        return out

    def body(self, k: int) -> tuple[bytes, int, int]:
        """Request ``k``'s JSON body, its input length and its ``max_tokens``."""
        n, m = self.lengths(k)
        request: dict[str, Any] = {"model": self.model}
        if self.chat:
            request["messages"] = [{"role": "user", "content": self.prompt(n)}]
        else:
            request["prompt"] = self.prompt(n)
        request |= {
            "max_tokens": m,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos:
            request["ignore_eos"] = True
        return json.dumps(request).encode(), n, m
