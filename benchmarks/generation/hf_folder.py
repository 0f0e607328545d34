"""The two model folders of the `transformers serve` comparison, and labserve's wrapper of one.

``build(kind, folder)`` writes a seeded random model, offline, as a new user's folder would
hold it (``config.json``, ``model.safetensors``, a tokenizer): ``gpt2`` is issue 32's
``GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=256)``, ``llama`` a Llama of the
same width with grouped-query attention (4 heads, 2 K/V heads). Weights from
``torch.manual_seed(0)``. The tokenizer encodes as ``byte_tokenizer.py``'s (a token per byte,
256 ids: a 64-byte ASCII prompt is 64 tokens to both servers) but decodes each id to its one
printable stand-in character (GPT-2's byte alphabet) instead of the byte: a random model's
bytes are mostly not UTF-8, and both servers hold back text until it decodes, so with the
byte decoder a stream's chunks (and so its TTFT and ITL) were missing, for 6 of 40 requests
in a first try against `transformers serve`. Every token now adds one character on both
servers. Neither model has an end token, so every reply is exactly ``max_tokens`` long.

``FolderLM`` is what a user writes to serve a folder with labserve (``labserve serve
hf_folder:FolderLM``, the folder in ``$LABSERVE_HF_FOLDER``): a subclass of
:class:`labserve.lab.hf.HFDecoder` that loads it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from labserve.lab.hf import HFDecoder

KINDS = ("gpt2", "llama")


def _config(kind: str) -> Any:
    import transformers

    none = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    if kind == "gpt2":
        return transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=256, **none)
    if kind == "llama":
        return transformers.LlamaConfig(
            vocab_size=256,
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            **none,
        )
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def build(kind: str, folder: Path) -> Path:
    """Write the ``kind`` model and the byte tokenizer to ``folder`` (seeded: same bytes)."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(kind)).eval()
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    _tokenizer(folder)
    return folder


def _tokenizer(folder: Path) -> None:
    """Bytes in (an id per byte), one printable character per id out; checked."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    sys.path.insert(0, str(Path(__file__).parent))
    from byte_tokenizer import _byte_chars

    vocab = {char: b for b, char in _byte_chars().items()}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.Fuse()  # each id its stand-in character: never held back
    PreTrainedTokenizerFast(tokenizer_object=core, model_max_length=1024).save_pretrained(folder)
    loaded = AutoTokenizer.from_pretrained(folder)
    sample = "some words of ascii"
    ids = loaded.encode(sample)
    if ids != list(sample.encode()) or len(loaded.decode(list(range(256)))) != 256:
        raise SystemExit(f"{folder}: the tokenizer is not a byte in, a character out: {ids}")


class FolderLM(HFDecoder):
    """The model folder in ``$LABSERVE_HF_FOLDER``, served by labserve (torch's one thread)."""

    def __init__(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = os.environ["LABSERVE_HF_FOLDER"]
        super().__init__(
            AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
        )


if __name__ == "__main__":
    print(build(sys.argv[1], Path(sys.argv[2])))
