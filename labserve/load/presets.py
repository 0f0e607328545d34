"""Named load shapes for one rate knob: what a dashboard's load menu (or a lesson) offers.

Each preset turns a single "rate" into an arrival process with a recognisable shape, and
repeats with a period, so that a load run of any whole number of periods (or one chained
period after period until stopped) shows the same shape again and again. Pure: no clock,
no threads.

>>> preset_arrivals("step", 1000.0, period_s=30.0)
StepArrivals(rates=((0.0, 250.0), (10.0, 1000.0), (20.0, 250.0)), poisson=True)
"""

from __future__ import annotations

import math

from labserve.load.arrivals import Arrivals, arrivals

__all__ = ["CLOSED_LOOP", "LOAD_PRESETS", "PRESET_PERIOD_S", "preset_arrivals"]

CLOSED_LOOP = "closed loop"
"""The preset that is not an arrival process: N clients, each sending on its last reply."""

LOAD_PRESETS: tuple[str, ...] = ("poisson", "constant", "step", "burst", CLOSED_LOOP)
"""The load shapes offered, in menu order."""

PRESET_PERIOD_S = 30.0
"""One period of the repeating shapes (step: thirds of it; burst: every 5 s), seconds."""

_BURST_EVERY_S = 5.0
_BURST_LENGTH_S = 1.0


def preset_arrivals(
    pattern: str, rate_rps: float, *, period_s: float = PRESET_PERIOD_S
) -> Arrivals:
    """The arrival process for a preset at ``rate_rps``, shaped over ``period_s`` seconds.

    ``poisson`` and ``constant``: that rate throughout. ``step``: a quarter of the rate, the
    rate, a quarter again, in thirds of ``period_s``. ``burst``: a quarter of the rate, with
    1 s bursts at twice it every 5 s. ``closed loop`` has no arrival process (it is a number
    of clients): asking for it raises.

    Raises:
        ValueError: ``pattern`` is not an arrival preset, or ``rate_rps`` or ``period_s``
            breaks its rule (a finite number > 0).
    """
    if pattern not in LOAD_PRESETS or pattern == CLOSED_LOOP:
        known = ", ".join(p for p in LOAD_PRESETS if p != CLOSED_LOOP)
        raise ValueError(f"pattern must be one of {known}, got {pattern!r}")
    for name, value in (("rate_rps", rate_rps), ("period_s", period_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    rate = float(rate_rps)
    if pattern == "step":
        third = float(period_s) / 3
        return arrivals("step", rates=[(0.0, rate / 4), (third, rate), (2 * third, rate / 4)])
    if pattern == "burst":
        return arrivals(
            "burst",
            base_rps=rate / 4,
            burst_rps=2 * rate,
            every_s=_BURST_EVERY_S,
            length_s=_BURST_LENGTH_S,
        )
    return arrivals(pattern, rate_rps=rate)
