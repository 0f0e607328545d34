"""Does the simulator predict a real run? The same trace and config, real and simulated.

Real: labserve.load_test on the sleep-based demo model (2 ms + 0.1 ms x items) in-process.
Simulated: labserve.simulate on the same arrival times with the nominal LinearCost, with the
cost fitted by labserve.profile on this machine (the model function alone), and with the
runner's own live fit (fire to release: the model plus the hand-over to and from the worker
thread), and with that fit plus the hand-off the simulator otherwise leaves out: each
request's time from its intended send to the queue and from its batch's end back to its
caller (``simulate(handoff_ms=...)``), measured once on a separate light-load calibration
run. Prints mean batch and p50/p99 of both. Run: `.venv/bin/python benchmarks/fidelity.py`.
"""

from __future__ import annotations

import numpy as np

import labserve
from labserve.lab.demo import SleepModel


def main() -> None:
    model = SleepModel(a_ms=2.0, b_ms=0.1)
    runner = labserve.Runner(model, name="fidelity", max_batch_size=64, max_latency_ms=20)
    x = np.ones((1, 16), np.float32)
    measured = labserve.profile(runner.predict, example=x, sizes=[1, 2, 4, 8, 16, 32, 64])
    print(f"profiled cost: {measured.fit.a_ms:.3f} ms + {measured.fit.b_ms:.4f} ms x items")
    calibration = labserve.load_test(
        runner.predict,
        example=x,
        duration_s=3.0,
        arrivals=labserve.arrivals("poisson", rate_rps=300),
        seed=1,
    )
    handoff_ms = _handoff_ms(calibration)
    print(f"hand-off (send lag + batch end to caller, median at 300 req/s): {handoff_ms:.3f} ms\n")
    print("| rate | strategy | run | mean batch | p50 ms | p99 ms | batch error | p50 error |")
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    for rate in (1000, 2000):
        for strategy in ("greedy", "adaptive"):
            runner.configure("predict", strategy=strategy)
            real = labserve.load_test(
                runner.predict,
                example=x,
                duration_s=5.0,
                arrivals=labserve.arrivals("poisson", rate_rps=rate),
                seed=rate,
            )
            r = real.summary()
            print(_row(rate, strategy, "real", r, r))
            live = runner.stats("predict").cost_fit  # fire to release, as the runner saw it
            costs = (
                ("sim, nominal cost", (2.0, 0.1)),
                ("sim, profiled cost", measured),
                (
                    f"sim, runner's fit {live.a_ms:.2f} + {live.b_ms:.3f} x n",
                    (live.a_ms, live.b_ms),
                ),
            )
            for name, cost in costs:
                sim = labserve.simulate(
                    real.arrival_s,
                    cost=cost,
                    strategy=strategy,
                    max_batch_size=64,
                    max_latency_ms=20,
                )
                print(_row(rate, strategy, name, sim.summary(), r))
            sim = labserve.simulate(
                real.arrival_s,
                cost=(live.a_ms, live.b_ms),
                handoff_ms=handoff_ms,
                strategy=strategy,
                max_batch_size=64,
                max_latency_ms=20,
            )
            name = f"sim, runner's fit + hand-off {handoff_ms:.2f} ms"
            print(_row(rate, strategy, name, sim.summary(), r))
    runner.stop()


def _handoff_ms(real: labserve.RunResult) -> float:
    """Median time a served request spent outside the queue and its batch, in ms.

    Send lag (intended send to the call) plus its finish minus its batch's end (start +
    fire-to-release duration): what the simulator does not model.
    """
    ends = dict(
        zip(
            real.batch_start_s.tolist(),
            (real.batch_start_s + real.batch_duration_s).tolist(),
            strict=True,
        )
    )
    served = np.flatnonzero(real.served)
    lag = real.send_lag_s if real.send_lag_s is not None else np.zeros(len(real.arrival_s))
    outside = [
        lag[k] + real.finish_s[k] - ends[real.start_s[k]] for k in served if real.start_s[k] in ends
    ]
    return float(np.median(outside)) * 1000.0


def _row(rate: int, strategy: str, name: str, s: dict, real: dict) -> str:
    batch_err = s["mean_batch"] / real["mean_batch"] - 1
    p50_err = s["latency_p50_ms"] / real["latency_p50_ms"] - 1
    return (
        f"| {rate} | {strategy} | {name} | {s['mean_batch']:.2f} | {s['latency_p50_ms']:.2f} | "
        f"{s['latency_p99_ms']:.2f} | {batch_err:+.0%} | {p50_err:+.0%} |"
    )


if __name__ == "__main__":
    main()
