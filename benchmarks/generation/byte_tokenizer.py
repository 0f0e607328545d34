"""A Hugging Face tokenizer folder whose ids are TinyLM's: a token per UTF-8 byte, id = byte.

Run with the clients' venv (it has ``tokenizers`` and ``transformers``; labserve's does not):
`benchmarks/.venv-clients/bin/python benchmarks/generation/byte_tokenizer.py DIR`. Built
offline from nothing but the 256 byte values: a BPE with no merges over GPT-2's byte-level
alphabet, so that guidellm and aiperf count a prompt's and a reply's tokens as TinyLM does
(``TinyLM.encode`` is ``text.encode("utf-8")``). Checks the round trip before it returns.
"""

from __future__ import annotations

import sys


def _byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (what ByteLevel pre-tokenizes to)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    kept += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in kept}
    spare = (b for b in range(256) if b not in chars)
    for n, b in enumerate(spare):
        chars[b] = chr(256 + n)
    return chars


def build(folder: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {char: b for b, char in _byte_chars().items()}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=core, model_max_length=1024).save_pretrained(folder)
    loaded = AutoTokenizer.from_pretrained(folder)
    sample = "A prompt, with ünïcode and\ttabs\n"
    ids = loaded.encode(sample)
    if ids != list(sample.encode("utf-8")) or loaded.decode(ids) != sample or len(loaded) != 256:
        raise SystemExit(f"{folder}: the tokenizer does not count bytes as TinyLM does: {ids}")


if __name__ == "__main__":
    build(sys.argv[1])
    print(sys.argv[1])
