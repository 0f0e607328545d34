"""64 concurrent streams through the ``openai`` client: each one's tokens as its prompt alone.

Issue 23's first target: TinyLM served by ``labserve serve`` in another process; 64 threads
each stream a greedy completion of its own prompt (``max_tokens`` 64, ``ignore_eos``) at once
through the official client; then each prompt alone. Every stream must carry exactly its solo
text, none lost, and ``usage`` must count its prompt and its tokens.

    .venv/bin/python benchmarks/generation/streams64.py
"""

from __future__ import annotations

import concurrent.futures

import openai
from tinylm_server import tinylm_server  # this folder's (the script's folder is on sys.path)

N, TOKENS = 64, 64


def one(base_url: str, prompt: str) -> tuple[str, int, int]:
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=120)
    text, usage = [], None
    for chunk in client.completions.create(
        model="tinylm",
        prompt=prompt,
        max_tokens=TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    ):
        if chunk.choices:
            text.append(chunk.choices[0].text)
        usage = chunk.usage or usage
    assert usage is not None, "no usage chunk"
    return "".join(text), usage.prompt_tokens, usage.completion_tokens


def main() -> None:
    prompts = [f"stream {i}: " + "ab" * (i % 9) for i in range(N)]
    with tinylm_server() as base:
        url = f"{base}/v1"
        with concurrent.futures.ThreadPoolExecutor(N) as pool:
            together = list(pool.map(lambda p: one(url, p), prompts))
        alone = [one(url, p) for p in prompts]
    same = sum(t[0] == a[0] for t, a in zip(together, alone, strict=True))
    usage_ok = sum(
        t[1] == len(p.encode()) and t[2] == TOKENS == len(t[0].encode())
        for t, p in zip(together, prompts, strict=True)
    )
    print(
        f"{N} concurrent streams: {same}/{N} identical to their prompt alone, "
        f"{usage_ok}/{N} with usage counting prompt and {TOKENS} tokens"
    )


if __name__ == "__main__":
    main()
