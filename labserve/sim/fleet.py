"""A fleet on virtual time: N copies of the generation scheduler behind a router.

Each replica is the real :class:`~labserve.generation.scheduler.Scheduler` with its own
KV pool and prefix cache, stepping at the times a
:class:`~labserve.sim.generation.StepCost` says; the router is one of
:mod:`labserve.generation.routing`'s, the same scoring code a Ray Serve deployment runs. A
turn is routed at its arrival time on what each replica holds then (running, waiting,
routed but not yet admitted, KV used), and admitted at that replica's next step boundary,
as the single-replica simulator admits it. A separate function rather than a
``replicas=`` argument to :func:`~labserve.sim.generation.simulate_workload`: the single
simulator stays as fast and simple as it is, and one replica here gives exactly its result
(a test checks it). Same seed, same result.

>>> from labserve.config.generation import GenerationConfig
>>> from labserve.generation.workload import SharedPrefixWorkload
>>> w = SharedPrefixWorkload(prefix_len=32, num_prefixes=2, input_len=8, output_len=4)
>>> r = simulate_fleet(GenerationConfig(enable_prefix_caching=True), StepCost(5.0), w,
...                    arrival_s=[0.0, 0.5, 1.0, 1.5, 2.0, 2.5], replicas=2, router="prefix")
>>> [w.tenant(k) for k in range(6)], r.replica.tolist()  # each tenant keeps its replica
([0, 1, 1, 0, 1, 0], [1, 0, 0, 1, 0, 1])
>>> [round(s.hit_rate, 2) for s in r.per_replica()]  # 32 of 40 tokens, after the first
[0.53, 0.53]
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from labserve.base.errors import ConfigError, LengthLimitError, QueueFullError
from labserve.config.generation import GenerationConfig
from labserve.generation.results import GenerationResult, StepSeries
from labserve.generation.routing import PrefixRouter, ReplicaView, Router, make_router
from labserve.generation.scheduler import Scheduler
from labserve.generation.sequence import Finished, StepPlan, StepRecord
from labserve.generation.workload import SharedPrefixWorkload
from labserve.sim.generation import StepCost, WorkloadSimResult, session_arrivals

__all__ = ["FleetResult", "ReplicaSummary", "simulate_fleet"]


@dataclass
class _Turn:
    """One routed turn: its session, turn index, prompt ids (replies appended) and length."""

    at: float
    session: int
    turn: int
    ids: list[int]
    prompt_len: int
    replica: int


class _Replica:
    """One replica: its scheduler, the turns routed to it not yet admitted, its load area."""

    def __init__(
        self, index: int, config: GenerationConfig, cost: StepCost, max_model_len: int, seed: int
    ) -> None:
        self.index = index
        self.name = str(index)
        self.sched = Scheduler(config, max_model_len=max_model_len)
        # Replica 0 draws as the single simulator does, so one replica gives its result.
        self.spread = np.random.default_rng([seed, 35] if index == 0 else [seed, 35, index])
        self.step_time = cost.timer(self.spread)
        self.inbox: list[int] = []  # seq ids routed here, admitted at the next boundary
        self.plan: StepPlan | None = None  # the step in flight
        self.busy = False  # an event (a step's end, or a wake) is on the heap
        self.steps: list[StepRecord] = []
        self.load_area = 0.0  # integral of (running + waiting + inbox) dt since measure_from
        self.load_since = 0.0

    @property
    def load(self) -> int:
        return self.sched.num_running + self.sched.num_waiting + len(self.inbox)

    def view(self) -> ReplicaView:
        s = self.sched
        return ReplicaView(
            self.name,
            running=s.num_running,
            waiting=s.num_waiting + len(self.inbox),
            kv_blocks_used=s.kv_blocks_used,
            kv_blocks_total=s.kv_blocks_total,
        )

    def account(self, now: float, measure_from: float) -> None:
        """Add the load held since the last change (what a load change calls first)."""
        start = max(self.load_since, measure_from)
        if now > start:
            self.load_area += self.load * (now - start)
        self.load_since = max(self.load_since, now)


class _Fleet:
    """The event loop of :func:`simulate_fleet`."""

    def __init__(
        self,
        config: GenerationConfig,
        cost: StepCost,
        workload: SharedPrefixWorkload,
        replicas: int,
        router: Router,
        max_model_len: int,
        seed: int,
        measure_from_s: float,
    ) -> None:
        self.cost = cost
        self.workload = workload
        self.router = router
        self.measure_from = measure_from_s
        self.replicas = [_Replica(i, config, cost, max_model_len, seed) for i in range(replicas)]
        # (time, kind, order, index): kind 0 an arrival (session index, turn in `turns`),
        # kind 1 a replica's event; arrivals first at one time, as the single simulator
        # admits every turn due at a step boundary.
        self.events: list[tuple[float, int, int, int, int]] = []
        self._order = 0
        self.turns: list[_Turn] = []
        self.replies: dict[int, list[list[int]]] = {}
        self.replies_made: dict[int, list[int]] = {}
        self.finished: list[Finished] = []
        self.refused = 0

    def push(self, at: float, kind: int, a: int, b: int = 0) -> None:
        self._order += 1
        heapq.heappush(self.events, (at, kind, self._order, a, b))

    # -- arrivals ---------------------------------------------------------------------------

    def arrive(self, at: float, k: int, turn: int) -> None:
        self.push(at, 0, k, turn)

    def route(self, now: float, k: int, t: int) -> None:
        """Route a turn at its arrival time; the replica admits it at its next boundary."""
        ids = self.workload.prompt_ids(k, t, self.replies.setdefault(k, []))
        views = [r.view() for r in self.replicas]
        index = int(self.router.choose(ids, views, now))
        self.router.routed(str(index), ids, now)
        replica = self.replicas[index]
        replica.account(now, self.measure_from)
        self.turns.append(_Turn(now, k, t, ids, len(ids), index))
        replica.inbox.append(len(self.turns) - 1)
        if not replica.busy:  # an idle replica wakes for it
            replica.busy = True
            self.push(now + self.cost.wake_ms / 1000.0, 1, index)

    def route_due(self, now: float) -> None:
        """Route the arrivals due by ``now`` (the single simulator admits them at once)."""
        events = self.events
        while events and events[0][0] <= now and events[0][1] == 0:
            at, _, _, k, t = heapq.heappop(events)
            self.route(at, k, t)

    def admit(self, replica: _Replica) -> None:
        w = self.workload
        for seq_id in replica.inbox:
            turn = self.turns[seq_id]
            try:  # the list is the sequence's own from here: the replies are appended to it
                replica.sched.add(
                    seq_id, turn.prompt_len, w.max_tokens(turn.session, turn.turn), turn.at,
                    token_ids=turn.ids,
                )  # fmt: skip
            except (LengthLimitError, QueueFullError):
                self.refused += 1  # as a live replica refuses it; the session ends there
        replica.inbox.clear()

    # -- a replica's step -------------------------------------------------------------------

    def ended(self, replica: _Replica, done: Sequence[Finished]) -> None:
        """Keep the outcomes; tell the router; a served turn's session sends its next turn."""
        self.finished += done
        w = self.workload
        for f in done:
            self.replies_made.pop(f.seq_id, None)
            turn = self.turns[f.seq_id]
            self.router.finished(replica.name, turn.ids, f.end_s)
            if f.outcome == "served" and turn.turn + 1 < w.turns:
                self.replies[turn.session].append(turn.ids[turn.prompt_len :])
                self.arrive(f.end_s + w.think_time_s, turn.session, turn.turn + 1)

    def sampled(self, replica: _Replica, plan: StepPlan) -> dict[int, int]:
        """Each sampling sequence's next token: the workload's seeded stand-in reply."""
        tokens = {}
        for entry in plan.scheduled:
            if entry.samples:
                turn = self.turns[entry.seq_id]
                reply = self.replies_made.get(entry.seq_id)
                if reply is None:
                    n = self.workload.max_tokens(turn.session, turn.turn)
                    reply = self.workload.simulated_reply(turn.session, turn.turn, n)
                    self.replies_made[entry.seq_id] = reply
                tokens[entry.seq_id] = reply[min(len(turn.ids) - turn.prompt_len, len(reply) - 1)]
        return tokens

    def wake(self, now: float, index: int) -> None:
        """A replica's event: its step ended (or it woke); it plans its next step."""
        replica = self.replicas[index]
        replica.account(now, self.measure_from)
        plan = replica.plan
        if plan is not None:
            done = replica.sched.complete(plan, now, tokens=self.sampled(replica, plan))
            assert replica.sched.last_step is not None
            replica.steps.append(
                dataclasses.replace(
                    replica.sched.last_step, num_context_tokens=plan.num_context_tokens
                )
            )
            replica.plan = None
            self.ended(replica, done)
        self.route_due(now)  # turns sent at this boundary (no think time) join it
        self.admit(replica)
        while replica.sched.has_work:
            plan = replica.sched.schedule(now)
            self.ended(replica, plan.finished)
            if plan.empty:
                continue
            replica.plan = plan
            counts = (len(plan.scheduled), plan.num_batched_tokens, plan.num_context_tokens)
            self.push(now + replica.step_time(*counts), 1, index)
            return
        replica.busy = False

    def run(self) -> float:
        """Process every event; the time of the last."""
        now = 0.0
        while self.events:
            now, kind, _, a, b = heapq.heappop(self.events)
            if kind == 0:
                self.route(now, a, b)
            else:
                self.wake(now, a)
        for replica in self.replicas:
            replica.account(now, self.measure_from)
        return now


@dataclass(frozen=True)
class ReplicaSummary:
    """One replica's figures over the measured window (requests arriving from ``measure_from_s``).

    ``hit_rate``: prompt tokens found in its prefix cache over those looked up;
    ``load``: time-averaged running + waiting (routed, not yet admitted, included).
    """

    replica: int
    requests: int
    hit_rate: float
    load: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    output_tokens_per_s: float


@dataclass(frozen=True)
class FleetResult:
    """A fleet run: every turn, which replica served it, and each replica's steps.

    ``workload`` holds every turn in arrival order as :func:`simulate_workload` does (its
    ``generation.steps`` are the fleet's steps, replica after replica); ``replica`` is
    aligned with it. ``replica_steps``: each replica's own steps; ``load_s``: each
    replica's integral of load over the measured window, whose length is ``window_s``.
    """

    workload: WorkloadSimResult
    replica: np.ndarray
    replica_steps: tuple[StepSeries, ...]
    load_s: tuple[float, ...]
    window_s: float
    measure_from_s: float
    router: str
    reasons: dict[str, int]

    @property
    def generation(self) -> GenerationResult:
        """Every turn across the fleet (the totals)."""
        return self.workload.generation

    def _measured(self) -> np.ndarray:
        return np.asarray(self.generation.arrival_s >= self.measure_from_s)

    def per_replica(self) -> list[ReplicaSummary]:
        """Each replica's figures (see :class:`ReplicaSummary`)."""
        g, measured = self.generation, self._measured()
        out = []
        for i, own in enumerate(self.replica_steps):
            mine = measured & (self.replica == i)
            out.append(
                ReplicaSummary(
                    replica=i,
                    requests=int(mine.sum()),
                    hit_rate=_hit_rate(own, self.measure_from_s),
                    load=self.load_s[i] / self.window_s if self.window_s > 0 else 0.0,
                    **_latencies(g, mine),
                    output_tokens_per_s=_tokens_per_s(g, mine, self.window_s),
                )
            )
        return out

    def summary(self) -> dict[str, float]:
        """Fleet totals over the measured window: hit rate, TTFT/TPOT, load and its skew.

        ``load_skew``: the most loaded replica's time-averaged load over the mean (1.0:
        even); ``hit_rate``: over all replicas' lookups.
        """
        g, measured = self.generation, self._measured()
        per = self.per_replica()
        loads = [r.load for r in per]
        mean_load = sum(loads) / len(loads)
        queries = sum(_cache(s, self.measure_from_s)[0] for s in self.replica_steps)
        hits = sum(_cache(s, self.measure_from_s)[1] for s in self.replica_steps)
        lat = _latencies(g, measured)
        return {
            "requests": float(measured.sum()),
            "hit_rate": hits / queries if queries else 0.0,
            "ttft_p50_ms": lat["ttft_p50_ms"],
            "ttft_p99_ms": lat["ttft_p99_ms"],
            "tpot_p50_ms": lat["tpot_p50_ms"],
            "output_tokens_per_s": _tokens_per_s(g, measured, self.window_s),
            "mean_load": mean_load,
            "load_skew": max(loads) / mean_load if mean_load > 0 else 1.0,
        }

    def table(self) -> str:
        """Per replica, one line each, then the fleet: what a lesson prints."""
        lines = [
            f"router {self.router}: "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.reasons.items())),
            "replica  requests  hit rate  load   TTFT p50 ms  TTFT p99 ms  TPOT p50 ms",
        ]
        for r in self.per_replica():
            lines.append(
                f"{r.replica:>7}  {r.requests:>8}  {r.hit_rate:>8.1%}  {r.load:>5.1f}  "
                f"{r.ttft_p50_ms:>11.1f}  {r.ttft_p99_ms:>11.1f}  {r.tpot_p50_ms:>11.1f}"
            )
        s = self.summary()
        lines.append(
            f"{'fleet':>7}  {int(s['requests']):>8}  {s['hit_rate']:>8.1%}  "
            f"{s['mean_load']:>5.1f}  {s['ttft_p50_ms']:>11.1f}  {s['ttft_p99_ms']:>11.1f}  "
            f"{s['tpot_p50_ms']:>11.1f}   load skew {s['load_skew']:.2f}x"
        )
        return "\n".join(lines)


def _cache(s: StepSeries, measure_from_s: float) -> tuple[int, int]:
    keep = s.start_s >= measure_from_s
    return int(s.num_cache_queries[keep].sum()), int(s.num_cache_hits[keep].sum())


def _hit_rate(steps: StepSeries, measure_from_s: float) -> float:
    queries, hits = _cache(steps, measure_from_s)
    return hits / queries if queries else 0.0


def _latencies(g: GenerationResult, mask: np.ndarray) -> dict[str, float]:
    ok = mask & g.served
    ttft = (g.first_token_s[ok] - g.arrival_s[ok]) * 1000.0
    many = ok & (g.num_output > 1)
    tpot = (g.end_s[many] - g.first_token_s[many]) / (g.num_output[many] - 1) * 1000.0
    nan = math.nan
    p50, p99 = np.percentile(ttft, [50.0, 99.0]) if ttft.size else (nan, nan)
    return {
        "ttft_p50_ms": float(p50),
        "ttft_p99_ms": float(p99),
        "tpot_p50_ms": float(np.percentile(tpot, 50.0)) if tpot.size else nan,
    }


def _tokens_per_s(g: GenerationResult, mask: np.ndarray, window_s: float) -> float:
    return float(g.num_output[mask].sum()) / window_s if window_s > 0 else 0.0


def _router_for(router: Router | str, config: GenerationConfig) -> Router:
    if isinstance(router, str):
        if router.startswith("prefix"):
            return make_router(router, block_size=config.block_size)
        return make_router(router)
    if isinstance(router, PrefixRouter) and router.block_size != config.block_size:
        rule = f"the replicas' block_size ({config.block_size}) for its keys to be the cache's"
        raise ConfigError(f"{router.name}.block_size", router.block_size, rule)
    return router


def simulate_fleet(
    config: GenerationConfig,
    cost: StepCost,
    workload: SharedPrefixWorkload,
    *,
    arrival_s: Sequence[float] | np.ndarray,
    replicas: int = 2,
    router: Router | str = "power_of_two",
    max_model_len: int = 0,
    seed: int = 0,
    measure_from_s: float = 0.0,
) -> FleetResult:
    """Run a shared-prefix workload's sessions through a fleet on virtual time.

    Args:
        config: each replica's scheduler knobs (all replicas alike), prefix caching
            included.
        cost: each replica's step time.
        workload: the sessions (see :func:`~labserve.sim.generation.simulate_workload`).
        arrival_s: session ``k``'s first turn arrives at ``arrival_s[k]``, in order.
        replicas: how many copies.
        router: a router, or its name (:func:`~labserve.generation.routing.make_router`,
            ``block_size`` taken from ``config``). A given router keeps its history, so
            hand in a new one per run.
        max_model_len: the model's context (0: no limit).
        seed: each replica's step-cost spread draws.
        measure_from_s: the warm-up: figures count turns arriving from then on, and load
            from then to the end.

    Raises:
        ValueError: the times are not finite and in order, or ``replicas`` < 1.
        ConfigError: an unknown router, or a prefix router keyed on another block size.
    """
    arrivals = session_arrivals(arrival_s)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    chosen = _router_for(router, config)
    sim = _Fleet(
        config, cost, workload, replicas, chosen, max_model_len, seed, float(measure_from_s)
    )
    for k, at in enumerate(arrivals.tolist()):
        sim.arrive(at, k, 0)
    end = sim.run()
    return _result(sim, chosen, end, float(measure_from_s))


def _result(sim: _Fleet, router: Router, end: float, measure_from_s: float) -> FleetResult:
    all_steps = [s for r in sim.replicas for s in r.steps]
    generation = GenerationResult.from_finished(sim.finished, all_steps, sim.refused)
    done = sorted(sim.finished, key=lambda f: (f.arrival_s, f.seq_id))  # from_finished's order
    turns = [sim.turns[f.seq_id] for f in done]
    workload = WorkloadSimResult(
        generation=generation,
        session=np.asarray([t.session for t in turns], dtype=np.int64),
        turn=np.asarray([t.turn for t in turns], dtype=np.int64),
        prompts=tuple(tuple(t.ids[: t.prompt_len]) for t in turns),
    )
    return FleetResult(
        workload=workload,
        replica=np.asarray([t.replica for t in turns], dtype=np.int64),
        replica_steps=tuple(StepSeries.from_records(r.steps) for r in sim.replicas),
        load_s=tuple(r.load_area for r in sim.replicas),
        window_s=max(end - measure_from_s, 0.0),
        measure_from_s=measure_from_s,
        router=router.name,
        reasons=dict(router.reasons),
    )
