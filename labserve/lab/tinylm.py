"""TinyLM: a byte-level, decoder-only transformer on numpy alone, with a real KV cache.

Small enough for one core (a step of 32 sequences takes a few milliseconds) and real where
serving is concerned: attention reads every cached token, so a step costs more as
contexts grow, and the cache is per sequence, freed when it ends or is preempted and
rolled back when a step fails. Weights are seeded (no training): it writes fluent nonsense.

Batch invariance, by construction. A prompt's greedy tokens do not depend on what else is
in the batch, nor on how its prefill was chunked, because every sum whose order could
change with the batch is a sum of integers small enough to be exact:

- dense layers quantise each activation row to integers in [-127, 127] (a per-row scale)
  against integer weights (a per-column scale); the products' sums stay below 2**24, so
  float32 matrix products are exact whatever order BLAS adds them in;
- attention scores are exact in the same way (queries per row and head, keys on a fixed
  scale); softmax weights are rounded to integers of 16 bits and values kept on a fixed
  scale, so the weighted sum and its normaliser are exact float64 integers;
- everything else works on one row at a time (norms, residuals, exp).

Ties: greedy decoding takes the lowest token id among equal largest logits (``np.argmax``).

One BLAS thread per step, when threadpoolctl is installed (the ``lab`` extra): OpenBLAS's
own threads spin while they wait, and on two cores shared with the event loop and a
browser a decode step of 32 sequences took 34 ms of CPU with them and 2.7 ms without.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from labserve.generation.batch import SeqBatch
from labserve.runtime.runnable import Runnable, method

__all__ = ["TinyLM"]

_blas: Any = None  # threadpoolctl's controller, made at the first step (None: not installed)


def _one_blas_thread() -> contextlib.AbstractContextManager[Any]:
    """One BLAS thread while a step runs (a no-op without threadpoolctl)."""
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]
        except ImportError:
            _blas = False
        else:
            _blas = ThreadpoolController()
    return _blas.limit(limits=1, user_api="blas") if _blas else contextlib.nullcontext()


F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

_Q = 127.0  # the integer range of quantised activations and weights
_KV_SCALE = 1.0 / 32.0  # keys and values on a fixed grid (they stay within +-4)
_P_ONE = 65536.0  # softmax weights as integers of 16 bits


def _quantise_rows(x: F64) -> tuple[F32, F64]:
    """Each row to integers in [-127, 127] (as float32) and its scale (a column)."""
    peak = np.max(np.abs(x), axis=-1, keepdims=True)
    scale = np.where(peak > 0, peak / _Q, 1.0)
    return np.rint(x / scale).astype(np.float32), scale


class _Linear:
    """A dense layer with integer weights (a scale per output column)."""

    __slots__ = ("scale", "w")

    def __init__(self, w: F64) -> None:
        peak = np.max(np.abs(w), axis=0, keepdims=True)
        self.scale = np.where(peak > 0, peak / _Q, 1.0)
        self.w = np.rint(w / self.scale).astype(np.float32)

    def __call__(self, x: F64) -> F64:
        xq, xs = _quantise_rows(x)
        exact = (xq @ self.w).astype(np.float64)  # integer sums below 2**24: exact
        return np.asarray(exact * xs * self.scale)


def _rms_norm(x: F64) -> F64:
    return np.asarray(x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6))


def _on_grid(x: F64) -> F64:
    """Keys or values on the fixed grid: integers in [-127, 127] (steps of _KV_SCALE)."""
    g = np.rint(x * (1.0 / _KV_SCALE))  # a power of two: exact
    return np.minimum(np.maximum(g, -_Q, out=g), _Q, out=g)


class _Cache:
    """One sequence's keys and values, per layer, on the fixed grid; grown by doubling."""

    __slots__ = ("k", "length", "v")

    def __init__(self, layers: int, heads: int, head_dim: int, capacity: int) -> None:
        self.k = [np.zeros((heads, capacity, head_dim), np.float32) for _ in range(layers)]
        self.v = [np.zeros((heads, capacity, head_dim), np.float64) for _ in range(layers)]
        self.length = [0] * layers

    def append(self, layer: int, start: int, k: F64, v: F64) -> None:
        """Write the keys and values of positions ``start..`` (shape (heads, n, head_dim))."""
        end = start + k.shape[1]
        if end > self.k[layer].shape[1]:
            grow = max(end, 2 * self.k[layer].shape[1])
            for store in (self.k, self.v):
                old = store[layer]
                new = np.zeros((old.shape[0], grow, old.shape[2]), old.dtype)
                new[:, : old.shape[1]] = old
                store[layer] = new
        self.k[layer][:, start:end] = _on_grid(k)
        self.v[layer][:, start:end] = _on_grid(v)
        self.length[layer] = end

    def truncate(self, length: int) -> None:
        self.length = [min(n, length) for n in self.length]


class TinyLM(Runnable):
    """A byte-level decoder-only transformer with a KV cache, on numpy alone.

    Tokens are bytes (``vocab_size`` 256): :meth:`encode` is ``text.encode("utf-8")``.
    There is no end-of-sequence token: generation ends at ``max_tokens`` or a stop.

    Args:
        d_model: width of the residual stream.
        n_layers: transformer blocks.
        n_heads: attention heads (``d_model`` must divide by it).
        d_ff: width of each block's hidden layer (at most 1024: exactness needs it).
        max_model_len: the context, prompt plus outputs, in tokens.
        seed: the weights' seed.

    >>> lm = TinyLM()
    >>> batch = SeqBatch((1,), (np.array(lm.encode("hi")),), (0,), (True,))
    >>> lm.generate(batch).shape
    (1, 256)
    >>> lm.free_sequences([1])
    """

    vocab_size = 256
    eos_token_id: int | None = None

    def __init__(
        self,
        d_model: int = 128,
        n_layers: int = 2,
        n_heads: int = 4,
        d_ff: int = 512,
        max_model_len: int = 1024,
        seed: int = 0,
    ) -> None:
        if d_model % n_heads or d_model < n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads, got {d_model}, {n_heads}")
        if not 1 <= d_ff <= 1024 or not 1 <= d_model <= 1024:
            raise ValueError(f"d_model and d_ff must be 1..1024, got {d_model}, {d_ff}")
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be an integer >= 2, got {max_model_len}")
        rng = np.random.default_rng(seed)
        self.d_model, self.n_layers, self.n_heads = d_model, n_layers, n_heads
        self.head_dim = d_model // n_heads
        self.max_model_len = max_model_len
        self.embed = rng.standard_normal((self.vocab_size, d_model))
        self.positions = 0.5 * rng.standard_normal((max_model_len, d_model))

        def dense(n_in: int, n_out: int, gain: float = 1.0) -> _Linear:
            return _Linear(gain * rng.standard_normal((n_in, n_out)) / np.sqrt(n_in))

        self.layers = [
            (
                dense(d_model, 3 * d_model),
                dense(d_model, d_model, 0.5),
                dense(d_model, d_ff),
                dense(d_ff, d_model, 0.5),
            )
            for _ in range(n_layers)
        ]
        # Tied to the embedding, as small LMs often are: the model prefers plausible bytes.
        self.unembed = _Linear(self.embed.T.copy())
        self._caches: dict[int, _Cache] = {}

    # -- tokens ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids: its UTF-8 bytes."""
        return list(text.encode("utf-8"))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (one byte)."""
        return bytes((token_id,))

    # -- the step ---------------------------------------------------------------------------

    @method(generative=True, max_num_seqs=32, max_num_batched_tokens=512)
    def generate(self, batch: SeqBatch) -> F64:
        """Advance each sequence of ``batch`` by its new tokens; next-token logits per sampler.

        Returns float64 logits, shape (sequences that sample, 256), in batch order.
        """
        with _one_blas_thread():
            return self._step(batch)

    def _step(self, batch: SeqBatch) -> F64:
        counts = [len(t) for t in batch.tokens]
        tokens = np.concatenate(batch.tokens) if batch.tokens else np.zeros(0, np.int64)
        positions = np.concatenate(
            [np.arange(s, s + n) for s, n in zip(batch.starts, counts, strict=True)]
        )
        if positions.size and positions.max() >= self.max_model_len:
            raise ValueError(f"position {positions.max()} is past max_model_len")
        caches = [
            self._cache(seq_id, start)
            for seq_id, start in zip(batch.seq_ids, batch.starts, strict=True)
        ]
        x = self.embed[tokens] + self.positions[positions]
        for layer, (qkv, out, up, down) in enumerate(self.layers):
            x = x + out(self._attend(layer, qkv(_rms_norm(x)), caches, batch.starts, counts))
            x = x + down(np.maximum(up(_rms_norm(x)), 0.0))
        ends = np.cumsum(counts) - 1
        last = ends[np.asarray(batch.samples, dtype=bool)]
        return self.unembed(_rms_norm(x[last]))

    def _cache(self, seq_id: int, start: int) -> _Cache:
        cache = self._caches.get(seq_id)
        if cache is None or start == 0:
            capacity = min(self.max_model_len, 64)
            cache = _Cache(self.n_layers, self.n_heads, self.head_dim, capacity)
            self._caches[seq_id] = cache
        elif cache.length[0] < start:
            raise ValueError(
                f"sequence {seq_id} has {cache.length[0]} cached tokens, the step starts at {start}"
            )
        return cache

    def _attend(
        self, layer: int, qkv: F64, caches: list[_Cache], starts: Sequence[int], counts: list[int]
    ) -> F64:
        """Causal attention of each sequence's new tokens over its whole cached context."""
        h, hd = self.n_heads, self.head_dim
        q, k, v = (part.reshape(-1, h, hd).transpose(1, 0, 2) for part in np.split(qkv, 3, -1))
        out = np.empty((qkv.shape[0], self.d_model))
        qq_all, qs_all = _quantise_rows(q)  # per (head, token) row: row-local
        qs_all *= _KV_SCALE / np.sqrt(hd)
        row = 0
        for cache, start, n in zip(caches, starts, counts, strict=True):
            cache.append(layer, start, k[:, row : row + n], v[:, row : row + n])
            ctx = start + n
            qq, qs = qq_all[:, row : row + n], qs_all[:, row : row + n]  # (h, n, hd), (h, n, 1)
            exact = qq @ cache.k[layer][:, :ctx].transpose(0, 2, 1)  # (h, n, ctx): exact
            scores = exact.astype(np.float64) * qs
            if n > 1:  # a token sees the positions up to its own
                future = np.arange(ctx)[None, :] > np.arange(start, ctx)[:, None]
                scores[:, future] = -np.inf
            weights = np.rint(np.exp(scores - scores.max(axis=-1, keepdims=True)) * _P_ONE)
            mixed = weights @ cache.v[layer][:, :ctx]  # exact integers
            total = weights.sum(axis=-1, keepdims=True)  # exact integers
            att = mixed / total * _KV_SCALE  # (h, n, hd)
            out[row : row + n] = att.transpose(1, 0, 2).reshape(n, self.d_model)
            row += n
        return out

    # -- the hooks labserve calls -------------------------------------------------------------

    def free_sequences(self, seq_ids: Sequence[int]) -> None:
        """Drop the state of sequences that ended or were preempted."""
        for seq_id in seq_ids:
            self._caches.pop(seq_id, None)

    def rollback_step(self, batch: SeqBatch) -> None:
        """Undo a step that raised: each sequence's cache back to before it."""
        for seq_id, start in zip(batch.seq_ids, batch.starts, strict=True):
            cache = self._caches.get(seq_id)
            if cache is None:
                continue
            if start == 0:
                del self._caches[seq_id]
            else:
                cache.truncate(start)

    @property
    def num_cached_sequences(self) -> int:
        """Sequences whose state the model holds (a test checks nothing leaks)."""
        return len(self._caches)
