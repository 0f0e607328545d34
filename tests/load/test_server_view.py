import math
import subprocess
import sys

import numpy as np
import pytest

import labserve
from labserve.cli import main
from labserve.lab.demo import SleepModel
from labserve.load.server_view import find_method, server_view


def snap(served, sizes, reasons, lat_buckets, lat_sum_s, window_p50=None):
    return {
        "runner": "r",
        "method": "m",
        "window_s": 10.0,
        "served": served,
        "rejected": 0,
        "failed": 0,
        "refused": 0,
        "cancelled": 0,
        "batch_size_counts": sizes,
        "fire_reasons": reasons,
        "latency_buckets": lat_buckets,
        "latency_sum_s": lat_sum_s,
        "queue_wait_buckets": lat_buckets,
        "queue_wait_sum_s": lat_sum_s,
        "latency_ms_window": {"p50": window_p50, "p99": window_p50},
        "queue_wait_ms_window": {"p50": window_p50, "p99": window_p50},
    }


def test_the_server_view_is_the_difference_of_two_snapshots():
    before = snap(10, {"1": 10}, {"idle": 10}, [[0.001, 10], [0.01, 10]], 0.005)
    after = snap(
        110, {"1": 10, "4": 20, "20": 1}, {"idle": 30, "full": 1}, [[0.001, 10], [0.01, 110]], 0.505
    )
    view = server_view(before, after, duration_s=2.0)
    assert view["served"] == 100 and view["batches"] == 21
    assert view["mean_batch"] == pytest.approx(100 / 21)
    assert view["max_batch"] == 20
    assert view["fire_reasons"] == {"idle": 20, "full": 1}
    assert view["latency_mean_ms"] == pytest.approx(5.0)
    # All 100 fell in the 1-10 ms bucket: the median is its geometric middle.
    assert view["percentiles_from"] == "buckets"
    assert view["latency_p50_ms"] == pytest.approx(math.sqrt(1 * 10))
    # A run as long as the server's window reads the window's exact percentiles instead.
    after["latency_ms_window"] = {"p50": 4.2, "p99": 9.0}
    view = server_view(before, after, duration_s=10.0)
    assert view["percentiles_from"] == "window" and view["latency_p50_ms"] == 4.2


def test_find_method_takes_a_runners_only_method_or_a_named_one():
    stats = {"r": {"m": {"batch_size_counts": {}}}, "two": {"a": {}, "b": {}}}
    assert find_method(stats, "r", None) == {"batch_size_counts": {}}
    assert find_method(stats, "r", "m") is not None
    assert find_method(stats, "two", None) is None
    assert find_method(stats, "nope", "m") is None
    assert find_method(["not", "labserve"], "r", "m") is None


@pytest.fixture
def url():
    runner = labserve.Runner(SleepModel(a_ms=0.5, b_ms=0.0), name="m", on_overload="wait")
    server = labserve.serve(runner)
    yield server.url
    server.stop()
    runner.stop()


# The CLI tests keep to asyncio: in this process the load loop, once started, keeps its loop.


def test_cli_load_on_v2_prints_the_servers_batching_and_the_schedule(url, capsys):
    status = main(
        [
            "load",
            f"{url}/v2/models/m/infer",
            "--rate",
            "200",
            "--duration",
            "0.3",
            "--arrivals",
            "constant",
        ]
    )
    assert status == 0
    captured = capsys.readouterr()
    assert "declares no inputs" in captured.err  # SleepModel has no input_spec
    rows = dict(line.split(None, 1) for line in captured.out.splitlines()[1:] if "  " in line)
    assert int(rows["requests"].replace(",", "")) == 60
    assert int(rows["server_served"].replace(",", "")) == 60
    assert int(rows["batches"]) > 0
    assert "schedule:" in captured.out and "the server's own /stats" in captured.out


def test_cli_load_closed_loop_with_binary_bodies(url, capsys):
    argv = ["load", f"{url}/runners/m/predict", "--concurrency", "2", "--duration", "0.2"]
    assert main([*argv, "--binary", "--width", "3", "--loop", "asyncio"]) == 0
    out = capsys.readouterr().out
    assert "served_rps" in out and "outcomes" not in out  # all served: no other kinds
    assert "schedule:" not in out  # closed loop has no schedule to keep


@pytest.mark.parametrize("flag", ["--rate", "--timeout", "--concurrency"])
def test_cli_load_refuses_non_positive_numbers(flag, capsys):
    with pytest.raises(SystemExit) as info:
        main(["load", "http://127.0.0.1:1/runners/m/p", flag, "0"])
    assert info.value.code == 2
    assert f"{flag} must be > 0" in capsys.readouterr().err


def test_summary_counts_http_kinds_only_when_there_are_some():
    result = labserve.simulate(labserve.ConstantArrivals(100), duration_s=0.5, cost=(1.0, 0.0))
    assert "outcomes" not in result.summary()
    assert np.all(result.served)


def test_cli_load_runs_on_uvloop_when_asked(url):
    pytest.importorskip("uvloop")
    args = ["--concurrency", "2", "--duration", "0.2", "--loop", "uvloop"]
    proc = subprocess.run(
        [sys.executable, "-m", "labserve.cli", "load", f"{url}/runners/m/predict", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "its own event loop (uvloop)" in proc.stdout
    assert "server_served" in proc.stdout
