"""``sweep(executor=...)``: simulated points in parallel, rows identical to the serial run."""

from __future__ import annotations

import concurrent.futures
import multiprocessing

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
    # spawn, not fork: earlier tests in this process may have started Ray, and a forked child
    # does not survive its gRPC threads (a child's garbage collection closing an inherited Ray
    # subscriber crashed it with SIGSEGV in a full-suite run on 2026-12-02).
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=spawn) as pool:
        rows = labserve.sweep(**GRID, executor=pool, progress=lambda d, n: seen.append((d, n)))
    assert repr(rows) == repr(serial)  # repr: NaN compares equal to itself there
    done = [d for d, n in seen if n == 12]
    assert len(done) == len(seen) > 1  # several tasks, each reported once
    assert done == sorted(set(done)) and done[-1] == 12


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


class CountingPool(concurrent.futures.ThreadPoolExecutor):
    """A thread pool that counts the tasks it was given."""

    tasks = 0

    def submit(self, fn, /, *args, **kwargs):
        self.tasks += 1
        return super().submit(fn, *args, **kwargs)


@pytest.mark.parametrize(("rate", "tasks"), [(50.0, 16), (40_000.0, 32)])
def test_light_points_share_a_task_and_heavy_ones_do_not(rate, tasks):
    grid = {"rates": [rate], "max_batch_size": list(range(1, 33)), "duration_s": 1.0}
    with CountingPool(2) as pool:
        rows = labserve.sweep(**grid, executor=pool)
    assert repr(rows) == repr(labserve.sweep(**grid))
    # 32 points of 50 requests: at most 1/16 of the grid a task; of 40,000: one each.
    assert pool.tasks == tasks
