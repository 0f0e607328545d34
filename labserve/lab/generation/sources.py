"""Generation sources: a generative method to watch and tune, in this process or by URL.

The counterpart of :mod:`labserve.lab.sources` for methods served by continuous batching
(``@labserve.method(generative=True)``). A :class:`GenerationSource` gives what a dashboard
needs: the :class:`~labserve.config.generation.GenerationConfig` asked for, a live change
(applied at the next step), a view (a :class:`~labserve.generation.stats.GenerationSnapshot`),
a reset, and load (a length mix at a rate). :class:`RunnerGenerationSource` watches a
runner's method in this process; :class:`HttpGenerationSource` a labserve server's by URL
(``GET /stats``, ``GET``/``PATCH /config``, load on ``/v1/completions``).
:func:`generation_sources` makes them from what a user has.

>>> import labserve                                                 # doctest: +SKIP
>>> [src] = labserve.generation_sources(runner)          # or a URL, a Server
>>> src.configure(max_num_seqs=8); src.view().snapshot.num_running
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from labserve.base.lengths import LengthDist
from labserve.config.generation import GENERATION_SETTINGS, GenerationConfig
from labserve.generation.results import StepSeries
from labserve.generation.stats import GenerationSnapshot
from labserve.generation.workload import SharedPrefixWorkload
from labserve.lab.generation.load import LoadLike, start_runner_generation_load
from labserve.lab.generation.sessions import start_workload_load
from labserve.lab.sources import (
    HttpMethodBase,
    RunnerMethodBase,
    base_url,
    is_generative_config,
    request_json,
)
from labserve.load.arrivals import Arrivals
from labserve.load.generation import start_generation_load
from labserve.runtime.generation.method import GenerativeMethod
from labserve.runtime.runner import Runner
from labserve.server import Server

__all__ = [
    "GenerationSource",
    "GenerationView",
    "HttpGenerationSource",
    "RunnerGenerationSource",
    "generation_snapshot_from_dict",
    "generation_sources",
]


@dataclass(frozen=True)
class GenerationView:
    """One look at a generative method: its snapshot and the config asked for."""

    snapshot: GenerationSnapshot
    config: GenerationConfig
    """The config asked for: a live change shows here at once, in the snapshot's config once
    the driver took it (at the next step)."""
    replicas: Mapping[str, GenerationSnapshot] = field(default_factory=dict)
    """Each replica's own snapshot, by replica id (empty for a method in one process)."""
    stale: frozenset[str] = frozenset()
    """Replicas that stopped reporting (their gauges read 0; their counts stay merged)."""


@runtime_checkable
class GenerationSource(Protocol):
    """A generative method to watch and tune, wherever it runs. Every method is thread-safe.

    ``name`` is ``"runner.method"``; ``resettable`` says whether :meth:`reset_stats` resets
    the method's figures (a remote server's cannot be reset from here).
    """

    name: str
    runner: str
    method: str
    resettable: bool

    @property
    def config(self) -> GenerationConfig:
        """The config asked for (what :meth:`configure` last set, here or elsewhere)."""
        ...

    @property
    def alive(self) -> bool:
        """False once the method cannot answer any more (its runner or server stopped)."""
        ...

    def configure(self, **changes: Any) -> GenerationConfig:
        """Change settings at the next step; a refusal (ConfigError) changes nothing."""
        ...

    def view(self) -> GenerationView:
        """The method as it is now."""
        ...

    def reset_stats(self) -> None:
        """Start the figures over (only when ``resettable``)."""
        ...

    def start_load(
        self,
        *,
        arrivals: Arrivals,
        duration_s: float,
        input_len: LengthDist | str | int,
        output_len: LengthDist | str | int,
        seed: int = 0,
        workload: SharedPrefixWorkload | None = None,
    ) -> LoadLike:
        """Send generations whose prompt and output lengths are drawn from the two mixes.

        ``workload``: send its sessions instead (its lengths, not the two mixes); a
        ``seed`` other than 0 draws other sessions of the same tenants
        (:meth:`~labserve.generation.workload.SharedPrefixWorkload.next_sessions`).
        """
        ...


class RunnerGenerationSource(RunnerMethodBase[GenerationConfig]):
    """A runner's generative method in this process, as a :class:`GenerationSource`.

    Load calls the method's ``async_run`` on the runner's background loop.
    """

    def __init__(self, method: GenerativeMethod, server: Server | None = None) -> None:
        if not getattr(method, "generative", False):
            raise TypeError(f"{method!r} is not a generative method")
        super().__init__(method, server)
        self.generative_method = method

    def view(self) -> GenerationView:
        """The method's snapshot and the config asked for."""
        snap = self.generative_method.stats()
        return GenerationView(snapshot=snap, config=self.generative_method.config)

    def start_load(
        self,
        *,
        arrivals: Arrivals,
        duration_s: float,
        input_len: LengthDist | str | int,
        output_len: LengthDist | str | int,
        seed: int = 0,
        workload: SharedPrefixWorkload | None = None,
    ) -> LoadLike:
        """Generations through ``async_run`` on the runner's loop (``lab/generation/load.py``).

        With ``workload``, its sessions (``lab/generation/sessions.py``).
        """
        if workload is not None:
            return start_workload_load(
                self.generative_method,
                workload.next_sessions(seed) if seed else workload,
                arrivals=arrivals,
                duration_s=duration_s,
            )
        return start_runner_generation_load(
            self.generative_method,
            arrivals=arrivals,
            duration_s=duration_s,
            input_len=input_len,
            output_len=output_len,
            seed=seed,
        )


class HttpGenerationSource(HttpMethodBase[GenerationConfig]):
    """A generative method of a labserve server, by its URL.

    Load streams completions from ``/v1/completions`` of ``model`` (the name the server
    lists it under) through labserve's generation load generator. See
    :class:`~labserve.lab.sources.HttpMethodBase`.
    """

    kind = "generative"

    def __init__(
        self,
        url: str,
        runner: str,
        method: str,
        *,
        model: str | None = None,
        token: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        super().__init__(url, runner, method, token=token, timeout_s=timeout_s)
        self.model = model if model is not None else self.name

    def _make_config(self, entry: Mapping[str, Any]) -> GenerationConfig:
        return GenerationConfig(**{k: v for k, v in entry.items() if k in GENERATION_SETTINGS})

    def view(self) -> GenerationView:
        """``GET /stats`` and ``GET /config``."""
        stats = self._get("/stats")
        config = self.config
        snap = generation_snapshot_from_dict(self._entry(stats))
        replicas: dict[str, GenerationSnapshot] = {}
        stale = set()
        for rid, rview in dict(stats.get("replicas") or {}).items():  # Ray's proxy: each one's
            own = (rview.get(self.runner) or {}).get(self.method)
            if own is not None:
                replicas[rid] = generation_snapshot_from_dict(own)
                if rview.get("stale"):
                    stale.add(rid)
        return GenerationView(snap, config, replicas, frozenset(stale))

    def start_load(
        self,
        *,
        arrivals: Arrivals,
        duration_s: float,
        input_len: LengthDist | str | int,
        output_len: LengthDist | str | int,
        seed: int = 0,
        workload: SharedPrefixWorkload | None = None,
    ) -> LoadLike:
        """Streamed completions from ``/v1/completions`` (labserve's generation load generator).

        With ``workload``, its sessions as chats on ``/v1/chat/completions`` (the prefix as
        the system message, rendered by the model's chat template where it has one).
        """
        if workload is not None:
            return start_generation_load(
                f"{self.url}/v1/chat/completions",
                duration_s=duration_s,
                arrivals=arrivals,
                model=self.model,
                seed=seed,
                token=self.token,
                workload=workload.next_sessions(seed) if seed else workload,
            )
        return start_generation_load(
            f"{self.url}/v1/completions",
            duration_s=duration_s,
            arrivals=arrivals,
            input_len=input_len,
            output_len=output_len,
            model=self.model,
            seed=seed,
            token=self.token,
        )


def _nan(value: Any) -> float:
    return math.nan if value is None else float(value)


def generation_snapshot_from_dict(data: Mapping[str, Any]) -> GenerationSnapshot:
    """A :class:`GenerationSnapshot` from its ``as_dict()`` (``GET /stats``'s entry).

    The steps are the few ``recent_steps`` the dict holds (with their times when the server
    sends them; without, the steps are dated at the snapshot's time); the histograms are
    not in the dict and come back empty.
    """
    recent = dict(data.get("recent_steps") or {})
    n = len(recent.get("num_seqs", ()))

    def ints(key: str) -> Any:
        return np.asarray(recent.get(key, [0] * n), dtype=np.int64)

    time_s = float(data["time_s"])
    end = np.asarray(recent.get("end_s", [time_s] * n), dtype=np.float64)
    step_ms = np.asarray(recent.get("step_ms", [0.0] * n), dtype=np.float64)
    start = np.asarray(recent.get("start_s", end - step_ms / 1000.0), dtype=np.float64)
    zeros = np.zeros(n, np.int64)
    steps = StepSeries(
        start_s=start,
        end_s=end,
        num_seqs=ints("num_seqs"),
        num_prefill_tokens=ints("num_prefill_tokens"),
        num_decode_tokens=ints("num_decode_tokens"),
        num_running=zeros,
        num_waiting=zeros,
        kv_blocks_used=zeros,
        num_preempted=zeros,
        num_context_tokens=zeros,
    )
    config = GenerationConfig(
        **{k: v for k, v in dict(data["config"]).items() if k in GENERATION_SETTINGS}
    )
    percentiles = {
        m: {q: _nan(v) for q, v in dict(qs).items()}
        for m, qs in dict(data.get("percentiles_ms") or {}).items()
    }
    return GenerationSnapshot(
        runner=str(data["runner"]),
        method=str(data["method"]),
        time_s=time_s,
        config=config,
        num_running=int(data["num_running"]),
        num_waiting=int(data["num_waiting"]),
        kv_blocks_used=int(data["kv_blocks_used"]),
        outcomes={str(k): int(v) for k, v in dict(data.get("outcomes") or {}).items()},
        num_preemptions=int(data.get("num_preemptions", 0)),
        prompt_tokens=int(data.get("prompt_tokens", 0)),
        output_tokens=int(data.get("output_tokens", 0)),
        window_s=float(data.get("window_s", 0.0)),
        percentiles_ms=percentiles,
        output_tokens_per_s=_nan(data.get("output_tokens_per_s")),
        prompt_tokens_per_s=_nan(data.get("prompt_tokens_per_s")),
        requests_per_s=_nan(data.get("requests_per_s")),
        goodput=_nan(data.get("goodput")),
        kv_blocks_total=int(data.get("kv_blocks_total", 0)),
        kv_bytes=int(data.get("kv_bytes", 0)),
        kv_memory="model" if data.get("kv_memory") == "model" else "accounting",
        prefix_cache_queries=int(data.get("prefix_cache_queries", 0)),
        prefix_cache_hits=int(data.get("prefix_cache_hits", 0)),
        prefix_cache_hit_rate=_nan(data.get("prefix_cache_hit_rate")),
        prefill_tokens_saved_per_s=float(data.get("prefill_tokens_saved_per_s") or 0.0),
        kv_blocks_cached=int(data.get("kv_blocks_cached", 0)),
        steps=steps,
        histograms={},
    )


def generation_sources(target: Any, *, token: str | None = None) -> list[GenerationSource]:
    """The generative methods of ``target`` as sources, one per method, in its order.

    ``target``: a Runner, a generative method (``runner.generate``), a Server (its runners,
    in process), the URL of a labserve server or of Ray's proxy (``token`` for changes), a
    GenerationSource, anything with a ``generation_sources()`` method
    (``labserve.ray.RayApp``), or a list of these.

    Raises:
        TypeError: ``target`` is none of these.
        ValueError: it has no generative method.
        RemoteError: the URL did not answer ``GET /config``.
    """
    sources: list[GenerationSource]
    if isinstance(target, str):
        base = base_url(target)
        configs = request_json(base, "/config", token=token, timeout_s=5.0)
        sources = []
        for runner, methods in configs.items():
            gens = [m for m, config in methods.items() if is_generative_config(config)]
            for m in gens:  # the model's name, as the server lists it (/v1/models)
                model = runner if len(gens) == 1 else f"{runner}.{m}"
                sources.append(HttpGenerationSource(base, runner, m, model=model, token=token))
    elif isinstance(target, GenerationSource):
        sources = [target]
    elif isinstance(target, GenerativeMethod):
        sources = [RunnerGenerationSource(target)]
    elif isinstance(target, Server):
        sources = [
            RunnerGenerationSource(g, server=target)
            for r in target.runners.values()
            for g in r.generators.values()
        ]
    elif isinstance(target, Runner):
        sources = [RunnerGenerationSource(g) for g in target.generators.values()]
    elif callable(getattr(target, "generation_sources", None)):  # labserve.ray.RayApp
        sources = list(target.generation_sources())
    elif isinstance(target, (list, tuple)) and target:
        sources = [s for item in target for s in generation_sources(item, token=token)]
    else:
        raise TypeError(
            "a generation source needs a Runner, a generative method, a Server, a URL, a "
            f"GenerationSource or a list of them, got {type(target).__name__}"
        )
    if not sources:
        raise ValueError(f"no generative method to watch in {target!r}")
    return sources
