import csv
import signal
import subprocess
import sys

import pytest

from labserve.cli import main
from labserve.lab.sweep import format_table, sweep


def test_sweep_rows_follow_the_grid_and_larger_caps_batch_more():
    rows = sweep(
        rates=[4000],
        max_batch_size=[8, 64],
        max_latency_ms=[20],
        on_overload="reject",
        duration_s=1,
    )
    assert [(r["max_batch_size"], r["rate"]) for r in rows] == [(8, 4000), (64, 4000)]
    # At 4000 req/s a 2 ms + 0.1 ms x items model cannot keep up with batches of 8.
    assert rows[0]["rejected_pct"] > 0 == rows[1]["rejected_pct"]
    table = format_table(rows)
    assert table.splitlines()[0].split()[:4] == [
        "strategy",
        "max_batch_size",
        "max_latency_ms",
        "rate",
    ]


def test_cli_sweep_writes_csv(tmp_path, capsys):
    out = tmp_path / "grid.csv"
    status = main(
        [
            "sweep",
            "--rates",
            "1000",
            "--max-batch-size",
            "4,16",
            "--duration",
            "1",
            "--csv",
            str(out),
        ]
    )
    assert status == 0
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["max_batch_size"] for r in rows] == ["4", "16"]
    assert "wrote 2 rows" in capsys.readouterr().out


def test_cli_demo_prints_a_row_per_rate(capsys):
    assert main(["demo", "--rates", "100,300", "--step-s", "0.3"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 2 + 2  # a title, the header, one row per rate


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sweep", "--rates", "fast"], "rates must be comma-separated numbers"),
        (["sweep", "--rates", "100", "--strategies", "eager"], "strategies must be among"),
        (["sweep", "--rates", "100", "--duration", "0"], "durations must be > 0"),
        (["profile", "--model", "nowhere:Model.predict"], "cannot load 'nowhere:Model.predict'"),
        (["load", "ftp://example/"], "URL must start with http://"),
        (
            ["serve", "labserve.lab.demo:TinyLM", "--ray", "--router", "fastest"],
            "--router: router must be one of 'round_robin'",
        ),
        (
            ["serve", "labserve.lab.demo:TinyLM", "--ray", "--stream-interval-ms", "-5"],
            "must be a number of milliseconds >= 0, got '-5'",
        ),
        (["serve", "m:C", "--drain-timeout", "soon"], "must be a number of seconds >= 0"),
    ],
)
def test_bad_arguments_exit_2_with_a_message_not_a_traceback(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_serve_runs_in_the_foreground_and_stops_on_ctrl_c(tmp_path):
    import json
    import os
    import signal
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    (tmp_path / "mymodel.py").write_text(
        "import labserve\n"
        "class Echo(labserve.Runnable):\n"
        "    @labserve.method(batchable=True)\n"
        "    def predict(self, x):\n"
        "        return x\n"
    )
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "labserve.cli", "serve", "mymodel:Echo", "--port", "0"),
            *("--allow-origin", "https://dash.example", "--allow-host", "lab.example"),
            *("--loop", "asyncio"),
        ],
        cwd=tmp_path,
        # The test's own PYTHONPATH kept: the labserve under test, wherever it is imported from.
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.getenv("PYTHONPATH")])),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first.startswith("serving echo at http://127.0.0.1:"), first
        assert "asyncio loop" in first  # as asked, though uvloop may be installed
        url = first.split()[3]
        req = urllib.request.Request(
            url + "/runners/echo/predict",
            data=b"[[1, 2]]",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as reply:
            assert json.loads(reply.read()) == [[1, 2]]
        # The flags open exactly what they name: that origin and that Host, nothing else.
        for headers, allowed in (
            ({"Origin": "https://dash.example", "Host": "lab.example"}, True),
            ({"Origin": "https://evil.example"}, False),
            ({"Host": "rebind.evil.example"}, False),
        ):
            req = urllib.request.Request(
                url + "/runners/echo/predict",
                data=b"[[1, 2]]",
                headers={"Content-Type": "application/json", **headers},
            )
            try:
                with urllib.request.urlopen(req, timeout=10) as reply:
                    status = reply.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            assert (status == 200) is allowed, (headers, status)
    finally:
        _assert_stops_cleanly(proc, signal.SIGINT)


def _assert_stops_cleanly(proc: subprocess.Popen[str], signum: int) -> None:
    """Send ``signum`` to a running ``labserve serve``: it exits 0 and says what stopped it."""
    if proc.poll() is None:
        proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert f"stopping ({signal.Signals(signum).name})" in out and "Traceback" not in err


@pytest.mark.parametrize(
    ("signum", "ignored_at_start"),
    [(signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["SIGTERM, as a process manager stops it", "SIGINT, started as a background job"],
)
def test_serve_stops_cleanly_on_sigterm_and_on_sigint_it_was_started_ignoring(
    signum, ignored_at_start
):
    # A shell starts a background job with SIGINT ignored; SIGTERM's default kills at once.
    command = ["serve", "labserve.lab.demo:SleepModel", "--port", "0", "--loop", "asyncio"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "labserve.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        if ignored_at_start
        else None,
    )
    try:
        first = proc.stdout.readline()
        assert first.startswith("serving sleepmodel at http://127.0.0.1:"), (
            first,
            proc.stderr.read() if proc.poll() is not None else "",
        )
    finally:
        _assert_stops_cleanly(proc, signum)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_every_live_stream_with_its_final_error_event(tmp_path, signum):
    import json
    import os

    import httpx

    # 10 ms a step: 900 tokens would take 9 s, far past the half-second drain.
    (tmp_path / "slowlm.py").write_text(
        "import time\n"
        "import labserve\n"
        "from labserve.lab.demo import TinyLM\n"
        "class SlowLM(TinyLM):\n"
        "    @labserve.method(generative=True)\n"
        "    def generate(self, batch):\n"
        "        time.sleep(0.01)\n"
        "        return self._step(batch)\n"
    )
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "labserve.cli", "serve", "slowlm:SlowLM", "--port", "0"),
            *("--loop", "asyncio", "--drain-timeout", "0.5"),
        ],
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.getenv("PYTHONPATH")])),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first.startswith("serving slowlm at http://127.0.0.1:"), (
            first,
            proc.stderr.read() if proc.poll() is not None else "",
        )
        url = first.split()[3]
        body = {
            "model": "slowlm",
            "prompt": "go",
            "max_tokens": 900,
            "stream": True,
            "ignore_eos": True,
        }
        events = []
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as reply:
            assert reply.status_code == 200
            for line in reply.iter_lines():  # raises if the connection is cut mid-reply
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    if len(events) == 3:
                        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert 3 < len(events) < 900 and "[DONE]" not in events
    last = json.loads(events[-1])
    assert last["error"]["code"] == "RunnerStoppedError", last
    assert all("error" not in json.loads(e) for e in events[:-1])
    # Stopped, not killed; and no step after the runner stopped (none to fail at exit).
    assert proc.returncode == 0, err
    assert f"stopping ({signal.Signals(signum).name})" in out and "Traceback" not in err, err
