"""The settings search across a fleet: how many replicas, which router, each replica's knobs.

:func:`~labserve.lab.generation.search.search_generation` searches here when its grid names
``replicas`` or ``router``, or its workload is a
:class:`~labserve.generation.workload.SharedPrefixWorkload` (tenants' shared prefixes,
sessions of several turns). A point is ``duration_s`` simulated seconds of
:func:`~labserve.sim.fleet.simulate_fleet` (one real scheduler and prefix cache per replica
behind the router, on one virtual clock), sessions starting as Poisson arrivals at the rate
searched (sessions/s; a session's later turns follow its replies), judged by the single
replica's goodput rule (:func:`~labserve.lab.generation.judging.attained`) over every turn.
Rates lie on the same lattice. The single replica's other shortcuts are not taken here: a
fleet run is not stopped by its misses and not shared across caps, so a point costs about
what the fleet's steps cost to plan, replicas times a single replica's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labserve.config.generation import GenerationConfig
from labserve.generation.routing import make_router
from labserve.generation.workload import SharedPrefixWorkload
from labserve.lab.generation.judging import Point, attained, squeezed_poisson
from labserve.sim.fleet import FleetResult, simulate_fleet
from labserve.sim.generation import StepCost

__all__ = ["FLEET_KNOBS", "FleetJudge", "FleetSetting", "fleet_settings"]

FLEET_KNOBS: tuple[str, ...] = ("replicas", "router")
"""The fleet's settings a grid may vary beside each replica's: set where it is deployed."""


@dataclass(frozen=True)
class FleetSetting:
    """One candidate fleet: ``replicas`` copies of ``config`` behind the router ``router``."""

    config: GenerationConfig
    replicas: int
    router: str


def fleet_settings(
    configs: Sequence[GenerationConfig], grid: Mapping[str, Sequence[Any]]
) -> list[FleetSetting]:
    """Every replica setting with every fleet one (default: one replica, round robin).

    One replica has no choice to route: it runs once, under the first router named.

    Raises:
        ValueError: a replica count that is not an integer >= 1.
        ConfigError: an unknown router name (``make_router``'s error).
    """
    replicas = list(grid.get("replicas", [1]))
    bad = [r for r in replicas if isinstance(r, bool) or not isinstance(r, int) or r < 1]
    if bad:
        raise ValueError(f"grid replicas must be integers >= 1, got {bad}")
    routers = [str(r) for r in grid.get("router", ["round_robin"])]
    for name in routers:
        make_router(name)  # an unknown name fails here, before anything runs
    return [
        FleetSetting(config, n, router)
        for n in replicas
        for router in (routers if n > 1 else routers[:1])
        for config in configs
    ]


@dataclass
class FleetJudge:
    """Runs one fleet setting at a rate (sessions/s); says whether it met the targets.

    ``points`` holds each rate's attainment and its turns' GenerationResult, ``fleets``
    each rate's whole FleetResult (hit rate, load per replica).
    """

    setting: FleetSetting
    sessions: SharedPrefixWorkload
    cost: StepCost
    targets: dict[str, float]
    attainment: float
    duration_s: float
    warmup_s: float
    seed: int
    points: dict[float, Point] = field(default_factory=dict)
    fleets: dict[float, FleetResult] = field(default_factory=dict)
    simulated: int = 0

    @property
    def config(self) -> GenerationConfig:
        """Each replica's setting."""
        return self.setting.config

    def __call__(self, rate: float) -> bool:
        """Whether the fleet met the targets at ``rate`` (each rate runs once)."""
        point = self.points.get(rate)
        if point is None:
            fleet = self.run(rate)
            self.simulated += 1
            point = Point(attained(fleet.generation, self.targets, self.warmup_s), fleet.generation)
            self.points[rate], self.fleets[rate] = point, fleet
        return point.attainment >= self.attainment

    def run(self, rate: float) -> FleetResult:
        """The fleet's run at ``rate``: a new router each time (a router keeps its history)."""
        s = self.setting
        return simulate_fleet(
            s.config,
            self.cost,
            self.sessions,
            arrival_s=squeezed_poisson(rate, self.duration_s, self.seed),
            replicas=s.replicas,
            router=s.router,
            seed=self.seed,
            measure_from_s=self.warmup_s,
        )

    def row_extras(self, rate: float) -> dict[str, Any]:
        """The fleet's columns at ``rate``: replicas, router, hit rate, tokens/s per replica."""
        s, fleet = self.setting, self.fleets.get(rate)
        out: dict[str, Any] = {"replicas": s.replicas, "router": s.router}
        out["rate_per_replica"] = rate / s.replicas
        if fleet is None:
            out.update(hit_rate=math.nan, tokens_per_s=0.0)
            return out
        summary = fleet.summary()
        out["hit_rate"] = summary["hit_rate"]
        out["tokens_per_s"] = summary["output_tokens_per_s"] / s.replicas
        return out


def mean_lengths(sessions: SharedPrefixWorkload, seed: int) -> tuple[float, float]:
    """A first turn's mean prompt (prefix included) and output length, for first guesses."""
    rng = np.random.default_rng([seed, 2])
    prompt = sessions.prefix_len + float(np.mean(sessions.input_len.sample(rng, 1000)))
    return prompt, float(np.mean(sessions.output_len.sample(rng, 1000)))
