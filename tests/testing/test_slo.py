import math

import numpy as np
import pytest

import labserve
from labserve.testing import SLOS, assert_slo


@pytest.fixture(scope="module")
def result() -> labserve.RunResult:
    # 2000 req/s Poisson into a 2 ms + 0.1 ms/item model, fixed strategy: seeded, so the
    # numbers below are the same on every machine.
    return labserve.simulate(
        labserve.PoissonArrivals(2000),
        duration_s=2,
        seed=3,
        strategy="fixed",
        max_batch_size=16,
        max_latency_ms=5,
        label="poisson 2000 req/s",
    )


def test_met_slos_pass(result):
    s = result.summary()
    assert_slo(
        result,
        p99_ms=s["latency_p99_ms"],
        mean_batch=s["mean_batch"],
        rejected_pct=s["rejected_pct"],
        max_batch=16,
        served_rps=s["served_rps"],
    )


def test_a_broken_slo_names_asked_and_got_and_prints_the_table(result):
    s = result.summary()
    with pytest.raises(AssertionError) as info:
        assert_slo(result, p99_ms=0.5, mean_batch=1, rejected_pct=0)
    message = str(info.value)
    assert message.startswith("1 of 3 SLOs broken (poisson 2000 req/s):\n")
    assert f"p99_ms: asked <= 0.5, got {s['latency_p99_ms']:,.4g}" in message
    assert "mean_batch" not in message.split("summary:")[0]
    assert result.table() in message


def test_floors_and_ceilings_each_break_in_their_own_direction(result):
    s = result.summary()
    with pytest.raises(AssertionError) as info:
        assert_slo(result, mean_batch=s["mean_batch"] + 1, max_batch=s["max_batch"] - 1)
    head = str(info.value).split("summary:")[0]
    assert "2 of 2 SLOs broken" in head
    assert "mean_batch: asked >= " in head
    assert "max_batch: asked <= " in head


def test_every_slo_reads_a_summary_key(result):
    keys = result.summary()
    for name, check in SLOS.items():
        key, op = check.split()
        assert key in keys, name
        assert op in ("<=", ">=")


def test_nothing_served_breaks_a_latency_slo():
    empty = labserve.simulate([], duration_s=1.0)
    assert math.isnan(empty.summary()["latency_p99_ms"])
    with pytest.raises(AssertionError, match=r"p99_ms: asked <= 100, got nan"):
        assert_slo(empty, p99_ms=100)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((None,), {"p99_ms": 1}, "needs a labserve.RunResult, got NoneType"),
        (("R",), {}, "needs at least one SLO"),
        (("R",), {"p99": 1}, "unknown SLO 'p99'; known: p50_ms, p95_ms, p99_ms"),
        (("R",), {"p99_ms": "10"}, "SLO p99_ms must be a number, got '10'"),
        (("R",), {"p99_ms": float("nan")}, "SLO p99_ms must be a number"),
        (("R",), {"rejected_pct": True}, "SLO rejected_pct must be a number"),
    ],
)
def test_bad_arguments_are_type_errors(result, args, kwargs, message):
    args = tuple(result if a == "R" else a for a in args)
    with pytest.raises(TypeError, match=message):
        assert_slo(*args, **kwargs)


def test_testing_helpers_do_not_import_pytest():
    import subprocess
    import sys

    code = (
        "import sys, labserve\n"
        "assert 'labserve.testing' not in sys.modules, 'import labserve loads labserve.testing'\n"
        "import labserve.testing\n"
        "print('pytest' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_pytest_probe_can_fail():
    import subprocess
    import sys

    code = "import sys, labserve.testing.plugin\nprint('pytest' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_served_rps_is_a_floor(result):
    served = result.summary()["served_rps"]
    assert np.isfinite(served)
    with pytest.raises(AssertionError, match="served_rps: asked >= "):
        assert_slo(result, served_rps=served * 2)
