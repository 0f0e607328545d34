"""TinyLM served by continuous batching over the OpenAI-compatible routes, with the real
``openai`` client (``max_retries=0``) over real sockets, as a user of ``labserve serve``.

Greedy decoding on TinyLM is batch-invariant: every concurrent stream must carry exactly
the tokens its prompt gets alone, with ``usage`` counting them.
"""

from __future__ import annotations

import concurrent.futures
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import labserve
from labserve.base.errors import StopTimeoutError
from labserve.lab.demo import TinyLM

openai = pytest.importorskip("openai")

PROMPTS = [f"stream {i} " + "xy" * (i % 5) for i in range(16)]


@pytest.fixture(scope="module")
def served():
    runner = labserve.Runner(TinyLM, name="tinylm", max_num_seqs=8)
    server = labserve.serve(runner, port=0)
    yield runner, server
    server.stop()
    runner.stop()


def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30)


def test_models_lists_the_runner(served):
    _, server = served
    with client(server) as c:
        assert [m.id for m in c.models.list()] == ["tinylm"]


def test_concurrent_streams_each_carry_their_solo_tokens_and_usage(served):
    runner, server = served
    solo = {p: runner.generate.run(p, max_tokens=20, temperature=0).text for p in PROMPTS}

    def one(prompt):
        with client(server) as c:
            chunks = list(
                c.completions.create(
                    model="tinylm",
                    prompt=prompt,
                    max_tokens=20,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        return text, chunks[-1].usage

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(one, PROMPTS))
    for prompt, (text, usage) in zip(PROMPTS, got, strict=True):
        assert text == solo[prompt]
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt.encode()), 20)


def test_a_chat_completion_and_a_stop(served):
    _, server = served
    with client(server) as c:
        whole = c.chat.completions.create(
            model="tinylm",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=12,
            temperature=0,
        )
        text = whole.choices[0].message.content
        assert whole.choices[0].finish_reason == "length" and len(text.encode()) == 12
        stop = text[4:6]
        cut = c.chat.completions.create(
            model="tinylm",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=12,
            temperature=0,
            stop=[stop],
        )
        assert cut.choices[0].finish_reason == "stop"
        assert cut.choices[0].message.content == text[: text.index(stop)]


def test_a_prompt_past_the_context_is_a_400_naming_the_limit(served):
    _, server = served
    with client(server) as c, pytest.raises(openai.BadRequestError, match="max_model_len"):
        c.completions.create(model="tinylm", prompt="z" * 1000, max_tokens=100)


def test_a_client_that_leaves_mid_stream_frees_its_sequence(served):
    runner, server = served
    before = runner.generate.stats().outcomes["cancelled"]
    with client(server) as c:
        stream = c.completions.create(
            model="tinylm", prompt="leave", max_tokens=800, temperature=0, stream=True
        )
        next(iter(stream))
        stream.close()
    deadline = time.monotonic() + 20
    while runner.generate.stats().outcomes["cancelled"] == before:
        assert time.monotonic() < deadline, "the sequence was never counted cancelled"
        time.sleep(0.02)
    while runner.generate.stats().kv_blocks_used:  # its KV blocks are freed, not leaked
        assert time.monotonic() < deadline, "the sequence's KV blocks were never freed"
        time.sleep(0.02)


def test_metrics_show_the_generator_as_vllm_names_it(served):
    runner, server = served
    runner.generate.run("metrics", max_tokens=4, temperature=0)
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    mine = {"runner": "tinylm", "method": "generate"}
    samples = {
        (s.name, s.labels.get("outcome"), s.labels.get("le")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if all(s.labels.get(k) == v for k, v in mine.items())
    }
    snap = runner.generate.stats()
    assert samples[("labserve_num_requests_running", None, None)] == snap.num_running
    assert samples[("labserve_num_requests_waiting", None, None)] == snap.num_waiting
    served_count = samples[("labserve_sequences_total", "served", None)]
    assert served_count == snap.outcomes["served"] >= 1
    assert samples[("labserve_time_to_first_token_seconds_count", None, None)] == served_count
    assert samples[("labserve_time_to_first_token_seconds_bucket", None, "+Inf")] == served_count
    assert samples[("labserve_generation_tokens_total", None, None)] == snap.output_tokens
    assert ("labserve_inter_token_latency_seconds_sum", None, None) in samples
    assert samples[("labserve_iteration_tokens_count", None, None)] >= 1


def test_the_scheduler_knobs_change_live_over_patch_config(served):
    runner, server = served
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {server.token}"}

    def call(method, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{server.url}/config", data, headers, method=method)
        with urllib.request.urlopen(req, timeout=10) as reply:
            return json.loads(reply.read())

    assert call("GET")["tinylm"]["generate"]["max_num_seqs"] == 8
    after = call("PATCH", {"tinylm": {"generate": {"max_num_seqs": 4, "strategy": "static"}}})
    assert after["tinylm"]["generate"]["max_num_seqs"] == 4
    assert runner.generate.config.strategy == "static"
    with pytest.raises(urllib.error.HTTPError) as bad:
        call("PATCH", {"tinylm": {"generate": {"max_num_seqs": 0}}})
    assert bad.value.code == 422 and "max_num_seqs" in bad.value.read().decode()
    call("PATCH", {"tinylm": {"generate": {"max_num_seqs": 8, "strategy": "continuous"}}})


def test_prefix_cache_counters_reach_stats_and_metrics_and_turn_off_over_patch(served):
    runner, server = served
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {server.token}"}
    prompt = "A shared system prompt, long enough for a few blocks of sixteen bytes. "
    for tail in ("one", "two"):
        runner.generate.run(prompt + tail, max_tokens=2, temperature=0)
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("runner") == "tinylm"
    }
    snap = runner.generate.stats()
    assert samples["labserve_prefix_cache_hits_total"] == snap.prefix_cache_hits >= 64
    assert samples["labserve_prefix_cache_queries_total"] == snap.prefix_cache_queries
    assert samples["labserve_kv_blocks_cached"] == snap.kv_blocks_cached > 0
    with urllib.request.urlopen(f"{server.url}/stats", timeout=10) as reply:
        assert '"prefix_cache_hit_rate"' in reply.read().decode()
    body = json.dumps({"tinylm": {"generate": {"enable_prefix_caching": False}}}).encode()
    req = urllib.request.Request(f"{server.url}/config", body, headers, method="PATCH")
    with urllib.request.urlopen(req, timeout=10) as reply:
        assert json.loads(reply.read())["tinylm"]["generate"]["enable_prefix_caching"] is False
    try:
        runner.generate.run(prompt + "three", max_tokens=2, temperature=0)  # applies at a step
        after = runner.generate.stats()
        assert after.kv_blocks_cached == 0 and after.prefix_cache_hits == snap.prefix_cache_hits
    finally:
        runner.generate.configure(enable_prefix_caching=True)


class SlowLM(TinyLM):
    """TinyLM at 5 ms a step: a long generation lasts long enough to leave in the middle."""

    @labserve.method(generative=True, max_num_seqs=8)
    def generate(self, batch):
        time.sleep(0.005)
        return self._step(batch)


@pytest.fixture
def slow():
    runner = labserve.Runner(SlowLM, name="slow")
    server = labserve.serve(runner, port=0)
    yield runner, server
    server.stop()
    runner.stop()


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
def test_a_client_that_leaves_before_its_whole_reply_frees_its_sequence(slow, chat):
    runner, server = slow
    path, own = (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "leave"}]})
        if chat
        else ("/v1/completions", {"prompt": "leave"})
    )
    body = json.dumps({"model": "slow", "max_tokens": 1000, "temperature": 0, **own}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()

    def steps():
        return len(runner.generate.stats().steps.start_s)

    deadline = time.monotonic() + 20
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head + body)
        while steps() < 5:
            assert time.monotonic() < deadline, "the generation never started"
            time.sleep(0.005)
    while (outcomes := runner.generate.stats().outcomes)["cancelled"] == 0:
        assert outcomes["served"] == 0, "it ran to max_tokens: it was never withdrawn"
        assert time.monotonic() < deadline, "the sequence was never counted cancelled"
        time.sleep(0.02)
    after = runner.generate.stats()
    assert after.outcomes["served"] == 0 and after.num_running == after.num_waiting == 0
    # Withdrawn, not run to max_tokens: it stopped well short, and no step started since
    # (the step in flight when it was withdrawn may still be recorded after it).
    assert 5 <= after.output_tokens <= 500
    time.sleep(0.1)
    later = runner.generate.stats().steps.start_s
    assert len(later) <= len(after.steps.start_s) + 1
    assert all(t <= after.time_s for t in later)


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**64 - 1])
def test_any_seed_the_route_takes_samples(served, seed):
    # Needs the sampler to take every seed the route does (-1 was a 500: numpy's RNG
    # refuses negative seeds). A seed gives the same text each time.
    _, server = served
    with client(server) as c:
        texts = [
            c.completions.create(
                model="tinylm", prompt="seeded", max_tokens=8, temperature=1, seed=seed
            )
            .choices[0]
            .text
            for _ in range(2)
        ]
    assert texts[0] == texts[1] and len(texts[0].encode()) == 8


def test_a_lone_surrogate_in_a_prompt_is_a_400_not_a_500(served):
    runner, server = served
    before = runner.generate.stats().outcomes
    body = json.dumps({"model": "tinylm", "prompt": "x\ud800", "max_tokens": 4})
    request = urllib.request.Request(
        f"{server.url}/v1/completions",
        body.encode(),
        {"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 400
    error = json.loads(info.value.read())["error"]
    assert "lone surrogate ('\\ud800' at character 1)" in error["message"]
    assert error["param"] == "prompt"
    assert runner.generate.stats().outcomes == before  # refused before admission


def test_a_runner_stopped_before_its_server_ends_each_stream_with_an_error_event(slow):
    # What `labserve serve` does on SIGTERM: the runner first, then the server, draining.
    runner, server = slow
    body = {"model": "slow", "prompt": "go", "max_tokens": 900, "stream": True}
    events: list[str] = []
    started = threading.Event()

    def read():
        url = f"{server.url}/v1/completions"
        with httpx.stream("POST", url, json=body, timeout=30) as reply:
            for line in reply.iter_lines():  # raises if the connection is cut mid-reply
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    started.set()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reading = pool.submit(read)
        assert started.wait(20)
        with pytest.raises(StopTimeoutError):
            runner.stop(timeout=0.1)  # 900 tokens at 5 ms a step: it cannot drain in time
        server.stop(drain_s=5)
        reading.result(timeout=20)
    assert "[DONE]" not in events and len(events) < 900
    assert json.loads(events[-1])["error"]["code"] == "RunnerStoppedError"
