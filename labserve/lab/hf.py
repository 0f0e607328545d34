"""A Hugging Face causal language model served by continuous batching: the page of code.

labserve owns the schedule, the KV blocks (which block is whose), sampling, stop rules and
each sequence's life; this class owns the tensors. A step is one forward over all of its
sequences, decodes and prefill chunks together, with the K/V kept in labserve's blocks: a
:class:`~labserve.lab.generation.paged_kv.PagedKVCache` (a transformers ``Cache``) writes
each new token's K/V at its slot and reads a sequence's context through its block table,
with per-token ``position_ids`` and a prepared 4-D mask. Needs torch and transformers (the
``text`` extra, transformers pinned to the version this was tested with); imported only
when a model is wrapped.

>>> from transformers import AutoModelForCausalLM, AutoTokenizer   # doctest: +SKIP
>>> lm = labserve.Runner(HFDecoder(AutoModelForCausalLM.from_pretrained(path),
...                                AutoTokenizer.from_pretrained(path)), name="lm")
>>> lm.generate.run("Once upon a time", max_tokens=20, temperature=0).text  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from labserve.generation.batch import SeqBatch
from labserve.lab.generation.own_blocks import OwnBlocks
from labserve.runtime.runnable import Runnable, method

__all__ = ["HFDecoder"]

OWN_BLOCK_SIZE = 16
"""Positions a block holds when the decoder keeps its own block tables (see the class)."""


class HFDecoder(Runnable):
    """Serve ``model`` (a transformers causal LM) with ``tokenizer`` (None: token-id prompts).

    K/V live in labserve's blocks: the runtime calls :meth:`allocate_kv` once, then hands
    every step each sequence's block table. A runtime (or :func:`~labserve.lab.steps.
    profile_steps`) that hands none gets the same batched step on tables the decoder keeps
    itself, in a pool that grows as needed; ``free_sequences`` and ``rollback_step`` act on
    those alone.

    Batched models: every layer full attention whose K/V go through ``Cache.update`` (GPT-2,
    Llama and its kin, grouped-query attention included). Sliding-window, chunked or linear
    attention layers and encoder-decoders cannot take the one 4-D mask a step gives: such a
    model is refused with a ``TypeError`` naming why.

    ``threads`` sets torch's intra-op thread count (process-wide: torch has one), 1 by
    default: the model shares the machine with labserve's event loop and the callers, and
    with torch's default (one thread per core) a step's threads wait on a busy core — steps
    of 0.7-2.3 s where 8 ms is typical were measured on 2 cores (issue 32). None leaves
    torch's setting as it is.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        max_model_len: int | None = None,
        *,
        threads: int | None = 1,
    ):
        import torch  # the extra, only when a model is wrapped

        if threads is not None:
            if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
                raise ValueError(f"threads must be an integer >= 1 or None, got {threads!r}")
            torch.set_num_threads(threads)
        config = model.config
        _check_batchable(config)
        if config._attn_implementation not in ("sdpa", "eager"):  # both take a 4-D mask
            model.set_attn_implementation("sdpa")
        self._torch = torch
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.vocab_size = int(config.vocab_size)
        eos = tokenizer.eos_token_id if tokenizer is not None else config.eos_token_id
        self.eos_token_id = eos if isinstance(eos, int) else None
        self.max_model_len = max_model_len or int(getattr(config, "max_position_embeddings", 0))
        heads = int(config.num_attention_heads)
        self._hidden = int(config.hidden_size)
        self._layers = int(config.num_hidden_layers)
        self._kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        self._head_dim = int(getattr(config, "head_dim", None) or self._hidden // heads)
        self._dtype = model.dtype
        self._cache: Any = None  # the PagedKVCache, from allocate_kv
        self._own: OwnBlocks | None = None  # tables the decoder keeps when none are handed
        from labserve.lab.generation.paged_kv import FORWARD_TOKENS

        self.forward_tokens = FORWARD_TOKENS
        """A forward's own cost in tokens' worth of work (when a step runs as two forwards)."""

    # -- text: what labserve asks of the model when prompts are strings ------------------------

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids (a model without a tokenizer takes token ids only)."""
        if self.tokenizer is None:
            raise TypeError("this HFDecoder has no tokenizer: send token ids")
        return list(self.tokenizer.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, or none without a tokenizer (labserve shows what each adds)."""
        return str(self.tokenizer.decode(list(ids))) if self.tokenizer is not None else ""

    def apply_chat_template(self, messages: Sequence[tuple[str, str]]) -> list[int] | None:
        """A chat's ids by the tokenizer's chat template, with the generation prompt added.

        None when the tokenizer has no ``chat_template``: labserve then encodes its own
        ``role: content`` lines. ``messages`` are (role, content) pairs.
        """
        tokenizer = self.tokenizer
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            return None
        chat = [{"role": role, "content": content} for role, content in messages]
        # tokenize=False then encode without special tokens: the template writes any BOS
        # itself, and the text form is one return type across transformers releases.
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))

    # -- the paged-KV declaration ---------------------------------------------------------------

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token's K and V take over all layers (sizes the pool from a budget)."""
        itemsize = self._torch.empty((), dtype=self._dtype).element_size()
        return 2 * self._layers * self._kv_heads * self._head_dim * itemsize

    def allocate_kv(self, num_blocks: int, block_size: int) -> list[Any]:
        """Allocate the K/V pool; return its tensors (their ``nbytes`` are the KV memory).

        Per layer a K and a V of ``[num_blocks * block_size, kv_heads, head_dim]`` in the
        model's dtype; a token's K/V are a row of each.

        Raises:
            ValueError: ``num_blocks`` or ``block_size`` below 1.
        """
        from labserve.lab.generation.paged_kv import PagedKVCache

        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self._cache = PagedKVCache(
            self._layers, num_blocks * block_size, self._kv_heads, self._head_dim, self._dtype
        )
        self._own = None
        return list(self._cache.tensors)

    # -- the step --------------------------------------------------------------------------------

    @method(generative=True, max_num_seqs=16, max_num_batched_tokens=512)
    def generate(self, batch: SeqBatch) -> np.ndarray:
        """The next-token logits of each sequence that samples, in the batch's order.

        One forward, or two when the step's decodes and chunks are cheaper apart
        (:func:`~labserve.lab.generation.paged_kv.step_groups`).
        """
        if not len(batch):
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        tables, block_size = batch.block_tables, batch.block_size
        if not tables:
            tables, block_size = self._own_tables(batch)
        from labserve.lab.generation.paged_kv import plan_step, step_groups

        groups = step_groups(
            batch.tokens, batch.starts, hidden_size=self._hidden, forward_tokens=self.forward_tokens
        )
        parts = []
        for rows in groups:
            plan = plan_step(
                [batch.tokens[i] for i in rows],
                [batch.starts[i] for i in rows],
                [batch.samples[i] for i in rows],
                [tables[i] for i in rows],
                block_size,
                hidden_size=self._hidden,
                dtype=self._dtype,
            )
            parts.append(self._forward(plan))
        if self._own is not None and not batch.block_tables:
            self._own.ran(batch)
        if len(parts) == 1:
            return parts[0]
        # Each group's rows are its sampling sequences in step order: put them back in place.
        order = [i for rows in groups for i in rows if batch.samples[i]]
        picked: np.ndarray = np.concatenate(parts)[np.argsort(order)]
        return picked

    def _forward(self, plan: Any) -> np.ndarray:
        """Run the model on ``plan``; the sampled rows' logits as float32."""
        torch, cache = self._torch, self._cache
        cache.bind(plan)
        try:
            with torch.inference_mode():
                out = self.model(
                    input_ids=plan.input_ids,
                    position_ids=plan.position_ids,
                    attention_mask=plan.mask,
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=plan.keep,
                )
            cache.check_all_layers_ran()
        finally:
            cache.bind(None)
        rows = out.logits.reshape(-1, out.logits.shape[-1])
        picked: np.ndarray = rows.index_select(0, plan.pick).float().numpy()
        return picked

    def _own_tables(self, batch: SeqBatch) -> tuple[tuple[tuple[int, ...], ...], int]:
        """Block tables for a step that came without: the decoder's own, grown to fit."""
        if self._own is None:
            if self._cache is not None:
                raise RuntimeError(
                    "this step has no block tables, but the runtime allocated the K/V pool"
                    " (allocate_kv): it must hand every step its tables"
                )
            self.allocate_kv(64, OWN_BLOCK_SIZE)
            self._own = OwnBlocks(64, OWN_BLOCK_SIZE)
        need = self._own.blocks_needed(batch)  # raises before anything runs
        if need > self._own.num_free:
            grow = max(need - self._own.num_free, self._own.num_blocks)  # at least double
            self._cache.grow(grow * OWN_BLOCK_SIZE)
            self._own.add_blocks(grow)
        return self._own.extend(batch), OWN_BLOCK_SIZE

    # -- the hooks labserve calls when it hands no block tables ---------------------------------

    def free_sequences(self, seq_ids: Sequence[int]) -> None:
        """Return the blocks of sequences that ended or were preempted (own tables only)."""
        if self._own is not None:
            self._own.release(seq_ids)

    def rollback_step(self, batch: SeqBatch) -> None:
        """Undo a step that raised: each sequence's own table cut back to ``start`` tokens.

        A sequence at start 0 loses its table. With the runtime's tables nothing needs
        undoing: a retried step rewrites the same slots.
        """
        if self._own is not None and not batch.block_tables:
            self._own.cut(batch)


def _check_batchable(config: Any) -> None:
    """Raise TypeError unless every layer is full attention that one 4-D mask can steer."""
    if getattr(config, "is_encoder_decoder", False):
        raise TypeError("HFDecoder batches decoder-only models; this one is an encoder-decoder")
    kinds = set(getattr(config, "layer_types", None) or ())
    if kinds - {"full_attention"}:
        raise TypeError(
            f"HFDecoder batches full-attention layers only; this model has {sorted(kinds)}"
            " (a sliding, chunked or linear layer needs a mask or state of its own)"
        )
    if not kinds and getattr(config, "sliding_window", None):
        raise TypeError(
            f"HFDecoder batches full-attention layers only; this model attends over a sliding"
            f" window of {config.sliding_window} tokens"
        )
