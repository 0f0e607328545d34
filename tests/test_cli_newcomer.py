"""The CLI for someone who has not read the code: version, help, checked values, clear output."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

import labserve
from labserve.cli import build_parser, main


def _actions(parser):
    for action in parser._actions:
        yield parser.prog, action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"labserve {labserve.__version__}\n"


def test_every_option_has_help():
    missing = [
        f"{prog} {action.option_strings or action.dest}"
        for prog, action in _actions(build_parser())
        if not action.help and action.dest != "command"
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("cost", "message"),
    [
        ("2", "cost must be two numbers a_ms,b_ms"),
        ("2,0.1,3", "cost must be two numbers a_ms,b_ms"),
        ("0,0.1", "cost needs a_ms > 0 and b_ms >= 0"),
        ("2,-1", "cost needs a_ms > 0 and b_ms >= 0"),
    ],
)
def test_a_cost_that_is_not_a_and_b_is_refused(cost, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["sweep", "--rates", "100", "--cost", cost])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_sweep_csv_says_what_it_wrote_and_where(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--rates", "100", "--duration", "0.2", "--csv", "grid.csv"]) == 0
    out = capsys.readouterr().out
    assert "wrote 1 rows (" in out and "rate, " in out
    assert out.rstrip().endswith(f"to {tmp_path / 'grid.csv'}")


def test_demo_on_a_pipe_prints_the_table_alone(capsys):
    assert main(["demo", "--rates", "100", "--step-s", "0.2"]) == 0  # capsys: not a terminal
    captured = capsys.readouterr()
    assert "\r" not in captured.out + captured.err and "step 1/1" not in captured.err


def test_a_model_in_the_current_folder_loads(tmp_path, monkeypatch, capsys):
    (tmp_path / "newcomer_model.py").write_text(
        "import numpy as np\n"
        "class Scorer:\n"
        "    def predict(self, x):\n"
        "        return np.asarray(x).sum(axis=1)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    monkeypatch.delitem(sys.modules, "newcomer_model", raising=False)
    argv = ["profile", "--model", "newcomer_model:Scorer.predict", "--width", "4"]
    assert main([*argv, "--sizes", "1,2", "--repeats", "1"]) == 0
    assert "newcomer_model" in sys.modules


def test_config_sections_and_export_runner_name_the_runners_there_are(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("runners:\n  scorr:\n    batching:\n      max_batch_size: 4\n")
    with pytest.raises(SystemExit) as info:
        main(["export", "labserve", "--config", str(path), "--runner", "nosuch"])
    assert info.value.code == 2
    assert "has no section for runner 'nosuch'; its runner sections: 'scorr'" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main(["serve", "labserve.lab.demo:SleepModel", "--config", str(path), "--port", "0"])
    err = capsys.readouterr().err
    assert (
        f"{path}: runners.scorr must be a section for a runner there is"
        " (the runners there are: 'sleepmodel'), got 'scorr'" in err
    )


def test_configure_a_method_that_is_not_there_names_those_that_are():
    from labserve.lab.demo import SleepModel

    runner = labserve.Runner(SleepModel(), name="newcomer")
    try:
        with pytest.raises(labserve.ConfigError, match=r"\(it has: predict\), got 'predikt'"):
            runner.configure("predikt", max_batch_size=4)
    finally:
        runner.stop()


_SCORER = """import numpy as np
import labserve

class Scorer(labserve.Runnable):
    @labserve.method(batchable=True)
    def predict(self, x):
        return np.asarray(x).sum(axis=1, keepdims=True)
"""


def _status(url: str, body: bytes | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


@pytest.mark.parametrize(
    ("target", "runner", "model_file"),
    [
        ("labserve.lab.demo:SleepModel", "sleepmodel", None),
        # From the folder holding mymodel.py, which is on no path: it is importable there.
        ("mymodel:Scorer", "scorer", _SCORER),
    ],
)
def test_serve_prints_the_routes_it_serves_and_each_answers(target, runner, model_file, tmp_path):
    if model_file is not None:
        (tmp_path / "mymodel.py").write_text(model_file)
    # The installed command, as a newcomer types it, from a folder of their own.
    command = shutil.which("labserve", path=os.path.dirname(sys.executable))
    assert command is not None
    proc = subprocess.Popen(
        [command, "serve", target, "--port", "0", "--loop", "asyncio"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines: list[str] = []
        while not lines or not lines[-1].startswith("  also:"):
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, (lines, proc.communicate(timeout=20)[1])  # it ended: say why
            lines.append(line)
        first = re.match(rf"serving {runner} at (http://127\.0\.0\.1:\d+) ", lines[0])
        assert first, lines[0]
        url = first[1]
        posts = [line.split()[1] for line in lines[1:-1]]
        assert posts == [f"{url}/runners/{runner}/predict"]
        status, body = _status(posts[0], b"[[1, 2, 3]]")
        assert (status, json.loads(body)) == (200, [[6]])
        # Every route the line names exists (a POST route answers a GET with 405, not 404).
        named = re.findall(r"(?:^|[ ,;])(/[\w/.]*|http://\S+/)(?=[ ,;]|$)", lines[-1])
        paths = [p.removeprefix(url) or "/" for p in named]
        assert {f"/v2/models/{runner}/infer", "/stats", "/metrics", "/healthz", "/"} <= set(paths)
        for path in paths:
            assert _status(url + path)[0] in (200, 405), path
        assert _status(url + "/nosuch")[0] == 404  # (what a route that does not exist gets)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


_BOTH = """import labserve
from labserve.lab.demo import TinyLM

class Both(TinyLM):
    @labserve.method(batchable=True)
    def score(self, x):
        return x.sum(axis=1, keepdims=True)
"""


def _serve_lines(target: str, cwd) -> tuple[subprocess.Popen[str], list[str]]:
    """Start ``labserve serve target`` and read what it prints up to its ``also:`` line."""
    command = shutil.which("labserve", path=os.path.dirname(sys.executable))
    assert command is not None
    proc = subprocess.Popen(
        [command, "serve", target, "--port", "0", "--loop", "asyncio"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    while not lines or not lines[-1].startswith("  also:"):
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            proc.kill()
            raise AssertionError((lines, proc.communicate(timeout=20)[1]))
        lines.append(line.rstrip("\n"))
    return proc, lines


@pytest.mark.parametrize(
    ("target", "runner", "batchable"),
    [("labserve.lab.demo:TinyLM", "tinylm", []), ("mymodel:Both", "both", ["score"])],
    ids=["generative", "generative and batchable"],
)
def test_serve_says_how_to_call_a_generative_model_and_each_way_answers(
    target, runner, batchable, tmp_path
):
    (tmp_path / "mymodel.py").write_text(_BOTH)
    proc, lines = _serve_lines(target, tmp_path)
    try:
        first = re.match(rf"serving {runner} at (http://127\.0\.0\.1:\d+) ", lines[0])
        assert first, lines
        url = first[1]
        posts = [line.split()[1] for line in lines if line.startswith("  POST ")]
        routes = [f"{url}/runners/{runner}/{m}" for m in batchable]
        assert posts == [*routes, f"{url}/v1/completions"]
        for post in posts[:-1]:
            assert _status(post, b"[[1, 2, 3]]") == (200, b"[[6]]")
        # The curl as printed (its URL and body), and the openai client's base URL.
        curl = shlex.split(next(line for line in lines if line.startswith("    curl ")))
        status, body = _status(curl[1], curl[curl.index("-d") + 1].encode())
        # Sampled (the curl's defaults): TinyLM's trained weights may end the text before 16.
        assert status == 200 and 1 <= json.loads(body)["usage"]["completion_tokens"] <= 16
        base = re.search(r'base_url="([^"]+)"', "\n".join(lines))
        assert base, lines
        status, body = _status(base[1] + "/models")
        assert [m["id"] for m in json.loads(body)["data"]] == [runner]
        # The Open Inference Protocol is named only where a batchable method serves it.
        assert ("/v2/models/" in lines[-1]) is bool(batchable)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_the_runner_says_what_kind_each_method_is():
    from labserve.lab.demo import TinyLM

    class Both(TinyLM):
        @labserve.method(batchable=True)
        def score(self, x):
            return x

        @labserve.method()
        def plain(self, x):
            return x

    runner = labserve.Runner(Both, name="both")
    try:
        kinds = {"score": "batchable", "plain": "plain", "generate": "generative"}
        assert repr(runner) == f"<Runner 'both' methods={kinds} ready>"
    finally:
        runner.stop()


def test_serve_on_a_busy_port_is_one_line_naming_the_port(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        command = [sys.executable, "-m", "labserve.cli", "serve", "labserve.lab.demo:TinyLM"]
        done = subprocess.run(
            [*command, "--port", str(port)], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 2
    assert done.stderr.startswith(f"labserve: error: cannot listen on 127.0.0.1:{port}: ")
    assert len(done.stderr.splitlines()) == 1 and "--port 0" in done.stderr, done.stderr


@pytest.fixture(scope="module")
def tinylm_url():
    from labserve.lab.demo import TinyLM
    from labserve.server import serve

    runner = labserve.Runner(TinyLM, name="tinylm")
    server = serve(runner)
    yield server.url
    server.stop()
    runner.stop()


def _load(*argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "labserve.cli", "load", *argv, "--loop", "asyncio"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_a_load_whose_every_request_got_a_4xx_exits_1_saying_why(tinylm_url):
    url = f"{tinylm_url}/v1/completions"
    done = _load(url, "--model", "nosuch", "--duration", "0.5", "--rate", "10")
    assert done.returncode == 1, done.stderr
    assert "labserve: the run failed: " in done.stderr and "got a 4xx reply" in done.stderr
    assert "no model 'nosuch'" in done.stdout
    # What a failed run is, --help says.
    assert (
        "exit status"
        in subprocess.run(
            [sys.executable, "-m", "labserve.cli", "load", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )


def test_a_served_load_exits_0_and_says_what_interval_each_figure_covers(tinylm_url):
    url = f"{tinylm_url}/v1/completions"
    done = _load(url, "--duration", "1", "--rate", "4", "--arrivals", "constant")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "time_s" not in out  # the server's clock reading, meaningless beside the run
    # The server's rates, over its window, under a heading that says so.
    rates = re.search(r"over its last 10 s, not this run's [\d.]+ s: .*requests_per_s", out, re.S)
    assert rates and out.count("requests_per_s") == 1, out
    # Kept or not (the machine's load decides), it says by what it judged.
    judged = r"schedule: (kept|could NOT keep) 4 req/s: \d+ of \d+ sends more than 25 ms late"
    assert re.search(judged, out), out


def test_a_typo_in_a_generation_path_is_an_error_naming_the_paths(capsys):
    with pytest.raises(SystemExit) as info:
        main(["load", "http://127.0.0.1:1/v1/completion", "--duration", "1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "did you mean /v1/completions?" in err and "/v1/chat/completions" in err


@pytest.mark.parametrize("url", ["/v1/completions", "/runners/m/predict"])
def test_a_rate_and_a_concurrency_together_are_an_error_saying_to_give_one(url, capsys):
    with pytest.raises(SystemExit) as info:
        main(["load", f"http://127.0.0.1:1{url}", "--rate", "5", "--concurrency", "2"])
    assert info.value.code == 2
    assert "give --rate or --concurrency" in capsys.readouterr().err


@pytest.mark.parametrize(("path", "status"), [("/v1/completions", 2), ("/runners/m/predict", 1)])
def test_a_server_not_there_is_said_to_be_unreachable(path, status):
    with socket.socket() as closed:  # bound, not listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        origin = f"http://127.0.0.1:{closed.getsockname()[1]}"
        done = _load(origin + path, "--duration", "0.3", "--rate", "10")
    assert done.returncode == status, done.stderr
    assert f"the server is not reachable at {origin}" in done.stderr
    assert "model=" not in done.stderr
