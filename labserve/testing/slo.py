"""assert_slo: check a RunResult against service-level objectives, with a readable failure."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from labserve.metrics.results import RunResult

__all__ = ["SLOS", "assert_slo"]


@dataclass(frozen=True)
class _Slo:
    name: str
    key: str
    """The RunResult.summary() key it reads."""
    ceiling: bool
    """True: the result must be <= the asked value; False: >=."""

    @property
    def op(self) -> str:
        return "<=" if self.ceiling else ">="


def _slos() -> dict[str, _Slo]:
    table = [_Slo(f"{q}_ms", f"latency_{q}_ms", True) for q in ("p50", "p95", "p99", "p99_9")]
    table += [
        _Slo(f"queue_wait_{q}_ms", f"queue_wait_{q}_ms", True)
        for q in ("p50", "p95", "p99", "p99_9")
    ]
    table += [
        _Slo("rejected_pct", "rejected_pct", True),
        _Slo("failed_pct", "failed_pct", True),
        _Slo("timeout_pct", "timeout_pct", True),
        _Slo("max_batch", "max_batch", True),
        _Slo("mean_batch", "mean_batch", False),
        _Slo("served_rps", "served_rps", False),
        _Slo("goodput_items_ps", "goodput_items_ps", False),
    ]
    return {s.name: s for s in table}


_SLOS = _slos()
SLOS: dict[str, str] = {s.name: f"{s.key} {s.op}" for s in _SLOS.values()}
"""Each SLO name :func:`assert_slo` takes -> the ``RunResult.summary()`` key and the check."""


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"SLO {name} must be a number, got {value!r}")
    return float(value)


def _show(value: float) -> str:
    return f"{value:,.4g}" if not math.isnan(value) else "nan (nothing measured)"


def assert_slo(result: RunResult, **slos: float) -> None:
    """Raise AssertionError naming every SLO that ``result`` breaks, with its summary table.

    Latencies (``p99_ms``, ``queue_wait_p99_ms``, ...), ``rejected_pct``, ``failed_pct`` and
    ``max_batch`` are ceilings (the result must be <= the value); ``mean_batch``,
    ``served_rps`` and ``goodput_items_ps`` are floors (>=). :data:`SLOS` lists them all with
    the ``RunResult.summary()`` key each reads. A NaN in the result (e.g. no request served,
    so no latency) breaks the SLO. Needs no pytest; under pytest the traceback starts at the
    caller.

    Raises:
        AssertionError: one line per broken SLO (asked vs got), then ``result.table()``.
        TypeError: ``result`` is not a RunResult, no SLO was given, a name is unknown
            (the message lists the known ones) or a value is not a number.

    >>> result = labserve.simulate(times, cost=(2, 0.1), max_latency_ms=10)  # doctest: +SKIP
    >>> assert_slo(result, p99_ms=15, mean_batch=4, rejected_pct=0)  # doctest: +SKIP
    """
    __tracebackhide__ = True  # pytest: show the caller's line, not this function's
    if not isinstance(result, RunResult):
        raise TypeError(f"assert_slo needs a labserve.RunResult, got {type(result).__name__}")
    if not slos:
        raise TypeError("assert_slo needs at least one SLO, e.g. assert_slo(result, p99_ms=50)")
    unknown = sorted(set(slos) - set(_SLOS))
    if unknown:
        raise TypeError(f"unknown SLO {', '.join(map(repr, unknown))}; known: {', '.join(_SLOS)}")
    asked = {name: _number(name, value) for name, value in slos.items()}
    summary = result.summary()
    broken = []
    for name, want in asked.items():
        slo = _SLOS[name]
        got = float(summary[slo.key])
        ok = got <= want if slo.ceiling else got >= want  # False for NaN
        if not ok:
            broken.append(f"  {name}: asked {slo.op} {_show(want)}, got {_show(got)}")
    if broken:
        label = f" ({result.label})" if result.label else ""
        raise AssertionError(
            f"{len(broken)} of {len(asked)} SLOs broken{label}:\n"
            + "\n".join(broken)
            + "\n\nsummary:\n"
            + result.table()
        )
