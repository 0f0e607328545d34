"""A shared-prefix workload over HTTP against labserve's own /v1 routes on TinyLM (byte-level)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

import labserve
from labserve.cli import main
from labserve.config.generation import GenerationConfig
from labserve.generation.workload import SharedPrefixWorkload
from labserve.lab.demo import TinyLM
from labserve.load.generation import generation_load_test
from labserve.load.generation.sessions import WorkloadSender
from labserve.sim.generation import StepCost, simulate_workload

pytestmark = pytest.mark.filterwarnings("ignore::labserve.LoadWarning")


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[labserve.Runner, str]]:
    lm = labserve.Runner(TinyLM(d_model=32, n_layers=1, d_ff=64, max_model_len=512), name="wl")
    server = labserve.serve(lm, port=0)
    yield lm, server.url
    server.stop()
    lm.stop(timeout=10)


def workload(**over):
    args = dict(prefix_len=40, num_prefixes=3, input_len=8, output_len=5, turns=2, seed=9)
    return SharedPrefixWorkload(**(args | over))


def test_a_request_body_carries_the_very_prompt_the_in_process_load_sends():
    w = workload(turns=1)
    completions = WorkloadSender(
        "http://127.0.0.1:1/v1/completions",
        w,
        model="m",
        mix_args=(8, 5, 0, True),
        token=None,
        connections=1,
        timeout_s=1.0,
    )
    chat = WorkloadSender(
        "http://127.0.0.1:1/v1/chat/completions",
        w,
        model="m",
        mix_args=(8, 5, 0, True),
        token=None,
        connections=1,
        timeout_s=1.0,
    )
    simulated = simulate_workload(GenerationConfig(), StepCost(5.0), w, arrival_s=np.zeros(6))
    in_simulator = dict(zip(simulated.session.tolist(), simulated.prompts, strict=True))
    for k in range(6):
        sent = json.loads(completions.body(k, 0, []))
        assert sent["prompt"].encode() == bytes(w.prompt_ids(k)) and sent["max_tokens"] == 5
        assert sent["prompt"].encode() == bytes(in_simulator[k])
        messages = json.loads(chat.body(k, 0, []))["messages"]
        assert messages[0] == {"role": "system", "content": w.prefix(w.tenant(k)).decode()}


def test_turns_over_http_resend_the_replies_the_server_streamed(served):
    lm, url = served
    w = workload()
    result = generation_load_test(
        f"{url}/v1/completions",
        duration_s=0.1,
        arrivals=labserve.arrivals("constant", rate_rps=40),
        workload=w,
    )
    assert len(result) == 4 * 2 and result.served.all()
    assert result.turn is not None and result.session is not None
    again = workload()
    for i in range(len(result)):
        k, t = int(result.session[i]), int(result.turn[i])
        replies = []
        if t:  # TinyLM answers a prompt the same at temperature 0: its reply, in process
            first = lm.generate.run(again.prompt_ids(k), max_tokens=5, temperature=0.0)
            replies = [first.text]
        expected = again.prompt_text(k, t, replies).encode("utf-8")
        # The server's own count of what it was sent: the history with the reply it gave.
        assert result.generation.prompt_len[i] == len(expected)
    # A later turn goes a think time after its session's last reply, never before.
    g = result.generation
    for k in range(4):
        (a,) = np.flatnonzero((result.session == k) & (result.turn == 0))
        (b,) = np.flatnonzero((result.session == k) & (result.turn == 1))
        assert g.arrival_s[b] >= g.end_s[a]
    per_turn = result.per_turn()
    assert set(per_turn) == {0, 1} and per_turn[1]["n"] == 4
    assert "by turn" in result.table()


def test_chat_sessions_are_served_turn_after_turn(served):
    _, url = served
    result = generation_load_test(
        f"{url}/v1/chat/completions", duration_s=0.05, concurrency=1, workload=workload(turns=3)
    )
    assert result.served.all() and result.turn is not None
    assert result.turn.tolist()[:3] == [0, 1, 2]
    prompt = result.generation.prompt_len
    assert prompt[1] > prompt[0] + 8 and prompt[2] > prompt[1] + 8  # the history grows


def test_the_cli_sends_sessions_and_prints_ttft_by_turn(served, capsys):
    _, url = served
    argv = ["load", f"{url}/v1/completions", "--rate", "20", "--duration", "0.1"]
    flags = ["--prefix-len", "32", "--num-prefixes", "2", "--prefix-dist", "zipf:1.1"]
    flags += ["--turns", "2", "--think-time", "0.01", "--input-len", "8", "--output-len", "4"]
    assert main([*argv, *flags, "--loop", "asyncio"]) == 0
    out = capsys.readouterr().out
    assert "by turn" in out and "turn 1" in out and "2 prefix(es) of 32 tokens" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--num-prefixes", "4"], "--num-prefixes needs --prefix-len"),
        (
            ["--prefix-len", "8", "--prefix-dist", "zipf:0"],
            "--prefix-dist must be 'uniform' or 'zipf:S'",
        ),
        (["--prefix-len", "-1"], "--prefix-len must be an integer >= 0, got -1"),
        (["--prefix-len", "8", "--num-prefixes", "0"], "--num-prefixes must be an integer >= 1"),
        (["--turns", "0"], "--turns must be an integer >= 1, got 0"),
        (["--think-time", "1"], "--think-time needs --turns 2 or more"),
        (["--turns", "2", "--think-time", "-1"], "--think-time must be a finite number >= 0"),
    ],
)
def test_bad_workload_flags_exit_2_with_a_message(flags, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["load", "http://127.0.0.1:9/v1/completions", "--duration", "0.1", *flags])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_dashboards_source_sends_a_workload_as_chats(served):
    _, url = served
    [source] = labserve.generation_sources(url)
    run = source.start_load(
        arrivals=labserve.arrivals("constant", rate_rps=20), duration_s=0.1, input_len=8,
        output_len=4, seed=1, workload=workload(turns=2),
    )  # fmt: skip
    result = run.result(timeout=60)
    assert result.turn is not None and sorted(set(result.turn.tolist())) == [0, 1]
    assert result.served.all() and run.sent == 2
