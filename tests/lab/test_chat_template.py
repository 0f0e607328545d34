"""A chat to a model whose tokenizer has a chat template is rendered by that template.

A byte-level tokenizer (one id per byte, as TinyLM's) built offline with ``tokenizers``,
with and without a small Jinja template, on a seeded GPT-2 of 256 ids: no network.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

import labserve

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from labserve.lab.hf import HFDecoder  # noqa: E402

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "why?"},
]


def byte_tokenizer(template: str | None):
    """One id per UTF-8 byte (id = byte): a BPE without merges over the byte-level alphabet."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    kept += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in kept}
    for n, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + n)
    core = Tokenizer(models.BPE(vocab={c: b for b, c in chars.items()}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=core)
    tok.chat_template = template
    return tok


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=256, n_positions=256,
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def server():
    model = gpt2()
    runners = [
        labserve.Runner(HFDecoder(model, byte_tokenizer(TEMPLATE)), name="templated"),
        labserve.Runner(HFDecoder(model, byte_tokenizer(None)), name="plain"),
    ]
    srv = labserve.serve(runners, port=0)
    yield srv
    srv.stop()
    for r in runners:
        r.stop(timeout=10)


def chat(url: str, model: str) -> dict:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 2, "temperature": 0}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def test_the_decoder_renders_a_chat_by_its_tokenizers_template():
    decoder = HFDecoder(gpt2(), byte_tokenizer(TEMPLATE))
    pairs = [(m["role"], m["content"]) for m in MESSAGES]
    expected = "<|system|>be brief\n<|user|>hi\n<|assistant|>hello\n<|user|>why?\n<|assistant|>"
    assert decoder.apply_chat_template(pairs) == list(expected.encode())
    assert HFDecoder(gpt2(), byte_tokenizer(None)).apply_chat_template(pairs) is None


def test_a_chat_request_uses_the_template_where_the_model_has_one(server):
    templated = chat(server.url, "templated")["usage"]["prompt_tokens"]
    rendered = "<|system|>be brief\n<|user|>hi\n<|assistant|>hello\n<|user|>why?\n<|assistant|>"
    assert templated == len(rendered.encode())
    # Without one, labserve's own lines: "role: content\n" each, then "assistant: ".
    plain = chat(server.url, "plain")["usage"]["prompt_tokens"]
    lines = "system: be brief\nuser: hi\nassistant: hello\nuser: why?\nassistant: "
    assert plain == len(lines.encode())
