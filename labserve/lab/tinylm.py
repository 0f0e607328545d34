"""TinyLM: a byte-level, decoder-only transformer on numpy alone, with a real KV cache.

Small enough for one core (a step of 32 sequences takes a few milliseconds) and real where
serving is concerned: attention reads every cached token, so a step costs more as
contexts grow. Its shipped weights (``tinylm_weights.npz``, 1 MB of float16) were trained by
``scripts/train_tinylm.py`` on Python's own documentation (the standard library's
``pydoc_data/topics.py``, PSF licence), each paragraph ended by the byte 0x03
(``TINYLM_EOS``): it writes words, in the docs' style, and ends its texts. Other sizes, or
``weights="random"``, draw weights from a seed instead (and have no end-of-sequence token).

Paged K/V, vLLM's way: keys and values live in one store per layer, indexed by flat slot
(``block * block_size + offset``). Under labserve it stores K/V in labserve's blocks
(``allocate_kv``): labserve allocates the store's size once, and each step's block tables say
which slots each sequence owns; TinyLM writes the new tokens' K/V at their slots and reads
each context through its table. Freeing, preemption and a failed step are labserve's
business (a retried step rewrites the same slots). Called directly, with steps that carry no
tables, it keeps its own tables over the same kind of store (``free_sequences`` and
``rollback_step`` then act on them).

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

Freed memory stays with the process (:func:`_keep_freed_memory`, once, at the first step): a
step's numpy temporaries (11 MiB at a 512-token prefill) come and go each step, and glibc's
default thresholds handed them back to the kernel and faulted them in again, 5,150 pages a
step at 1.8 us each: a third of the step's CPU, and the slow first minute of a fresh
process while glibc's own thresholds crept up.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from labserve.generation.batch import SeqBatch
from labserve.runtime.runnable import Runnable, method

__all__ = ["TINYLM_EOS", "TinyLM"]

# The end-of-sequence token of the trained weights: byte 0x03, ASCII's "end of text". It
# never occurs in the training text (Python's docs), and keeping the vocabulary at 256
# bytes keeps every byte-level path (tokenizer, HTTP, detokeniser) as it is.
TINYLM_EOS = 3
# Trained by scripts/train_tinylm.py on the standard library's pydoc_data/topics.py
# (Python's documentation, PSF licence).
_WEIGHTS = Path(__file__).with_name("tinylm_weights.npz")
_SHIPPED_SHAPE = (128, 2, 4, 512)  # d_model, n_layers, n_heads, d_ff of the trained weights

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


_kept = False  # _keep_freed_memory ran


def _keep_freed_memory() -> None:
    """Pin glibc's mmap and trim thresholds at the top of their own dynamic range (once).

    Process-wide, glibc only (elsewhere a no-op): blocks under 32 MiB come from the heap,
    and up to 64 MiB of freed heap is kept instead of trimmed. glibc moves the thresholds
    there itself (mallopt(3): a freed mmap'd block raises them to its size), but only as
    blocks that large are freed, and a step's are 2-5 MiB: a fresh process faulted 140,000
    pages in its first 1-s burst of issue 33 (c) and 8,000-24,000 in every later one.
    """
    global _kept
    if _kept or not sys.platform.startswith("linux"):
        return
    _kept = True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 64 << 20)


F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

_Q = 127.0  # the integer range of quantised activations and weights
_KV_SCALE = 1.0 / 32.0  # keys and values on a fixed grid (they stay within +-4)
_P_ONE = 65536.0  # softmax weights as integers of 16 bits
_OWN_BLOCK_SIZE = 16  # positions a block holds when TinyLM keeps its own tables
# Blocks of padding a group of decoding sequences may gather and attend over before the
# next shorter ones start a group of their own (a group costs about 15 array calls a
# layer). 32 sequences at contexts spread over 32-288, decode step CPU: 3.4-4.0 ms at 8 or
# 16, 4.5-4.8 ms with a group per length, 5.3 ms in one group, 4.5 ms by powers of two.
_PAD_BLOCKS = 8


def _quantise_rows(x: F64) -> tuple[F32, F64]:
    """Each row to integers in [-127, 127] (as float32) and its scale (a column)."""
    peak = np.maximum(x.max(axis=-1, keepdims=True), -x.min(axis=-1, keepdims=True))
    scale = np.where(peak > 0, peak / _Q, 1.0)
    q = x / scale
    return np.rint(q, out=q).astype(np.float32), scale


class _Linear:
    """A dense layer with integer weights (a scale per output column)."""

    __slots__ = ("scale", "w")

    def __init__(self, w: F64) -> None:
        peak = np.max(np.abs(w), axis=0, keepdims=True)
        self.scale = np.where(peak > 0, peak / _Q, 1.0)
        self.w = np.rint(w / self.scale).astype(np.float32)

    def __call__(self, x: F64) -> F64:
        xq, xs = _quantise_rows(x)
        out = (xq @ self.w).astype(np.float64)  # integer sums below 2**24: exact
        out *= xs
        out *= self.scale
        return out


def _rms_norm(x: F64) -> F64:
    return np.asarray(x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6))


def _on_grid(x: F64) -> F64:
    """Keys or values on the fixed grid: integers in [-127, 127] (steps of _KV_SCALE)."""
    g = np.rint(x * (1.0 / _KV_SCALE))  # a power of two: exact
    return np.minimum(np.maximum(g, -_Q, out=g), _Q, out=g)


def _mix(scores: F64, values: F64) -> F64:
    """Softmax of ``scores`` (last axis) as 16-bit integer weights, applied to ``values``.

    The weights and the values are integers, so the weighted sum and its normaliser are
    exact whatever the order of the additions (and positions scored -inf weigh 0).
    """
    weights = scores  # in place: each temporary of a 512-token prefill is 2 MiB to fault in
    weights -= scores.max(axis=-1, keepdims=True)
    np.exp(weights, out=weights)
    weights *= _P_ONE
    np.rint(weights, out=weights)
    mixed = weights @ values  # exact integers
    mixed /= weights.sum(axis=-1, keepdims=True)  # the sum: exact integers
    mixed *= _KV_SCALE
    return mixed


class _OwnBlocks:
    """TinyLM's own block tables, for steps that carry none (it is called directly).

    The same paged store as under labserve, with TinyLM as its own block manager: a free
    list, a table and a length per sequence; the store doubles when it runs out.
    """

    __slots__ = ("free", "lengths", "tables")

    def __init__(self) -> None:
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self.free: list[int] = []

    def drop(self, seq_id: int) -> None:
        self.free += self.tables.pop(seq_id, [])
        self.lengths.pop(seq_id, None)

    def cut(self, seq_id: int, length: int, block_size: int) -> None:
        """Keep the blocks of the first ``length`` positions (a rolled-back step)."""
        table = self.tables[seq_id]
        keep = -(-length // block_size)
        self.free += table[keep:]
        del table[keep:]
        self.lengths[seq_id] = min(self.lengths[seq_id], length)


class TinyLM(Runnable):
    """A byte-level decoder-only transformer with a KV cache, on numpy alone.

    Tokens are bytes (``vocab_size`` 256): :meth:`encode` is ``text.encode("utf-8")``. With
    the trained weights ``eos_token_id`` is byte 0x03, which ends a generation unless
    ``ignore_eos``; with seeded ones it is None (generation ends at ``max_tokens`` or a stop).

    Args:
        d_model: width of the residual stream.
        n_layers: transformer blocks.
        n_heads: attention heads (``d_model`` must divide by it).
        d_ff: width of each block's hidden layer (at most 1024: exactness needs it).
        max_model_len: the context, prompt plus outputs, in tokens.
        seed: the seed of random weights.
        weights: ``"trained"`` (the shipped weights: the default size only), ``"random"``
            (drawn from ``seed``), or the path of an npz written by ``scripts/train_tinylm.py``.
            None: trained for the default size, random for any other.

    Raises:
        ValueError: a size out of range, or weights that do not fit it.

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
        weights: str | None = None,
    ) -> None:
        if d_model % n_heads or d_model < n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads, got {d_model}, {n_heads}")
        if not 1 <= d_ff <= 1024 or not 1 <= d_model <= 1024:
            raise ValueError(f"d_model and d_ff must be 1..1024, got {d_model}, {d_ff}")
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be an integer >= 2, got {max_model_len}")
        self.d_model, self.n_layers, self.n_heads = d_model, n_layers, n_heads
        self.head_dim = d_model // n_heads
        self.max_model_len = max_model_len
        shipped = (d_model, n_layers, n_heads, d_ff) == _SHIPPED_SHAPE
        if weights is None:
            weights = "trained" if shipped else "random"
        if weights == "random":
            self._random_weights(d_ff, seed)
        else:
            self._load_weights(_WEIGHTS if weights == "trained" else Path(weights), d_ff)
            self.eos_token_id = TINYLM_EOS
        self._k: list[F32] = []  # per layer, (heads, slots, head_dim): keys on the grid
        self._v: list[F64] = []  # per layer, the same for values (float64: exact sums)
        self._block_size = _OWN_BLOCK_SIZE
        self._paged = False  # allocate_kv was called: labserve owns the block tables
        self._own = _OwnBlocks()
        self._gathered: dict[np.dtype[Any], npt.NDArray[Any]] = {}  # _gather's buffers

    def _random_weights(self, d_ff: int, seed: int) -> None:
        """Weights drawn from ``seed`` (no EOS: they never learned one)."""
        rng = np.random.default_rng(seed)
        d_model = self.d_model
        self.embed = rng.standard_normal((self.vocab_size, d_model))
        self.positions = 0.5 * rng.standard_normal((self.max_model_len, d_model))

        def dense(n_in: int, n_out: int, gain: float = 1.0) -> _Linear:
            return _Linear(gain * rng.standard_normal((n_in, n_out)) / np.sqrt(n_in))

        self.layers = [
            (
                dense(d_model, 3 * d_model),
                dense(d_model, d_model, 0.5),
                dense(d_model, d_ff),
                dense(d_ff, d_model, 0.5),
            )
            for _ in range(self.n_layers)
        ]
        # Tied to the embedding, as small LMs often are: the model prefers plausible bytes.
        self.unembed = _Linear(self.embed.T.copy())

    def _load_weights(self, path: Path, d_ff: int) -> None:
        """Trained weights from an npz written by ``scripts/train_tinylm.py``."""
        d = self.d_model
        with np.load(path) as npz:
            arrays = {name: npz[name].astype(np.float64) for name in npz.files}
        want = {"embed": (self.vocab_size, d)}
        for i in range(self.n_layers):
            want |= {f"layer{i}.qkv": (d, 3 * d), f"layer{i}.out": (d, d)}
            want |= {f"layer{i}.up": (d, d_ff), f"layer{i}.down": (d_ff, d)}
        wrong = [k for k, shape in want.items() if k not in arrays or arrays[k].shape != shape]
        rows = arrays["positions"].shape[0] if "positions" in arrays else 0
        if wrong or rows < self.max_model_len:
            raise ValueError(
                f"{path} does not fit this TinyLM (d_model {d}, d_ff {d_ff}, "
                f"{self.n_layers} layers, max_model_len {self.max_model_len}): "
                f"{', '.join(wrong) or f'positions for {rows} tokens'}"
            )
        self.embed = arrays["embed"]
        self.positions = arrays["positions"][: self.max_model_len]
        self.layers = [
            tuple(_Linear(arrays[f"layer{i}.{n}"]) for n in ("qkv", "out", "up", "down"))  # type: ignore[misc]
            for i in range(self.n_layers)
        ]
        self.unembed = _Linear(self.embed.T.copy())

    # -- tokens ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids: its UTF-8 bytes."""
        return list(text.encode("utf-8"))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (one byte)."""
        return bytes((token_id,))

    # -- K/V in labserve's blocks ---------------------------------------------------------------

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of one token's K/V over all layers: float32 keys, float64 values."""
        return self.n_layers * self.d_model * (4 + 8)

    def allocate_kv(self, num_blocks: int, block_size: int) -> list[npt.NDArray[Any]]:
        """Allocate the K/V store for labserve's ``num_blocks`` blocks; return its arrays.

        From then on every step must carry block tables (labserve's).
        """
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}"
            )
        self._own = _OwnBlocks()
        self._block_size = block_size
        self._alloc(num_blocks * block_size)
        self._paged = True
        return [*self._k, *self._v]

    def _alloc(self, slots: int) -> None:
        shape = (self.n_heads, slots, self.head_dim)
        self._k = [np.zeros(shape, np.float32) for _ in range(self.n_layers)]
        self._v = [np.zeros(shape, np.float64) for _ in range(self.n_layers)]

    # -- the step ---------------------------------------------------------------------------

    @method(generative=True, max_num_seqs=32, max_num_batched_tokens=512)
    def generate(self, batch: SeqBatch) -> F64:
        """Advance each sequence of ``batch`` by its new tokens; next-token logits per sampler.

        Returns float64 logits, shape (sequences that sample, 256), in batch order.
        """
        _keep_freed_memory()
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
        if batch.block_tables:
            if batch.block_size != self._block_size or not self._paged:
                raise ValueError(
                    f"the step's blocks of {batch.block_size} positions are not the store's "
                    f"(allocate_kv made blocks of {self._block_size if self._paged else 'none'})"
                )
            tables: Sequence[Sequence[int]] = batch.block_tables
        elif self._paged:
            raise ValueError("this TinyLM stores K/V in labserve's blocks: a step needs tables")
        else:
            tables = self._own_tables(batch, counts)
        where = _Where(tables, self._block_size, positions, batch.starts, counts)
        x = self.embed[tokens] + self.positions[positions]
        for layer, (qkv, out, up, down) in enumerate(self.layers):
            att = self._attend(layer, qkv(_rms_norm(x)), where, batch.starts, counts)
            x += out(att)
            hidden = up(_rms_norm(x))
            x += down(np.maximum(hidden, 0.0, out=hidden))
        ends = np.cumsum(counts) - 1
        last = ends[np.asarray(batch.samples, dtype=bool)]
        return self.unembed(_rms_norm(x[last]))

    def _attend(
        self,
        layer: int,
        qkv: F64,
        where: _Where,
        starts: Sequence[int],
        counts: list[int],
    ) -> F64:
        """Causal attention of each sequence's new tokens over its whole context, from the store.

        The new keys and values are written at their slots first. Decoding sequences (one
        new token) are attended together, a group of similar lengths at a time
        (:meth:`_attend_decodes`); a prefill chunk alone, over a view of its context when
        its table is one run of slots, else over its blocks gathered.
        """
        h, hd = self.n_heads, self.head_dim
        q, k, v = (part.reshape(-1, h, hd).transpose(1, 0, 2) for part in np.split(qkv, 3, -1))
        keys, values = self._k[layer], self._v[layer]
        keys[:, where.new_slots] = _on_grid(k)
        values[:, where.new_slots] = _on_grid(v)
        out = np.empty((qkv.shape[0], self.d_model))
        qq_all, qs_all = _quantise_rows(q)  # per (head, token) row: row-local
        qs_all *= _KV_SCALE / np.sqrt(hd)
        for rows, table, ctxs in where.decodes:
            out[rows] = self._attend_decodes(
                keys, values, qq_all[:, rows], qs_all[:, rows], table, ctxs
            )
        for i in where.prefills:
            start, n, row = starts[i], counts[i], where.rows[i]
            ctx, base = start + n, where.runs[i]
            if base >= 0:  # one run of slots: a view of the store
                ck, cv = keys[:, base : base + ctx], values[:, base : base + ctx]
            else:
                ck, cv = (self._gather(a, where.tables[i]) for a in (keys, values))
            qq, qs = qq_all[:, row : row + n], qs_all[:, row : row + n]  # (h, n, hd), (h, n, 1)
            exact = qq @ ck[:, :ctx].transpose(0, 2, 1)  # (h, n, ctx): exact
            scores = exact.astype(np.float64)
            scores *= qs
            future = np.arange(ctx)[None, :] > np.arange(start, ctx)[:, None]
            scores[:, future] = -np.inf  # a token sees the positions up to its own
            att = _mix(scores, cv[:, :ctx])  # (h, n, hd)
            out[row : row + n] = att.transpose(1, 0, 2).reshape(n, self.d_model)
        return out

    def _gather(self, store: npt.NDArray[Any], blocks: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        """The slots of ``blocks`` (any shape), whole blocks at a time: (h, ..., hd)."""
        h, size, hd = store.shape[0], self._block_size, store.shape[2]
        by_block = store.reshape(h, -1, size * hd)  # a view: a block's slots are one row
        n = h * blocks.size * size * hd
        buf = self._gathered.get(store.dtype)
        if buf is None or buf.size < n:
            buf = self._gathered[store.dtype] = np.empty(
                max(n, 2 * (0 if buf is None else buf.size)), store.dtype
            )
        got = buf[:n].reshape(h, *blocks.shape, size * hd)
        np.take(by_block, blocks, axis=1, out=got, mode="clip")  # "raise" would buffer `out`
        return got.reshape(h, *blocks.shape[:-1], blocks.shape[-1] * size, hd)

    def _attend_decodes(
        self,
        keys: F32,
        values: F64,
        qq: F32,
        qs: F64,
        table: npt.NDArray[np.int64],
        ctxs: npt.NDArray[np.int64],
    ) -> F64:
        """One new token each for a group of sequences, in one set of array calls.

        ``table`` (sequences, blocks): each one's blocks, padded with block 0 past its
        own; positions past a context score -inf, so they weigh 0 and the sums stay the
        exact integers a sequence alone gets (per-sequence loops cost about 20 us a
        sequence a layer in numpy calls, half of a 32-sequence decode step).
        """
        ck, cv = self._gather(keys, table), self._gather(values, table)  # (h, g, width, hd)
        exact = qq[:, :, None] @ ck.transpose(0, 1, 3, 2)  # (h, g, 1, width): exact
        scores = exact.astype(np.float64)
        scores *= qs[:, :, None]
        past = np.arange(ck.shape[2]) >= ctxs[:, None]  # (g, width)
        if past.any():
            np.copyto(scores, -np.inf, where=past[:, None])
        att = _mix(scores, cv)[:, :, 0]  # (h, g, hd)
        return np.asarray(att.transpose(1, 0, 2).reshape(len(ctxs), self.d_model))

    # -- its own block tables (a step without labserve's) ---------------------------------------

    def _own_tables(self, batch: SeqBatch, counts: list[int]) -> list[list[int]]:
        own, size = self._own, self._block_size
        tables = []
        for seq_id, start, n in zip(batch.seq_ids, batch.starts, counts, strict=True):
            if start == 0:
                own.drop(seq_id)
            held = own.lengths.get(seq_id, 0)
            if held < start:
                raise ValueError(
                    f"sequence {seq_id} has {held} cached tokens, the step starts at {start}"
                )
            table = own.tables.setdefault(seq_id, [])
            need = -(-(start + n) // size) - len(table)
            if need > 0:
                if need > len(own.free):
                    self._grow_own(need - len(own.free))
                table += own.free[-need:]
                del own.free[-need:]
            own.lengths[seq_id] = start + n
            tables.append(table)
        return tables

    def _grow_own(self, blocks: int) -> None:
        """Double the store (at least ``blocks`` more), keeping what it holds."""
        size = self._block_size
        old_blocks = self._k[0].shape[1] // size if self._k else 0
        new_blocks = max(2 * old_blocks, old_blocks + blocks, 64)
        old_k, old_v = self._k, self._v
        self._alloc(new_blocks * size)
        for layer in range(len(old_k)):
            self._k[layer][:, : old_k[layer].shape[1]] = old_k[layer]
            self._v[layer][:, : old_v[layer].shape[1]] = old_v[layer]
        self._own.free += range(new_blocks - 1, old_blocks - 1, -1)

    # -- the hooks of the own-caches contract (unused under labserve: it owns the blocks) -------

    def free_sequences(self, seq_ids: Sequence[int]) -> None:
        """Drop the state of sequences that ended or were preempted."""
        for seq_id in seq_ids:
            self._own.drop(seq_id)

    def rollback_step(self, batch: SeqBatch) -> None:
        """Undo a step that raised: each sequence's cache back to before it."""
        for seq_id, start in zip(batch.seq_ids, batch.starts, strict=True):
            if seq_id not in self._own.tables:
                continue
            if start == 0:
                self._own.drop(seq_id)
            else:
                self._own.cut(seq_id, start, self._block_size)

    @property
    def num_cached_sequences(self) -> int:
        """Sequences whose state the model holds in its own tables (a test checks none leak)."""
        return len(self._own.tables)


class _Where:
    """Where a step's K/V are in the store: the new tokens' slots, and each context's.

    ``rows[i]``: sequence i's first row among the step's tokens. ``decodes``: the
    sequences with one new token, in groups of similar lengths, each ``(their rows, their
    blocks padded to the group's longest with block 0, their contexts)``; a group's
    padding adds at most ``_PAD_BLOCKS`` blocks in all.
    ``prefills``: the others; ``runs[i]``: the first slot of one's context when its table
    is consecutive blocks (read as a view), else -1 (its ``tables[i]`` are gathered).
    """

    __slots__ = ("decodes", "new_slots", "prefills", "rows", "runs", "tables")

    def __init__(
        self,
        tables: Sequence[Sequence[int]],
        block_size: int,
        positions: npt.NDArray[np.int64],
        starts: Sequence[int],
        counts: list[int],
    ) -> None:
        lengths = np.fromiter(map(len, tables), np.int64, len(tables))
        blocks = np.fromiter(itertools.chain.from_iterable(tables), np.int64, int(lengths.sum()))
        heads = np.cumsum(lengths) - lengths  # each table's first block in `blocks`
        n = np.asarray(counts, np.int64)
        first = np.cumsum(n) - n  # each sequence's first row among the step's tokens
        self.rows = first.tolist()
        block_of = np.repeat(heads, n) + positions // block_size  # each new token's block
        self.new_slots = blocks[block_of] * block_size + positions % block_size
        ctxs = np.asarray(starts, np.int64) + n
        need = -(-ctxs // block_size)  # the blocks a context covers
        one = n == 1
        self.decodes = [
            self._padded(blocks, heads[g], need[g], ctxs[g], first[g])
            for g in _groups(np.flatnonzero(one), need[one], _PAD_BLOCKS)
        ]
        self.prefills = np.flatnonzero(~one).tolist()
        self.tables = {i: blocks[heads[i] : heads[i] + need[i]] for i in self.prefills}
        self.runs = {i: self._run(t, block_size) for i, t in self.tables.items()}

    @staticmethod
    def _padded(
        blocks: npt.NDArray[np.int64],
        heads: npt.NDArray[np.int64],
        need: npt.NDArray[np.int64],
        ctxs: npt.NDArray[np.int64],
        rows: npt.NDArray[np.int64],
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        width = np.arange(int(need.max()))
        inside = width < need[:, None]
        table = np.where(inside, blocks[np.where(inside, heads[:, None] + width, 0)], 0)
        return rows, table, ctxs

    @staticmethod
    def _run(table: npt.NDArray[np.int64], block_size: int) -> int:
        if table.size and table[-1] - table[0] == table.size - 1 and np.all(np.diff(table) == 1):
            return int(table[0]) * block_size
        return -1


def _groups(
    rows: npt.NDArray[np.int64], need: npt.NDArray[np.int64], pad: int
) -> list[npt.NDArray[np.int64]]:
    """``rows`` in groups of similar ``need``, longest first, each padded by at most ``pad``."""
    order = np.argsort(-need, kind="stable")
    needs = need[order].tolist()
    groups, first, padded = [], 0, 0
    for i in range(1, len(needs)):
        padded += needs[first] - needs[i]
        if padded > pad:
            groups.append(rows[order[first:i]])
            first, padded = i, 0
    return [*groups, rows[order[first:]]] if needs else []
