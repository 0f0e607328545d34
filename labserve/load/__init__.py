"""Load for a runner or an HTTP server: seeded arrival processes and the load generator.

:mod:`~labserve.load.arrivals` (arrival processes), :mod:`~labserve.load.generator` (open
and closed loop, ``load_test``/``start_load``), :mod:`~labserve.load.http` and
:mod:`~labserve.load.http_conn` (the HTTP side), :mod:`~labserve.load.server_view` (a
labserve server's /stats over a run), :mod:`~labserve.load.records` (per-request records);
for generation servers (``/v1/completions``: TTFT, ITL, TPOT, goodput),
:mod:`~labserve.load.generation` and the modules it names.
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
