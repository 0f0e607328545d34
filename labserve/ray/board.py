"""The stats board: one small Ray actor per application that every replica reports to.

A request through Ray's proxy reaches one replica, which cannot see its siblings; so each
replica sends its snapshots here every ``push_interval_s`` (and before answering
``/stats``), and ``/stats``, ``/metrics`` and :meth:`RayApp.stats` read the board. A
replica that stops reporting (killed, scaled down) keeps its last counts in the totals
(the requests it served were served) but is marked ``stale``; its queue and in-flight
gauges stop counting. It also holds the application's plan and redeploys it for a live change. Its
methods run one at a time on the actor (Ray's default for a sync actor): no lock needed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from labserve.config.batching import BatchingConfig
from labserve.generation.stats import GenerationSnapshot
from labserve.metrics.snapshot import Snapshot
from labserve.ray.generation.stats import generation_payload, merge_generation_snapshots
from labserve.ray.plan import Plan
from labserve.ray.stats import merge_snapshots, stats_payload

__all__ = ["StatsBoard"]


class StatsBoard:
    """Latest snapshots of every replica of one application (wrapped by ``ray.remote``)."""

    def __init__(self, plan: Plan, stale_after_s: float = 2.0) -> None:
        self.plan = plan
        self.runner = plan.spec.runner
        self.stale_after_s = stale_after_s
        self._latest: dict[str, tuple[float, list[Snapshot]]] = {}
        self._generation: dict[str, list[GenerationSnapshot]] = {}

    def deploy(self) -> None:
        """Run the plan (the first deployment, or a live change)."""
        self.plan.run()

    def configure(self, method: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Change ``method``'s config on every replica; return every method's new config.

        ConfigError (nothing changed) for a bad setting. Through Ray Serve's
        ``user_config``: running replicas apply it at their next batch boundary; ones
        started later begin with it.
        """
        plan = self.plan.with_change(method, changes)
        plan.run()
        self.plan = plan
        return self.configs()

    def reset_stats(self) -> None:
        """Start every replica's counts over (through ``user_config``), and forget their reports."""
        plan = self.plan.with_reset()
        plan.run()
        self.plan = plan
        self._latest.clear()
        self._generation.clear()

    def configs(self) -> dict[str, Any]:
        """``GET /config``'s shape: ``{runner: {method: settings}}``, as deployed."""
        both = {**self.plan.configs, **self.plan.generation}
        return {self.runner: {m: c.as_dict() for m, c in both.items()}}

    def put(
        self,
        replica: str,
        snaps: Sequence[Snapshot],
        generation: Sequence[GenerationSnapshot] = (),
    ) -> None:
        """Record one replica's snapshots (called by the replica)."""
        self._latest[replica] = (time.monotonic(), list(snaps))
        self._generation[replica] = list(generation)

    def _generation_views(self) -> dict[str, list[GenerationSnapshot]]:
        stale = {rid for rid, age in self.replicas().items() if age > self.stale_after_s}
        return {
            rid: [
                dataclasses.replace(s, num_running=0, num_waiting=0, kv_blocks_used=0)
                if rid in stale
                else s
                for s in snaps
            ]
            for rid, snaps in self._generation.items()
            if snaps
        }

    def merged_generation(self) -> list[GenerationSnapshot]:
        """One merged snapshot per generative method (none before a replica reported)."""
        by_method: dict[str, list[GenerationSnapshot]] = {}
        for snaps in self._generation_views().values():
            for s in snaps:
                by_method.setdefault(s.method, []).append(s)
        return [merge_generation_snapshots(v) for v in by_method.values()]

    def per_replica_generation(self) -> dict[str, list[GenerationSnapshot]]:
        """Each replica's own generation snapshots (a stale one's gauges zeroed)."""
        return self._generation_views()

    def _views(self) -> dict[str, list[Snapshot]]:
        now = time.monotonic()
        views = {}
        for rid, (when, snaps) in self._latest.items():
            if now - when > self.stale_after_s:
                snaps = [
                    dataclasses.replace(
                        s, queue_requests=0, queue_items=0, in_flight_batches=0, stuck_batches=0
                    )
                    for s in snaps
                ]
            views[rid] = snaps
        return views

    def replicas(self) -> dict[str, float]:
        """Each replica that reported, and how many seconds ago."""
        now = time.monotonic()
        return {rid: now - when for rid, (when, _) in self._latest.items()}

    def merged(self) -> list[Snapshot]:
        """One merged snapshot per batchable method (none before a replica reported)."""
        by_method: dict[str, list[Snapshot]] = {}
        for snaps in self._views().values():
            for s in snaps:
                by_method.setdefault(s.method, []).append(s)
        return [merge_snapshots(v) for v in by_method.values()]

    def per_replica(self) -> dict[str, list[Snapshot]]:
        """Each replica's own snapshots (a stale one's gauges zeroed)."""
        return self._views()

    def watch(self) -> tuple[dict[str, BatchingConfig], dict[str, dict[str, Snapshot]], set[str]]:
        """The configs asked, each method's snapshot by replica, and the stale replicas."""
        by_method: dict[str, dict[str, Snapshot]] = {}
        for rid, snaps in self._views().items():
            for s in snaps:
                by_method.setdefault(s.method, {})[rid] = s
        stale = {rid for rid, age in self.replicas().items() if age > self.stale_after_s}
        return dict(self.plan.configs), by_method, stale

    def payload(self) -> dict[str, Any]:
        """The JSON of ``/stats``: merged per method, then ``replicas`` with each one's."""
        out = stats_payload(self.runner, self._views())
        generation = generation_payload(self.runner, self._generation_views())
        out[self.runner].update(generation[self.runner])
        for rid, view in generation["replicas"].items():
            mine = out["replicas"].setdefault(rid, {self.runner: {}})
            mine[self.runner].update(view[self.runner])
        ages = self.replicas()
        for rid, view in out["replicas"].items():
            view["age_s"] = round(ages[rid], 3)
            view["stale"] = ages[rid] > self.stale_after_s
        return out

    def reset(self) -> None:
        """Forget every replica's report (they report again within an interval)."""
        self._latest.clear()
        self._generation.clear()
