"""Load for a generation server: streamed completions, measured as TTFT, ITL, TPOT and goodput.

What only a generation load has lives here; what every load run shares does not (the
open and closed loops and the run's handle, :mod:`labserve.load.run`; the keep-alive
pool, :mod:`labserve.load.http_client`). :mod:`~labserve.load.generation.start` (starting
one: ``start_generation_load``, ``generation_load_test``),
:mod:`~labserve.load.generation.sender` (the model, ``/stats``, each request's stream),
:mod:`~labserve.load.generation.prompts` (what each request asks),
:mod:`~labserve.load.generation.stream` (a stream's events into the run's record, parsed by
:mod:`~labserve.load.generation.sse`), :mod:`~labserve.load.generation.result` (what the
client measured) and :mod:`~labserve.load.generation.server_view` (the server's own view).
"""

from labserve.load.generation.result import GenerationLoadResult
from labserve.load.generation.start import (
    GenerationLoadRun,
    generation_load_test,
    is_generation_url,
    start_generation_load,
)

__all__ = [
    "GenerationLoadResult",
    "GenerationLoadRun",
    "generation_load_test",
    "is_generation_url",
    "start_generation_load",
]
