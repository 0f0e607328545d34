"""A Hugging Face causal language model served by continuous batching: the page of code.

labserve owns the schedule, the KV budget's accounting, sampling, stop rules and each
sequence's life; this class owns the tensors: one ``past_key_values`` per sequence. A step
runs each of its sequences' new tokens (a prefill chunk, or the last token) through the
model with that sequence's cache, one sequence after another. That keeps the page short and
exact; fusing a step's rows into one call needs a paged-attention kernel (what vLLM adds),
and is where a GPU's batching gains come from. Needs torch and transformers (the ``text``
extra); imported only when a model is wrapped.

>>> from transformers import AutoModelForCausalLM, AutoTokenizer   # doctest: +SKIP
>>> lm = labserve.Runner(HFDecoder(AutoModelForCausalLM.from_pretrained(path),
...                                AutoTokenizer.from_pretrained(path)), name="lm")
>>> lm.generate.run("Once upon a time", max_tokens=20, temperature=0).text  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np

from labserve.generation.batch import SeqBatch
from labserve.runtime.runnable import Runnable, method

__all__ = ["HFDecoder"]


class HFDecoder(Runnable):
    """Serve ``model`` (a transformers causal LM) with ``tokenizer`` (None: token-id prompts).

    ``threads`` sets torch's intra-op thread count (process-wide: torch has one), 1 by
    default: the model shares the machine with labserve's event loop and the callers, and
    with torch's default (one thread per core) a step's threads wait on a busy core — steps
    of 0.7-2.3 s where 8 ms is typical were measured on 2 cores (issue 32). None leaves
    torch's setting as it is.

    ``rollback_step`` cuts each cache back by transformers' ``crop``, which some caches
    cannot do (a sliding window past its size, a recurrent state whose past is not
    recorded): such a sequence's cache is dropped, and its next step raises for it alone.
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
        self._torch = torch
        self.model = model.eval()
        self.tokenizer = tokenizer
        config = model.config
        self.vocab_size = int(config.vocab_size)
        eos = tokenizer.eos_token_id if tokenizer is not None else config.eos_token_id
        self.eos_token_id = eos if isinstance(eos, int) else None
        self.max_model_len = max_model_len or int(getattr(config, "max_position_embeddings", 0))
        self._past: dict[int, Any] = {}  # each sequence's cache (a transformers Cache)
        self._lost: dict[int, str] = {}  # sequences whose cache a rollback could not cut: why
        # transformers 5 names the cache argument ``cache``; earlier ones ``past_key_values``.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    # -- text: what labserve asks of the model when prompts are strings ------------------------

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids (a model without a tokenizer takes token ids only)."""
        if self.tokenizer is None:
            raise TypeError("this HFDecoder has no tokenizer: send token ids")
        return list(self.tokenizer.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, or none without a tokenizer (labserve shows what each adds)."""
        return str(self.tokenizer.decode(list(ids))) if self.tokenizer is not None else ""

    # -- the step --------------------------------------------------------------------------------

    @method(generative=True, max_num_seqs=16, max_num_batched_tokens=512)
    def generate(self, batch: SeqBatch) -> np.ndarray:
        """Each sequence's new tokens through the model; the next-token logits of each sampler."""
        torch = self._torch
        for seq_id, _, start, _ in batch:  # before any runs: a step that raises runs none
            self._check_cache(seq_id, start)
        rows = []
        with torch.inference_mode():
            for seq_id, tokens, start, samples in batch:
                past = self._past.get(seq_id) if start else None
                ids = torch.as_tensor(tokens, dtype=torch.long)[None]
                out = self.model(input_ids=ids, use_cache=True, **{self._cache_arg: past})
                self._past[seq_id] = out[self._cache_arg]
                if samples:
                    rows.append(out.logits[0, -1].float().numpy())
        return np.stack(rows) if rows else np.zeros((0, self.vocab_size))

    # -- the hooks labserve calls ------------------------------------------------------------------

    def free_sequences(self, seq_ids: Sequence[int]) -> None:
        """Drop the caches of sequences that ended or were preempted."""
        for seq_id in seq_ids:
            self._past.pop(seq_id, None)
            self._lost.pop(seq_id, None)

    def rollback_step(self, batch: SeqBatch) -> None:
        """Undo a step that raised: each sequence's cache cut back to its ``start`` tokens.

        A sequence at start 0 loses its cache. Each layer is cut on its own, as a step can
        raise inside the model after some of a sequence's layers took its new tokens.
        """
        for seq_id, _, start, _ in batch:
            past = self._past.get(seq_id)
            if past is None:
                continue
            if start == 0:
                del self._past[seq_id]
                continue
            try:
                _crop(past, start)
            # transformers' refusals: a cache that cannot go back (see the class docstring).
            except (RuntimeError, ValueError) as exc:
                del self._past[seq_id]
                self._lost[seq_id] = f"a rollback could not cut it back to {start} tokens: {exc}"

    def _check_cache(self, seq_id: int, start: int) -> None:
        """Raise unless the sequence's cache holds exactly the ``start`` tokens before it."""
        if start == 0:
            self._lost.pop(seq_id, None)
            return
        past = self._past.get(seq_id)
        if past is None:
            why = self._lost.get(seq_id, "none was kept")
            raise RuntimeError(f"sequence {seq_id} has no cache for its {start} tokens ({why})")
        held = int(past.get_seq_length())
        if held != start:
            raise RuntimeError(
                f"sequence {seq_id}'s cache holds {held} tokens; its step starts at {start}"
            )


def _crop(past: Any, start: int) -> None:
    """Cut each layer of ``past`` (a transformers 5 Cache) back to ``start`` tokens.

    transformers 5 refuses ``crop(n)`` with n > 0 (the old "keep n tokens"); it takes the
    number of tokens to remove, negated.
    """
    for layer in past.layers:
        length = getattr(layer, "get_seq_length", None)  # a DummyLayer holds none
        if length is None:
            continue
        extra = int(length()) - start
        if extra > 0:
            layer.crop(-extra)
