"""``labserve.calibrate``: a simulator of your own model and machine, from what ran.

One name for both kinds of run, dispatching on what it is given:

- a request-batching run, the :class:`~labserve.metrics.results.RunResult` of
  ``labserve.load_test(runner.predict, ...)``: its batches' cost and its hand-off, for
  :func:`labserve.simulate` (:mod:`labserve.lab.calibrate_requests`);
- a generation run's steps (``runner.generate.stats()`` and the like): the step cost, for
  :func:`labserve.simulate_generation` (:mod:`labserve.lab.generation.calibrate`).

>>> import labserve
>>> ran = labserve.simulate(labserve.arrivals("poisson", rate_rps=1000).times(2.0, seed=1))
>>> cal = labserve.calibrate(ran)
>>> type(cal).__name__
'RequestCalibration'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

from labserve.generation.results import GenerationResult, StepSeries
from labserve.generation.sequence import StepRecord
from labserve.generation.stats import GenerationSnapshot
from labserve.lab.calibrate_requests import RequestCalibration, calibrate_requests
from labserve.lab.generation.calibrate import Calibration
from labserve.lab.generation.calibrate import calibrate as calibrate_steps
from labserve.metrics.results import RunResult

__all__ = ["calibrate"]

Steps = StepSeries | GenerationSnapshot | GenerationResult | Sequence[StepRecord]


@overload
def calibrate(run: RunResult, *, cut: float = 3.0) -> RequestCalibration: ...


@overload
def calibrate(
    run: Steps,
    *,
    arrival_s: Any = None,
    cut: float = 3.0,
    memory: bool = False,
) -> Calibration: ...


def calibrate(run: Any, **options: Any) -> RequestCalibration | Calibration:
    """Calibrate the simulator from a live run: a request-batching run's or a generation's.

    Args:
        run: the RunResult of ``labserve.load_test`` on a batchable runner method (in
            process): gives a :class:`RequestCalibration` (``simulate(arrivals,
            **cal.simulate_kwargs())``); or a generation run's steps
            (``runner.generate.stats()``, a GenerationResult, a StepSeries, step records):
            gives a :class:`Calibration` (``cal.cost`` is a StepCost).
        **options: for a RunResult, ``cut``; for steps, ``arrival_s``, ``cut``, ``memory``
            (see :func:`labserve.lab.generation.calibrate.calibrate`).

    Raises:
        TypeError: ``run`` is neither kind, or an option is not one its kind takes.
        ValueError: the run is too short to fit (too few batches or chained steps).

    >>> import labserve
    >>> run = labserve.load_test(runner.predict, example=x, duration_s=10,  # doctest: +SKIP
    ...                          arrivals=labserve.arrivals("poisson", rate_rps=500))
    >>> cal = labserve.calibrate(run)  # doctest: +SKIP
    >>> labserve.simulate(run.arrival_s, **cal.simulate_kwargs())  # doctest: +SKIP
    """
    if isinstance(run, RunResult):
        extra = sorted(set(options) - {"cut"})
        if extra:
            raise TypeError(
                f"calibrate of a request run (a RunResult) takes cut= only, got {', '.join(extra)}="
                " (arrival_s= and memory= are for a generation run's steps)"
            )
        return calibrate_requests(run, **options)
    try:
        return calibrate_steps(run, **options)
    except TypeError as exc:
        if "calibrate takes" not in str(exc):
            raise
        raise TypeError(
            "calibrate takes a request run (the RunResult of labserve.load_test on a runner"
            " method) or a generation run's steps (runner.generate.stats(), a"
            " GenerationResult, a StepSeries or StepRecords), got"
            f" {type(run).__name__}"
        ) from None
