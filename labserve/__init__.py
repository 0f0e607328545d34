"""labserve: an interactive serving lab with adaptive micro-batching you can watch and tune.

>>> import labserve, numpy as np
>>> class Scorer(labserve.Runnable):
...     @labserve.method(batchable=True, batch_dim=0, max_batch_size=32, max_latency_ms=10)
...     def predict(self, x):
...         return x.sum(axis=1, keepdims=True)
>>> runner = labserve.Runner(Scorer, name="scorer")
>>> runner.predict.run(np.ones((1, 4)))
array([[4.]])
>>> runner.stop()
"""

from labserve._version import __version__
from labserve.base.clock import Clock, MonotonicClock, SimClock
from labserve.base.errors import (
    BatchSizeMismatchError,
    CancelledRequestError,
    ConfigError,
    HostError,
    InputError,
    LabServeError,
    LengthLimitError,
    LoadInterrupted,
    LoadTargetError,
    LoadWarning,
    LoopThreadError,
    MethodNotAllowedError,
    ModelError,
    ModelStuckError,
    NoReplicaError,
    NotFoundError,
    OriginError,
    OutputError,
    OverloadError,
    PaddedOutputError,
    PayloadTooLargeError,
    QueueFullError,
    RemoteError,
    RequestTimeoutError,
    RunnerStoppedError,
    ServerError,
    StopTimeoutError,
    TokenBudgetError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
)
from labserve.base.lengths import parse_length
from labserve.base.vocabulary import OUTCOMES, REASONS, STRATEGIES
from labserve.batching.containers import Padding, TensorSpec
from labserve.config.batching import BatchingConfig
from labserve.config.file import ConfigFile, load_config_file
from labserve.config.generation import (
    GENERATION_STRATEGIES,
    SCHEDULING_POLICIES,
    GenerationConfig,
)
from labserve.generation.api import Completion, Finish, GenerateRequest
from labserve.generation.batch import SeqBatch
from labserve.generation.routing import ReplicaView, Router, make_router
from labserve.generation.sampling import SamplingParams
from labserve.generation.stats import GenerationSnapshot
from labserve.generation.workload import SharedPrefixWorkload
from labserve.lab.calibrate import calibrate
from labserve.lab.calibrate_requests import RequestCalibration
from labserve.lab.export import export_config
from labserve.lab.generation.calibrate import Calibration
from labserve.lab.generation.fidelity import GenerationFidelity, compare_generation
from labserve.lab.generation.load import UntilStopped
from labserve.lab.generation.search import GenerationSearch, PoissonWorkload, search_generation
from labserve.lab.generation.sessions import WorkloadLoad, start_workload_load
from labserve.lab.generation.sources import (
    GenerationSource,
    GenerationView,
    HttpGenerationSource,
    RunnerGenerationSource,
    generation_snapshot_from_dict,
    generation_sources,
)
from labserve.lab.generation.sweep import sweep_generation
from labserve.lab.profiling import CostCurve, profile
from labserve.lab.search import BatchingSearch, search_batching
from labserve.lab.sources import (
    HttpSource,
    MethodSource,
    RunnerSource,
    SourceView,
    method_sources,
)
from labserve.lab.steps import profile_steps
from labserve.lab.sweep import sweep
from labserve.load.arrivals import (
    ARRIVAL_KINDS,
    Arrivals,
    BurstArrivals,
    ConstantArrivals,
    PoissonArrivals,
    RampArrivals,
    StepArrivals,
    TraceArrivals,
    arrivals,
)
from labserve.load.generation import (
    GenerationLoadResult,
    GenerationLoadRun,
    start_generation_load,
)
from labserve.load.generator import LoadRun, load_test, start_load
from labserve.load.presets import LOAD_PRESETS, preset_arrivals
from labserve.metrics.prometheus import SnapshotCollector
from labserve.metrics.results import RunResult
from labserve.metrics.snapshot import (
    BatchRecord,
    CostFitView,
    Percentiles,
    Snapshot,
    snapshot_from_dict,
)
from labserve.runtime.generation.method import GenerativeMethod
from labserve.runtime.generation.streams import AsyncTokenStream, TokenStream
from labserve.runtime.loop import BackgroundLoop, background_loop
from labserve.runtime.runnable import Runnable, method
from labserve.runtime.runner import Runner, RunnerMethod
from labserve.runtime.session import stop_all, track
from labserve.server import Server, serve
from labserve.sim import LinearCost, simulate
from labserve.sim.batch_cost import BatchCost
from labserve.sim.fleet import FleetResult, simulate_fleet
from labserve.sim.generation import (
    StepCost,
    WorkloadSimResult,
    replay_generation,
    simulate_generation,
    simulate_workload,
)

__all__ = [
    "ARRIVAL_KINDS",
    "GENERATION_STRATEGIES",
    "LOAD_PRESETS",
    "OUTCOMES",
    "REASONS",
    "SCHEDULING_POLICIES",
    "STRATEGIES",
    "Arrivals",
    "AsyncTokenStream",
    "BackgroundLoop",
    "BatchCost",
    "BatchRecord",
    "BatchSizeMismatchError",
    "BatchingConfig",
    "BatchingSearch",
    "BurstArrivals",
    "Calibration",
    "CancelledRequestError",
    "Clock",
    "Completion",
    "ConfigError",
    "ConfigFile",
    "ConstantArrivals",
    "CostCurve",
    "CostFitView",
    "Finish",
    "FleetResult",
    "GenerateRequest",
    "GenerationConfig",
    "GenerationFidelity",
    "GenerationLoadResult",
    "GenerationLoadRun",
    "GenerationSearch",
    "GenerationSnapshot",
    "GenerationSource",
    "GenerationView",
    "GenerativeMethod",
    "HostError",
    "HttpGenerationSource",
    "HttpSource",
    "InputError",
    "LabServeError",
    "LengthLimitError",
    "LinearCost",
    "LoadInterrupted",
    "LoadRun",
    "LoadTargetError",
    "LoadWarning",
    "LoopThreadError",
    "MethodNotAllowedError",
    "MethodSource",
    "ModelError",
    "ModelStuckError",
    "MonotonicClock",
    "NoReplicaError",
    "NotFoundError",
    "OriginError",
    "OutputError",
    "OverloadError",
    "PaddedOutputError",
    "Padding",
    "PayloadTooLargeError",
    "Percentiles",
    "PoissonArrivals",
    "PoissonWorkload",
    "QueueFullError",
    "RampArrivals",
    "RemoteError",
    "ReplicaView",
    "RequestCalibration",
    "RequestTimeoutError",
    "Router",
    "RunResult",
    "Runnable",
    "Runner",
    "RunnerGenerationSource",
    "RunnerMethod",
    "RunnerSource",
    "RunnerStoppedError",
    "SamplingParams",
    "SeqBatch",
    "Server",
    "ServerError",
    "SharedPrefixWorkload",
    "SimClock",
    "Snapshot",
    "SnapshotCollector",
    "SourceView",
    "StepArrivals",
    "StepCost",
    "StopTimeoutError",
    "TensorSpec",
    "TokenBudgetError",
    "TokenStream",
    "TraceArrivals",
    "UnauthorizedError",
    "UnsupportedMediaTypeError",
    "UntilStopped",
    "WorkloadLoad",
    "WorkloadSimResult",
    "__version__",
    "arrivals",
    "background_loop",
    "calibrate",
    "compare_generation",
    "export_config",
    "generation_snapshot_from_dict",
    "generation_sources",
    "load_config_file",
    "load_test",
    "make_router",
    "method",
    "method_sources",
    "parse_length",
    "preset_arrivals",
    "profile",
    "profile_steps",
    "replay_generation",
    "search_batching",
    "search_generation",
    "serve",
    "simulate",
    "simulate_fleet",
    "simulate_generation",
    "simulate_workload",
    "snapshot_from_dict",
    "start_generation_load",
    "start_load",
    "start_workload_load",
    "stop_all",
    "sweep",
    "sweep_generation",
    "track",
]
