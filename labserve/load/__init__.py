"""Load for a runner: seeded arrival processes (and, later, the open- and closed-loop drivers).

The ``arrivals(kind, **params)`` factory lives in :mod:`labserve.load.arrivals` and is not
re-exported here: its name would shadow the submodule of the same name.
"""

from labserve.load.arrivals import (
    ARRIVAL_KINDS,
    Arrivals,
    BurstArrivals,
    ConstantArrivals,
    PoissonArrivals,
    RampArrivals,
    StepArrivals,
    TraceArrivals,
)

__all__ = [
    "ARRIVAL_KINDS",
    "Arrivals",
    "BurstArrivals",
    "ConstantArrivals",
    "PoissonArrivals",
    "RampArrivals",
    "StepArrivals",
    "TraceArrivals",
]
