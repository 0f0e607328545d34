"""Ctrl-C in a cell running load_test stops the load at once (in a subprocess: a real interrupt)."""

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import _thread, json, signal, sys, threading, time, warnings
    import numpy as np
    import labserve
    from labserve.lab.demo import SleepModel

    # Ctrl-C as a kernel has it, even when the suite runs as a background job (SIGINT is
    # ignored there, and interrupt_main() then does nothing).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    warnings.simplefilter("ignore", labserve.LoadWarning)
    runner = labserve.Runner(SleepModel(a_ms=1.0, b_ms=0.0), name="m", on_overload="wait")
    server = labserve.serve(runner) if sys.argv[1] == "http" else None
    target = f"{server.url}/runners/m/predict" if server else runner.predict

    def interrupt_when_busy():
        while runner.stats("predict").admitted < 200:
            time.sleep(0.005)
        _thread.interrupt_main()

    threading.Thread(target=interrupt_when_busy, daemon=True).start()
    try:
        labserve.load_test(target, example=np.ones((1, 4)), duration_s=60,
                           arrivals=labserve.ConstantArrivals(2000))
        out = {"interrupted": False}
    except labserve.LoadInterrupted as exc:
        first = runner.stats("predict").admitted
        time.sleep(1.0)  # a running load would admit ~2,000 more meanwhile
        result = exc.result
        out = {
            "interrupted": isinstance(exc, KeyboardInterrupt),
            "admitted_then": first,
            "admitted_later": runner.stats("predict").admitted,
            "sent": exc.sent,
            "recorded": len(result.arrival_s),
            "outcomes": sorted({labserve.OUTCOMES[o] for o in result.outcome.tolist()}),
            "duration_s": result.duration_s,
        }
    if server:
        server.stop()
    runner.stop()
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("kind", ["runner", "http"])
def test_an_interrupt_stops_the_load_at_once_and_keeps_what_was_measured(kind):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, kind], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "never retrieved" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["interrupted"] is True
    assert 200 <= out["sent"] < 60 * 2000
    if kind == "runner":
        assert out["admitted_later"] == out["admitted_then"]  # none admitted after the stop
    else:  # requests already on the wire may still reach the server, but no more are sent
        assert out["admitted_then"] <= out["admitted_later"] <= out["sent"]
    assert out["recorded"] == out["sent"]  # every request sent is in the result
    assert set(out["outcomes"]) <= {"served", "cancelled"}
    assert "served" in out["outcomes"]
    assert out["duration_s"] < 60  # rates are over the span actually run
