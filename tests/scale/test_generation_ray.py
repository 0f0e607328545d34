"""Generation on Ray Serve: TinyLM on two replicas beside the same model on the kernel server.

One application for the whole module (Ray deploys slowly on two shared cores). Greedy
TinyLM is batch-invariant, so every answer through Ray's proxy or a handle must carry the
tokens the kernel server's gives, and the OpenAI routes must answer alike (status, JSON,
the headers a client reads, the SSE events) with only the ids (a per-process counter) told
apart. The real ``openai`` client drives both.
"""

# ruff: noqa: E501 (the cases read as a table, one a line)

from __future__ import annotations

import concurrent.futures
import json
import re
import time

import pytest

import labserve
import labserve.ray
from labserve.base.errors import ConfigError, LengthLimitError
from labserve.lab.demo import TinyLM
from labserve.server import serve

openai = pytest.importorskip("openai")

LIMIT = 4096
SETTINGS = {"max_num_seqs": 8, "max_body_bytes": LIMIT}
JSON_TYPE = {"Content-Type": "application/json"}
PROMPTS = [f"ray {i} " + "ab" * (i % 4) for i in range(8)]


ROUTED = "/routed"
"""Where the prefix-routed application serves (its OpenAI routes through its ingress)."""


@pytest.fixture(scope="module")
def both(ray_cluster):
    app = labserve.ray.deploy(TinyLM, name="lm", num_replicas=2, **SETTINGS)
    runner = labserve.Runner(TinyLM, name="lm", max_num_seqs=8)
    server = serve(runner, max_body_bytes=LIMIT)
    yield {"app": app, "runner": runner, "tornado": server.port, "ray": ray_cluster.port}
    server.stop()
    runner.stop()
    app.stop()


@pytest.fixture(scope="module")
def routed(both):
    # The same runner name ("lm": the same model name in every answer) in its own
    # application, under its own route prefix beside the first one.
    app = labserve.ray.deploy(
        TinyLM,
        name="lm",
        app_name="routed",
        num_replicas=2,
        route_prefix=ROUTED,
        router="prefix",
        num_kv_blocks=96,  # a start-time setting: each replica's pool starts at this size
        **SETTINGS,
    )
    yield app
    app.stop()


@pytest.fixture(params=["direct", "ingress"])
def through(request, both):
    """Where a request goes through Ray's proxy: the path prefix to put before a route."""
    if request.param == "ingress":
        request.getfixturevalue("routed")
        return ROUTED
    return ""


def body(**fields):
    return json.dumps(fields).encode()


COMPLETION = {"model": "lm", "prompt": "Once", "max_tokens": 6, "temperature": 0}
CHAT = {
    "model": "lm",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 6,
    "temperature": 0,
}
CASES = [
    # (name, method, path, body, headers, expected status)
    ("models", "GET", "/v1/models", b"", {}, 200),
    ("completion", "POST", "/v1/completions", body(**COMPLETION), JSON_TYPE, 200),
    ("completion stream", "POST", "/v1/completions", body(**COMPLETION, stream=True, stream_options={"include_usage": True}), JSON_TYPE, 200),
    ("chat", "POST", "/v1/chat/completions", body(**CHAT), JSON_TYPE, 200),
    ("chat stream", "POST", "/v1/chat/completions", body(**CHAT, stream=True), JSON_TYPE, 200),
    ("a stop", "POST", "/v1/completions", body(**COMPLETION, stop=["e"]), JSON_TYPE, 200),
    ("seeded", "POST", "/v1/completions", body(**{**COMPLETION, "temperature": 0.9}, seed=7), JSON_TYPE, 200),
    ("no model", "POST", "/v1/completions", body(**{**COMPLETION, "model": "nope"}), JSON_TYPE, 404),
    ("past the context", "POST", "/v1/completions", body(**{**COMPLETION, "prompt": "z" * 1020, "max_tokens": 10}), JSON_TYPE, 400),
    ("n=2", "POST", "/v1/chat/completions", body(**CHAT, n=2), JSON_TYPE, 400),
    ("no messages", "POST", "/v1/chat/completions", body(model="lm"), JSON_TYPE, 400),
    ("bad JSON", "POST", "/v1/completions", b"{", JSON_TYPE, 400),
    ("text/plain", "POST", "/v1/completions", body(**COMPLETION), {"Content-Type": "text/plain"}, 415),
    ("oversized", "POST", "/v1/completions", b"{" * (LIMIT + 1), JSON_TYPE, 413),
    ("foreign Host", "POST", "/v1/completions", body(**COMPLETION), {**JSON_TYPE, "Host": "evil.example"}, 403),
    ("GET on completions", "GET", "/v1/completions", b"", {}, 405),
]  # fmt: skip

READ_HEADERS = ("content-type", "retry-after", "access-control-allow-origin", "cache-control")
_IDS = re.compile(rb'"id": "(chatcmpl|cmpl)-\d+"')


def answer(raw_http, port, method, path, data, headers):
    status, head, raw = raw_http(port, method, path, data, {"Host": "localhost", **headers})
    raw = _IDS.sub(rb'"id": "\1-N"', raw)  # a per-process counter on each server
    parsed = json.loads(raw) if raw and "json" in head.get("content-type", "") else raw
    return status, {k: head[k] for k in READ_HEADERS if k in head}, parsed


@pytest.mark.parametrize(
    ("method", "path", "data", "headers", "status"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_the_openai_routes_answer_alike_through_rays_proxy(
    both, through, raw_http, method, path, data, headers, status
):
    # "ingress": a prefix router's application, whose OpenAI routes go through its ingress.
    kernel = answer(raw_http, both["tornado"], method, path, data, headers)
    through_ray = answer(raw_http, both["ray"], method, through + path, data, headers)
    assert kernel[0] == status, kernel
    assert through_ray == kernel


def client(port, through=""):
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}{through}/v1", api_key="x", max_retries=0, timeout=60
    )


def test_the_openai_client_streams_every_prompt_through_the_proxy_as_the_kernel_does(both, through):
    def one(port, prompt, through=""):
        with client(port, through) as c:
            chunks = list(
                c.completions.create(
                    model="lm", prompt=prompt, max_tokens=12, temperature=0, stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},  # TinyLM's trained weights end texts
                )
            )  # fmt: skip
        return "".join(ch.choices[0].text for ch in chunks if ch.choices), chunks[-1].usage

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        kernel = list(pool.map(lambda p: one(both["tornado"], p), PROMPTS))
        through_ray = list(pool.map(lambda p: one(both["ray"], p, through), PROMPTS))
    assert through_ray == kernel
    assert all(u.completion_tokens == 12 for _, u in through_ray)
    with client(both["ray"], through) as c:
        assert [m.id for m in c.models.list()] == ["lm"]
        with pytest.raises(openai.BadRequestError, match="max_model_len"):
            c.completions.create(model="lm", prompt="z" * 1020, max_tokens=10)


def test_a_handle_generates_and_streams_what_the_runner_does(both):
    app, runner = both["app"], both["runner"]
    alone = runner.generate.run("Once upon", max_tokens=8, temperature=0)
    assert app.generate("Once upon", max_tokens=8, temperature=0) == alone
    with app.generate.stream("Once upon", max_tokens=8, temperature=0) as stream:
        pieces = list(stream)
    assert ("".join(pieces), stream.finish) == (alone.text, alone.finish)
    with pytest.raises(LengthLimitError, match="max_model_len"):
        app.generate("z" * 1020, max_tokens=10)


def test_a_live_change_reaches_every_replica_and_a_start_time_one_is_refused(both):
    app = both["app"]
    assert app.configure("generate", max_num_seqs=5).max_num_seqs == 5
    views = app.replica_generation_snapshots()
    deadline = time.monotonic() + 20
    while {v[0].config.max_num_seqs for v in views.values()} != {5} or len(views) < 2:
        assert time.monotonic() < deadline, views
        time.sleep(0.1)
        views = app.replica_generation_snapshots()
    with pytest.raises(ConfigError, match="num_kv_blocks must be left at"):
        app.configure("generate", num_kv_blocks=3)
    assert app.generation_configs()["generate"].max_num_seqs == 5
    app.configure("generate", max_num_seqs=8)


def test_the_merged_snapshot_counts_every_replicas_sequences_exactly(both):
    app = both["app"]
    app.reset_stats()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: app.generate(p, max_tokens=6, temperature=0), PROMPTS * 2))
    deadline = time.monotonic() + 20
    while True:  # the replicas report every 0.25 s
        merged = app.generation_snapshots()[0]
        views = [v[0] for v in app.replica_generation_snapshots().values()]
        if merged.outcomes["served"] == 16 and sum(v.outcomes["served"] for v in views) == 16:
            break
        assert time.monotonic() < deadline, (merged.outcomes, [v.outcomes for v in views])
        time.sleep(0.1)
    assert len(views) == 2 and all(v.outcomes["served"] > 0 for v in views), "one replica took all"
    assert merged.output_tokens == 16 * 6
    for name in ("ttft", "tpot", "e2e"):
        assert merged.histograms[name].count == 16
        assert merged.histograms[name].count == sum(v.histograms[name].count for v in views)
    assert 0 < merged.percentiles_ms["ttft"]["p50"] <= merged.percentiles_ms["e2e"]["p99"]


def test_a_dashboards_source_of_the_app_sees_the_merged_method_and_tunes_every_replica(both):
    app = both["app"]
    [source] = app.generation_sources(proxy_url=f"http://127.0.0.1:{both['ray']}")
    assert (source.name, source.model) == ("lm.generate", "lm")
    app.generate("seen", max_tokens=3)
    view = source.view()
    assert view.snapshot.outcomes["served"] >= 1 and view.config.max_num_seqs == 8
    assert source.configure(max_num_seqs=6).max_num_seqs == 6
    assert app.generation_configs()["generate"].max_num_seqs == 6
    app.configure("generate", max_num_seqs=8)


def test_the_dashboards_source_has_a_row_per_replica_and_one_change_reaches_both(both):
    app = both["app"]
    [source] = app.generation_sources(proxy_url=f"http://127.0.0.1:{both['ray']}")
    source.configure(max_num_seqs=7)
    deadline = time.monotonic() + 20
    while True:  # each replica takes the change at its next step and reports within 0.25 s
        view = source.view()
        if len(view.replicas) == 2 and {s.config.max_num_seqs for s in view.replicas.values()} == {
            7
        }:
            break
        assert time.monotonic() < deadline, {r: s.config for r, s in view.replicas.items()}
        time.sleep(0.1)
    assert view.stale == frozenset()
    assert (
        sum(s.outcomes["served"] for s in view.replicas.values())
        == view.snapshot.outcomes["served"]
    )
    app.configure("generate", max_num_seqs=8)


def served_by_replica(app, total):
    """Each replica's served count, once the replicas' reports add up to ``total``."""
    deadline = time.monotonic() + 20
    while True:  # the replicas report every 0.25 s
        views = app.replica_generation_snapshots()
        served = sorted(v[0].outcomes.get("served", 0) for v in views.values())
        if sum(served) == total:
            return served, views
        assert time.monotonic() < deadline, served
        time.sleep(0.1)


def tenants(name, n):
    """``n`` prompts' shared prefixes, each five blocks of 16 tokens or more."""
    return [f"{name} {t}: " + "a long shared system prompt " * 3 for t in range(n)]


def test_a_prefix_router_keeps_each_tenant_on_one_replica_through_a_handle(routed):
    app = routed
    assert app.router == "prefix" and app.ingress == "routed-ingress"
    app.reset_stats()
    prompts = tenants("handle tenant", 4)
    for i in range(12):  # one at a time: each replica's load stays even, affinity decides
        app.generate(prompts[i % 4] + f"question {i}", max_tokens=2, temperature=0)
    served, views = served_by_replica(app, 12)
    # Each tenant's first prompt misses, its next two hit on the replica that took it:
    # 8 of 12 requests hit their prefix, which a router blind to it does only by chance.
    assert all(n % 3 == 0 for n in served), served
    assert {v[0].kv_blocks_total for v in views.values()} == {96}
    merged = app.generation_snapshots()[0]
    assert merged.prefix_cache_hits >= 8 * 16 * 5, merged.prefix_cache_hits


def test_a_prefix_router_keeps_each_chat_tenant_on_one_replica_through_the_proxy(
    routed, ray_cluster
):
    # Over HTTP the proxy routes before the body is read: only the ingress lets the
    # router see the prompt (without it, "prefix" chose by load alone).
    routed.reset_stats()
    systems = tenants("http tenant", 2)
    with client(ray_cluster.port, ROUTED) as c:
        for i in range(6):  # one at a time, as above
            messages = [
                {"role": "system", "content": systems[i % 2]},
                {"role": "user", "content": f"question {i}"},
            ]
            c.chat.completions.create(model="lm", messages=messages, max_tokens=2)
    served, _ = served_by_replica(routed, 6)
    assert served in ([0, 6], [3, 3]), served  # each tenant's three on one replica
    merged = routed.generation_snapshots()[0]
    # Two hits a tenant of the 7 blocks its chat shares: a tenant split 2 + 1 gets one.
    assert merged.prefix_cache_hits >= 4 * 16 * 6, merged.prefix_cache_hits
