"""Traffic whose prompts share prefixes: tenants' system prompts and multi-turn chat sessions.

A :class:`SharedPrefixWorkload` is the one description the in-process load
(:mod:`labserve.lab.generation.sessions`), the HTTP load
(:mod:`labserve.load.generation.sessions`) and the simulator
(:func:`labserve.sim.generation.simulate_workload`) all read, so one seed gives the same
prompts in all three. As SGLang's generated-shared-prefix dataset: ``num_prefixes`` distinct
prefixes (system prompts, one per tenant) of ``prefix_len`` tokens; session ``k`` takes
prefix ``tenant(k)``, drawn uniformly or from a Zipf law (``"zipf:1.1"``: a hot tenant),
then a unique user message of ``input_len`` tokens. With ``turns > 1`` (as vLLM's
multi-turn benchmark) each later turn resends the whole history, the system prompt, the
earlier user messages and the replies the model actually gave, plus a new user message, after
``think_time_s`` of the session's last reply.

Text and token ids are one thing here: every generated piece is lowercase ASCII words, and a
piece's ids are its bytes. For a byte-level model (TinyLM) one character is one token, so a
prompt sent as text over HTTP is tokenized to exactly the ids the in-process load and the
simulator use (a reply is resent as the text the server returned; a reply whose bytes are
not ASCII changes the count by what the server's UTF-8 decoding did, and the HTTP result
counts the server's ``usage.prompt_tokens``). For a subword tokenizer the counts are
approximate. Draws are random access: session ``k``'s tenant and texts depend only on
``(seed, k)``, whatever order the sessions are sent in, so one workload object may drive
several loads, one after the other or at once (thread-safe: the lazily drawn lengths and
tenants are extended under a lock, in order).

>>> w = SharedPrefixWorkload(prefix_len=8, num_prefixes=2, input_len=4, output_len=2)
>>> p0, p1 = (w.prompt_ids(k) for k in range(2))
>>> len(p0), w.prompt_text(0).encode() == bytes(p0)
(12, True)
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from labserve.base.lengths import LengthDist, parse_length

__all__ = ["SharedPrefixWorkload", "parse_prefix_dist", "ttft_by_turn"]

_CHUNK = 1024  # lengths drawn at a time, in the order (session, turn)
# Salts apart from each other, so a change to one draw never moves another's stream.
_TENANT, _PREFIX, _USER, _REPLY, _LENGTHS = 41, 42, 43, 44, 45


def parse_prefix_dist(spec: str) -> tuple[str, float]:
    """``"uniform"`` or ``"zipf:S"`` (S > 0) as (kind, exponent).

    Raises:
        ValueError: any other spec.

    >>> parse_prefix_dist("zipf:1.1")
    ('zipf', 1.1)
    """
    text = str(spec).strip()
    if text == "uniform":
        return "uniform", 0.0
    kind, _, value = text.partition(":")
    if kind == "zipf":
        try:
            s = float(value)
        except ValueError:
            s = math.nan
        if math.isfinite(s) and s > 0:
            return "zipf", s
    raise ValueError(f"prefix_dist must be 'uniform' or 'zipf:S' with S > 0, got {spec!r}")


def _count(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer >= {low}, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _words(n: int, rng: np.random.Generator) -> bytes:
    """``n`` bytes of lowercase words of 1-8 letters, each followed by one space."""
    letters = rng.integers(ord("a"), ord("z") + 1, size=n, dtype=np.uint8)
    ends = np.cumsum(rng.integers(2, 10, size=n // 2 + 1)) - 1
    letters[ends[ends < n]] = ord(" ")
    return letters.tobytes()


class SharedPrefixWorkload:
    """Sessions of prompts that share a tenant's prefix (see the module). Thread-safe.

    Raises:
        ValueError, TypeError: a setting breaks its rule (the message names it).
    """

    def __init__(
        self,
        *,
        prefix_len: int = 0,
        num_prefixes: int = 1,
        prefix_dist: str = "uniform",
        input_len: LengthDist | str | int = 32,
        output_len: LengthDist | str | int = 128,
        turns: int = 1,
        think_time_s: float = 0.0,
        seed: int = 0,
        prefix_seed: int | None = None,
    ) -> None:
        self.prefix_len = _count("prefix_len", prefix_len, 0)
        self.num_prefixes = _count("num_prefixes", num_prefixes, 1)
        self.prefix_dist = str(prefix_dist).strip()
        kind, exponent = parse_prefix_dist(self.prefix_dist)
        self.input_len = parse_length(input_len, name="input_len")
        self.output_len = parse_length(output_len, name="output_len")
        self.turns = _count("turns", turns, 1)
        ok = isinstance(think_time_s, (int, float)) and not isinstance(think_time_s, bool)
        if not ok or not (math.isfinite(think_time_s) and think_time_s >= 0):
            raise ValueError(f"think_time_s must be a finite number >= 0, got {think_time_s!r}")
        self.think_time_s = float(think_time_s)
        self.seed = _count("seed", seed, 0)
        self.prefix_seed = (
            self.seed if prefix_seed is None else _count("prefix_seed", prefix_seed, 0)
        )
        weights: npt.NDArray[np.float64] = np.ones(self.num_prefixes)
        if kind == "zipf":  # tenant j's share is proportional to 1 / (j + 1) ** s
            weights = 1.0 / np.arange(1, self.num_prefixes + 1, dtype=np.float64) ** exponent
        self._cdf = np.cumsum(weights / weights.sum())
        self._prefixes: dict[int, bytes] = {}
        self._lengths = np.zeros((0, 2), dtype=np.int64)
        self._length_rng = np.random.default_rng([self.seed, _LENGTHS])
        self._tenants = np.zeros(0, dtype=np.int64)
        self._tenant_rng = np.random.default_rng([self.seed, _TENANT])
        self._lock = threading.Lock()  # two loads extending the draws at once stay in order

    def next_sessions(self, seed: int) -> SharedPrefixWorkload:
        """The same tenants (prefixes kept) with other sessions: what ``seed`` draws.

        For loads chained run after run (a dashboard's): each run's users are new, the
        system prompts they share stay, so a prefix cache keeps its hits across runs.
        """
        return SharedPrefixWorkload(
            prefix_len=self.prefix_len,
            num_prefixes=self.num_prefixes,
            prefix_dist=self.prefix_dist,
            input_len=self.input_len,
            output_len=self.output_len,
            turns=self.turns,
            think_time_s=self.think_time_s,
            seed=seed,
            prefix_seed=self.prefix_seed,
        )

    def __repr__(self) -> str:
        return (
            f"SharedPrefixWorkload(prefix_len={self.prefix_len}, num_prefixes="
            f"{self.num_prefixes}, prefix_dist={self.prefix_dist!r}, input_len="
            f"{self.input_len!r}, output_len={self.output_len!r}, turns={self.turns}, "
            f"think_time_s={self.think_time_s:g}, seed={self.seed})"
        )

    # -- what session k draws ------------------------------------------------------------

    def tenant(self, k: int) -> int:
        """The prefix (tenant) of session ``k``, in ``range(num_prefixes)``."""
        with self._lock:
            while k >= len(self._tenants):  # drawn in order a chunk at a time: k's is fixed
                u = self._tenant_rng.random(_CHUNK)
                more = np.searchsorted(self._cdf, u, side="right")
                more = np.minimum(more, self.num_prefixes - 1)
                self._tenants = np.concatenate([self._tenants, more])
            return int(self._tenants[k])

    def prefix(self, j: int) -> bytes:
        """Tenant ``j``'s shared prefix: ``prefix_len`` bytes (one token each, byte-level)."""
        got = self._prefixes.get(j)
        if got is None:  # two threads may both make it: the same bytes, from the seed
            rng = np.random.default_rng([self.prefix_seed, _PREFIX, j])
            got = _words(self.prefix_len, rng)
            self._prefixes[j] = got
        return got

    def lengths(self, k: int, turn: int = 0) -> tuple[int, int]:
        """Session ``k``'s user message length and ``max_tokens`` at ``turn``."""
        i = k * self.turns + turn
        with self._lock:
            while i >= len(self._lengths):
                more = np.stack(
                    [
                        self.input_len.sample(self._length_rng, _CHUNK),
                        self.output_len.sample(self._length_rng, _CHUNK),
                    ],
                    axis=1,
                )
                self._lengths = np.concatenate([self._lengths, more])
            n, m = self._lengths[i]
        return int(n), int(m)

    def user(self, k: int, turn: int = 0) -> bytes:
        """Session ``k``'s user message at ``turn`` (unique to it, by the seed)."""
        n, _ = self.lengths(k, turn)
        return _words(n, np.random.default_rng([self.seed, _USER, k, turn]))

    def max_tokens(self, k: int, turn: int = 0) -> int:
        """The output length session ``k`` asks for at ``turn`` (with ``ignore_eos``)."""
        return self.lengths(k, turn)[1]

    def simulated_reply(self, k: int, turn: int, n: int) -> list[int]:
        """The simulator's stand-in for a reply of ``n`` tokens: seeded lowercase letters."""
        rng = np.random.default_rng([self.seed, _REPLY, k, turn])
        return list(_words(n, rng))

    # -- the request of a turn -----------------------------------------------------------

    def _pieces(self, k: int, turn: int, replies: Sequence[Any]) -> list[Any]:
        if not 0 <= turn < self.turns:
            raise ValueError(f"turn must be in range({self.turns}), got {turn!r}")
        if len(replies) != turn:
            raise ValueError(f"turn {turn} needs the {turn} earlier replies, got {len(replies)}")
        pieces: list[Any] = [self.prefix(self.tenant(k))] if self.prefix_len else []
        for t in range(turn):
            pieces += [self.user(k, t), replies[t]]
        pieces.append(self.user(k, turn))
        return pieces

    def prompt_ids(self, k: int, turn: int = 0, replies: Sequence[Sequence[int]] = ()) -> list[int]:
        """Session ``k``'s prompt at ``turn`` as token ids: prefix, history, new message.

        ``replies`` are the ids of the model's ``turn`` earlier replies.
        """
        ids: list[int] = []
        for piece in self._pieces(k, turn, replies):
            ids += list(piece)
        return ids

    def prompt_text(self, k: int, turn: int = 0, replies: Sequence[str] = ()) -> str:
        """The same prompt as text (for ``/v1/completions``); ``replies`` as the server sent."""
        return "".join(
            p.decode("ascii") if isinstance(p, bytes) else p for p in self._pieces(k, turn, replies)
        )

    def messages(self, k: int, turn: int = 0, replies: Sequence[str] = ()) -> list[dict[str, str]]:
        """The same turn as chat messages (for ``/v1/chat/completions``).

        The prefix is the system message (none when ``prefix_len`` is 0); user and
        assistant messages alternate after it.
        """
        pieces = self._pieces(k, turn, replies)
        out: list[dict[str, str]] = []
        if self.prefix_len:
            out.append({"role": "system", "content": pieces.pop(0).decode("ascii")})
        for i, piece in enumerate(pieces):
            text = piece.decode("ascii") if isinstance(piece, bytes) else piece
            out.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
        return out


def ttft_by_turn(
    ttft_s: npt.NDArray[np.float64], turn: npt.NDArray[np.int64]
) -> dict[int, dict[str, float]]:
    """TTFT by turn index: count, mean, p50 and p99 in ms of the finite values of each turn.

    >>> ttft_by_turn(np.array([0.1, 0.3, 0.2]), np.array([0, 0, 1]))[0]["p50"]
    200.0
    """
    out: dict[int, dict[str, float]] = {}
    for t in sorted({int(x) for x in np.unique(turn)}):
        values = ttft_s[(turn == t) & np.isfinite(ttft_s)] * 1000.0
        if values.size == 0:
            out[t] = {"n": 0.0, "mean": math.nan, "p50": math.nan, "p99": math.nan}
            continue
        p50, p99 = np.percentile(values, [50.0, 99.0])
        out[t] = {
            "n": float(values.size),
            "mean": float(values.mean()),
            "p50": float(p50),
            "p99": float(p99),
        }
    return out
