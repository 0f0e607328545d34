"""``sweep(executor=...)``: simulated points in parallel, rows identical to the serial run."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

import labserve
from labserve.lab.demo import SleepModel
from labserve.ray import RayExecutor

GRID = {
    "rates": [500, 2000, 6000],
    "strategies": ["fixed", "adaptive"],
    "max_batch_size": [8, 64],
    "duration_s": 1.0,
    "seed": 7,
}


@pytest.fixture(scope="module")
def serial():
    return labserve.sweep(**GRID)


def test_a_process_pool_gives_the_serial_rows_in_order(serial):
    seen = []
    with concurrent.futures.ProcessPoolExecutor(2) as pool:
        rows = labserve.sweep(**GRID, executor=pool, progress=lambda d, n: seen.append((d, n)))
    assert repr(rows) == repr(serial)  # repr: NaN compares equal to itself there
    assert seen == [(d, 12) for d in range(1, 13)]


def test_ray_tasks_give_the_serial_rows_in_order(ray_cluster, serial):
    with RayExecutor(num_cpus=0.5) as ray_pool:
        rows = labserve.sweep(**GRID, executor=ray_pool)
    assert repr(rows) == repr(serial)
    assert len({(r["strategy"], r["max_batch_size"], r["rate"]) for r in rows}) == 12


def test_a_failing_point_fails_the_sweep_with_its_error(ray_cluster):
    with RayExecutor() as ray_pool, pytest.raises(Exception, match="rate"):
        labserve.sweep(rates=[-1.0], duration_s=1, executor=ray_pool)


def test_a_real_sweep_refuses_an_executor():
    runner = labserve.Runner(SleepModel(a_ms=0, b_ms=0), name="real")
    try:
        with (
            concurrent.futures.ThreadPoolExecutor(1) as pool,
            pytest.raises(TypeError, match="simulated"),
        ):
            labserve.sweep(
                rates=[10], method=runner.predict, example=np.ones((1, 2)), executor=pool
            )
    finally:
        runner.stop()
