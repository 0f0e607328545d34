"""K/V in labserve's blocks, read and written by a transformers model through its Cache API.

One forward runs a whole step: every sequence's new tokens (decodes and prefill chunks) in
one ``[rows, width]`` grid, either packed (one row, the sequences' tokens end to end) or
padded (a row per sequence, as wide as the longest), whichever computes less (see
:func:`plan_step`). The model sees per-token ``position_ids`` and a prepared 4-D mask, so it
never asks the cache how long a sequence is; each attention layer calls
:meth:`PagedKVCache.update`, which writes the new tokens' K/V at their slots in the pool and
hands back, per row, the K/V of the row's context gathered through its block table. A
position ``p`` of a sequence lives at slot ``table[p // block_size] * block_size + p %
block_size`` (:class:`~labserve.generation.batch.SeqBatch`'s slot mapping).

Needs torch and transformers (the ``text`` extra); imported only when a model is wrapped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from transformers.cache_utils import Cache

__all__ = ["FORWARD_TOKENS", "PagedKVCache", "StepPlan", "plan_step", "step_groups"]

_Ints = npt.NDArray[np.int64]


@dataclass(frozen=True)
class StepPlan:
    """One step's forward, laid out: what the model gets and where K/V go and come from.

    ``rows x width`` query tokens (``input_ids``, ``position_ids``); ``write_index`` picks the
    real ones out of the flattened grid and ``write_slots`` is where their K/V go;
    ``read_slots[r]`` lists the slots row ``r`` attends over (padding points at slot 0 and is
    masked); ``mask`` is ``[rows, 1, width, context]``, 0 where a token may attend and the
    dtype's lowest value where not; ``keep`` are the grid columns whose logits are computed
    and ``pick`` the flat ``(row, kept column)`` index of each sampling sequence's last token.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    mask: torch.Tensor
    write_index: torch.Tensor
    write_slots: torch.Tensor
    read_slots: torch.Tensor
    keep: torch.Tensor
    pick: torch.Tensor
    packed: bool


def _context_slots(table: Sequence[int], length: int, block_size: int) -> _Ints:
    """The slots of positions ``0 .. length - 1`` through ``table``."""
    pos = np.arange(length, dtype=np.int64)
    return np.asarray(table, dtype=np.int64)[pos // block_size] * block_size + pos % block_size


def plan_step(
    tokens: Sequence[_Ints],
    starts: Sequence[int],
    samples: Sequence[bool],
    tables: Sequence[Sequence[int]],
    block_size: int,
    *,
    hidden_size: int,
    dtype: torch.dtype,
    layout: str | None = None,
) -> StepPlan:
    """Lay a step out packed or padded (``layout``), by default whichever does less work.

    The work is counted per layer as ``tokens * 6 * hidden_size + attended pairs`` (the
    projections and MLP cost about 12 hidden_size^2 multiply-adds a token; each query-key
    pair about 2 hidden_size): 32 decodes at context 128 pad (no waste, 4,096 pairs instead
    of 131,072 packed), a 64-token prefill chunk beside 31 decodes packs (95 tokens instead
    of 2,048 padded).

    Raises:
        ValueError: ``layout`` is neither None, ``"packed"`` nor ``"padded"``.
    """
    if layout not in (None, "packed", "padded"):
        raise ValueError(f"layout must be None, 'packed' or 'padded', got {layout!r}")
    lens = np.array([len(t) for t in tokens], dtype=np.int64)
    ctx = lens + np.asarray(starts, dtype=np.int64)
    if layout is None:
        packed_work, padded_work = _work(lens, ctx, 6 * hidden_size)
        layout = "packed" if packed_work < padded_work else "padded"
    lay = _packed if layout == "packed" else _padded
    return lay(tokens, starts, samples, tables, block_size, lens, ctx, dtype)


FORWARD_TOKENS = 40
"""A forward's own cost in tokens' worth of :func:`plan_step`'s work: transformers' Python
per call and layer, about 5 ms of CPU for GPT-2 (4 layers of 256) on this machine, against
0.08 us a unit of work (2026-12-04)."""


def step_groups(
    tokens: Sequence[_Ints],
    starts: Sequence[int],
    *,
    hidden_size: int,
    forward_tokens: int = FORWARD_TOKENS,
) -> list[list[int]]:
    """The step's sequences in one forward, or its decodes and its chunks in two.

    Packed, every token of a step attends over every sequence's context (the mask hides
    the others' but the pairs are computed); padded, every row is as wide as the longest
    chunk. A prefill chunk beside many decodes is therefore dear either way: 31 decodes at
    context 100 beside a 64-token chunk cost 40.0 ms of CPU packed, 25.6 ms as two forwards
    (the decodes padded, the chunk alone), GPT-2 4 x 256, one thread. Split when the two
    forwards' work, plus ``forward_tokens`` tokens' worth for the second call, is less.
    Each group keeps the step's order.
    """
    lens = np.array([len(t) for t in tokens], dtype=np.int64)
    ctx = lens + np.asarray(starts, dtype=np.int64)
    decode = lens == 1
    everyone = list(range(len(lens)))
    if decode.all() or not decode.any():
        return [everyone]
    per_token = 6 * hidden_size
    whole = min(_work(lens, ctx, per_token))
    split = forward_tokens * per_token
    for part in (decode, ~decode):
        split += min(_work(lens[part], ctx[part], per_token))
    if split >= whole:
        return [everyone]
    return [np.flatnonzero(decode).tolist(), np.flatnonzero(~decode).tolist()]


def _work(lens: _Ints, ctx: _Ints, per_token: int) -> tuple[int, int]:
    """The work of a step laid out packed and padded (see :func:`plan_step`)."""
    packed = int(lens.sum()) * (per_token + int(ctx.sum()))
    padded = len(lens) * int(lens.max()) * (per_token + int(ctx.max()))
    return packed, padded


def _mask(
    q_seq: _Ints, q_pos: _Ints, kv_seq: _Ints, kv_pos: _Ints, dtype: torch.dtype
) -> torch.Tensor:
    """``[rows, 1, width, context]``: a token attends its own sequence's earlier positions."""
    allowed = (q_seq[:, :, None] == kv_seq[:, None, :]) & (kv_pos[:, None, :] <= q_pos[:, :, None])
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(torch.from_numpy(~allowed), torch.finfo(dtype).min)
    return mask[:, None]


def _packed(
    tokens: Sequence[_Ints],
    starts: Sequence[int],
    samples: Sequence[bool],
    tables: Sequence[Sequence[int]],
    block_size: int,
    lens: _Ints,
    ctx: _Ints,
    dtype: torch.dtype,
) -> StepPlan:
    """One row: the sequences' new tokens end to end, attending over their contexts end to end."""
    seq = np.arange(len(lens), dtype=np.int64)
    q_pos = np.concatenate(
        [s + np.arange(n, dtype=np.int64) for s, n in zip(starts, lens, strict=True)]
    )
    kv_pos = np.concatenate([np.arange(c, dtype=np.int64) for c in ctx])
    # Each context's slots once: its new tokens' slots are its tail.
    slots = [_context_slots(t, int(c), block_size) for t, c in zip(tables, ctx, strict=True)]
    write = np.concatenate([c[s:] for c, s in zip(slots, starts, strict=True)])
    read = np.concatenate(slots)
    last = np.cumsum(lens) - 1
    keep = last[np.asarray(samples, dtype=bool)]
    mask = _mask(
        np.repeat(seq, lens)[None], q_pos[None], np.repeat(seq, ctx)[None], kv_pos[None], dtype
    )
    return StepPlan(
        input_ids=torch.from_numpy(np.concatenate(tokens).astype(np.int64))[None],
        position_ids=torch.from_numpy(q_pos)[None],
        mask=mask,
        write_index=torch.arange(int(lens.sum())),
        write_slots=torch.from_numpy(write),
        read_slots=torch.from_numpy(read)[None],
        keep=torch.from_numpy(keep),
        pick=torch.arange(len(keep)),
        packed=True,
    )


def _padded(
    tokens: Sequence[_Ints],
    starts: Sequence[int],
    samples: Sequence[bool],
    tables: Sequence[Sequence[int]],
    block_size: int,
    lens: _Ints,
    ctx: _Ints,
    dtype: torch.dtype,
) -> StepPlan:
    """A row per sequence, padded on the right to the widest; contexts padded to the longest."""
    n_rows, width, longest = len(lens), int(lens.max()), int(ctx.max())
    ids = np.zeros((n_rows, width), dtype=np.int64)
    q_pos = np.zeros((n_rows, width), dtype=np.int64)
    q_seq = np.full((n_rows, width), -1, dtype=np.int64)  # padding attends nothing
    kv_seq = np.full((n_rows, longest), -2, dtype=np.int64)
    read = np.zeros((n_rows, longest), dtype=np.int64)
    write = []
    for r, (t, s, n, c) in enumerate(zip(tokens, starts, lens, ctx, strict=True)):
        ids[r, :n] = t
        q_pos[r, :n] = s + np.arange(n)
        q_seq[r, :n] = r
        kv_seq[r, :c] = r
        read[r, :c] = _context_slots(tables[r], int(c), block_size)
        write.append(read[r, s:c])
    kv_pos = np.broadcast_to(np.arange(longest, dtype=np.int64), (n_rows, longest))
    real = (np.arange(width)[None] < lens[:, None]).reshape(-1)
    return StepPlan(
        input_ids=torch.from_numpy(ids),
        position_ids=torch.from_numpy(q_pos),
        mask=_mask(q_seq, q_pos, kv_seq, kv_pos, dtype),
        write_index=torch.from_numpy(np.flatnonzero(real)),
        write_slots=torch.from_numpy(np.concatenate(write)),
        read_slots=torch.from_numpy(read),
        keep=torch.from_numpy(lens - 1)[:, None],  # each row's last token
        pick=torch.from_numpy(np.flatnonzero(np.asarray(samples, dtype=bool))),
        packed=False,
    )


class PagedKVCache(Cache):
    """A transformers ``Cache`` whose K/V live in a pool of slots that labserve's blocks index.

    Each layer holds a K and a V tensor of ``[num_slots, kv_heads, head_dim]``: a slot is a
    row, so writing a step's tokens and gathering a row's context are single index
    operations. :meth:`bind` hands it the step's :class:`StepPlan` before the forward;
    transformers calls :meth:`update` once per attention layer. Not thread-safe: one step
    at a time (labserve runs a generative method's steps one after another).
    """

    def __init__(
        self, num_layers: int, num_slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype
    ):
        super().__init__(layers=[])
        shape = (num_slots, kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self._plan: StepPlan | None = None
        self._ran: set[int] = set()  # layers whose update ran in the bound step

    @property
    def tensors(self) -> list[torch.Tensor]:
        """Every tensor that holds K/V (their ``nbytes`` add up to the pool's memory)."""
        return [*self.keys, *self.values]

    @property
    def num_slots(self) -> int:
        """Token positions the pool holds."""
        return int(self.keys[0].shape[0]) if self.keys else 0

    def bind(self, plan: StepPlan | None) -> None:
        """The step the next forward runs (None after it)."""
        self._plan = plan
        self._ran.clear()

    def check_all_layers_ran(self) -> None:
        """Raise unless every layer's K/V went through :meth:`update` in the bound step.

        A model whose layers keep state elsewhere (a recurrent layer, a cache of its own)
        would otherwise give logits that ignore every earlier step.
        """
        missing = sorted(set(range(len(self.keys))) - self._ran)
        if missing:
            raise RuntimeError(
                f"layers {missing} never stored K/V in labserve's blocks: this model cannot be"
                " served on paged K/V"
            )

    def grow(self, slots: int) -> None:
        """``slots`` more positions in every layer's pool, the held K/V kept."""
        for pools in (self.keys, self.values):
            for i, pool in enumerate(pools):
                pools[i] = torch.cat([pool, pool.new_zeros((slots, *pool.shape[1:]))])

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's new K/V at their slots; return each row's context.

        The context comes back ``[rows, heads, context, head_dim]``, as transformers'
        attention takes it (padding reads slot 0, which the step's mask hides).
        """
        plan = self._plan
        if plan is None:
            raise RuntimeError("PagedKVCache.update called outside a step (bind a StepPlan first)")
        self._ran.add(layer_idx)
        return (
            self._write_read(self.keys[layer_idx], key_states, plan),
            self._write_read(self.values[layer_idx], value_states, plan),
        )

    @staticmethod
    def _write_read(pool: torch.Tensor, new: torch.Tensor, plan: StepPlan) -> torch.Tensor:
        rows, heads, width, dim = new.shape
        if pool.shape[1:] != (heads, dim):
            raise ValueError(
                f"the model's K/V are {heads} heads x {dim}; the pool was sized for"
                f" {pool.shape[1]} x {pool.shape[2]}"
            )
        flat = new.transpose(1, 2).reshape(rows * width, heads, dim)
        pool.index_copy_(0, plan.write_slots, flat.index_select(0, plan.write_index))
        context = plan.read_slots.shape[1]
        read = pool.index_select(0, plan.read_slots.reshape(-1))
        return read.view(rows, context, heads, dim).transpose(1, 2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The longest context of the bound step (the model gets positions, so reads none)."""
        return int(self._plan.read_slots.shape[1]) if self._plan is not None else 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        """Key length and offset of the bound step's mask (prepared: asked by no model here)."""
        return self.get_seq_length(layer_idx), 0
