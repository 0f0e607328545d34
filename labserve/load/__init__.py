"""Load for a runner or an HTTP server: seeded arrival processes and the load generators.

:mod:`~labserve.load.arrivals` (arrival processes), :mod:`~labserve.load.run` (a load run
of either kind: the open and closed loops, ``LoadRun``), :mod:`~labserve.load.records`
(what a run keeps per request, the sender interface), :mod:`~labserve.load.http_client`
(the HTTP/1.1 keep-alive pool both kinds send over). Request batching:
:mod:`~labserve.load.generator` (``load_test``/``start_load``), :mod:`~labserve.load.http`
(its HTTP sender: the simple route, OIP v2), :mod:`~labserve.load.server_view` (a labserve
server's /stats over a run). Generation servers (``/v1/completions``: TTFT, ITL, TPOT,
goodput): :mod:`labserve.load.generation`.
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
