"""The CLI for someone who has not read the code: version, help, checked values, clear output."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
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
