"""Routers: which replica of a fleet takes a request, sans-IO, scored once.

The one scoring code both a Ray Serve ``RequestRouter`` (``labserve.ray``) and the fleet
simulator (:mod:`labserve.sim.fleet`) call. A router sees each replica as a
:class:`ReplicaView` (what a live replica reports, or what the simulator knows exactly),
and is told what it routed (:meth:`Router.routed`) and what finished
(:meth:`Router.finished`): a prefix router keeps its own view of each replica's cache from
that history, so it needs no cache digest from the replica. Nothing here reads a clock:
``now`` (seconds, the caller's clock) is passed in. Not thread-safe: its owner calls it
from one thread (Serve's router runs on one event loop; the simulator has one).

Routers (:func:`make_router` names): ``round_robin``; ``power_of_two`` (Ray Serve's
default: two replicas at random, the less loaded); ``least_kv`` (the least KV used);
``prefix`` (the longest cached prefix, falling back to power of two when the load spread
passes a threshold, as SGLang's ``cache_aware`` and Ray's ``PrefixCacheAffinityRouter``);
``prefix_affinity`` (the same without the fallback: a hot prefix piles onto one replica).

>>> router = make_router("prefix", block_size=4, seed=0)
>>> fleet = [ReplicaView("a"), ReplicaView("b")]
>>> prompt = list(range(12))
>>> first = router.choose(prompt, fleet, now=0.0)
>>> router.routed(first, prompt, now=0.0)
>>> router.choose(prompt + [99], fleet, now=0.1) == first
True
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from labserve.base.errors import ConfigError, NoReplicaError
from labserve.generation.blocks import block_hashes

__all__ = [
    "ROUTERS",
    "LeastKvRouter",
    "PowerOfTwoRouter",
    "PrefixAffinityRouter",
    "PrefixRouter",
    "ReplicaView",
    "RoundRobinRouter",
    "Router",
    "make_router",
]

# A replica that reports no KV capacity (0: no limit) still gets a bounded memory:
# 65,536 keys are about 10 MB of dict per replica and 1M tokens at block_size 16.
_UNKNOWN_CAPACITY_BLOCKS = 65_536


@dataclass(frozen=True)
class ReplicaView:
    """One replica as a router sees it: its id and the load it reports.

    ``running`` and ``waiting``: sequences in its batch and admitted but waiting;
    ``kv_blocks_used`` of ``kv_blocks_total`` KV blocks held by running sequences (total 0:
    the replica reports no limit). A live replica's view is as old as its last report.

    Raises:
        ValueError: a count is not an integer >= 0.
    """

    replica_id: str
    running: int = 0
    waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0

    def __post_init__(self) -> None:
        for name in ("running", "waiting", "kv_blocks_used", "kv_blocks_total"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")

    @property
    def load(self) -> int:
        """Sequences on the replica: running + waiting (what the balance checks compare)."""
        return self.running + self.waiting

    @property
    def kv_use(self) -> float:
        """The fraction of KV blocks used (0.0 when the replica reports no limit)."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


def _int_option(router: str, key: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(f"{router}.{key}", value, f"an integer >= {low}")
    return int(value)


def _float_option(router: str, key: str, value: Any, low: float, high: float = math.inf) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or math.isnan(value) or not low <= value <= high:
        rule = f"a number >= {low:g}" + (f" and <= {high:g}" if math.isfinite(high) else "")
        raise ConfigError(f"{router}.{key}", value, rule)
    return float(value)


class Router:
    """Chooses a replica per request; subclasses score. Not thread-safe (one owner).

    The three calls an owner makes, in order, per request: :meth:`choose`, then
    :meth:`routed` with what it chose (a request that never reaches the replica is not
    reported), then :meth:`finished` when it ends. :meth:`forget` drops a replica that left.
    ``reasons`` counts the rule behind each choice (``"prefix"``, ``"balance"``, ...).
    """

    name: ClassVar[str] = ""
    option_names: ClassVar[tuple[str, ...]] = ("seed",)

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = _int_option(self.name, "seed", seed, 0)
        self._rng = np.random.default_rng(self.seed)
        self.reasons: Counter[str] = Counter()

    @property
    def options(self) -> dict[str, Any]:
        """The router's settings as :func:`make_router` takes them (what an export reads)."""
        return {key: getattr(self, key) for key in self.option_names}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"make_router({self.name!r}, {args})"

    def choose(self, prompt_ids: Sequence[int], replicas: Sequence[ReplicaView], now: float) -> str:
        """The id of the replica that should take a request with ``prompt_ids``.

        Raises:
            NoReplicaError: ``replicas`` is empty.
        """
        if not replicas:
            raise NoReplicaError(self.name)
        if len(replicas) == 1:
            self.reasons["only"] += 1
            return replicas[0].replica_id
        index, reason = self._pick(prompt_ids, replicas, now)
        self.reasons[reason] += 1
        return replicas[index].replica_id

    def _pick(
        self, prompt_ids: Sequence[int], replicas: Sequence[ReplicaView], now: float
    ) -> tuple[int, str]:
        raise NotImplementedError

    def routed(self, replica_id: str, prompt_ids: Sequence[int], now: float) -> None:
        """The request with ``prompt_ids`` was sent to ``replica_id`` (history-keeping routers)."""

    def finished(self, replica_id: str, token_ids: Sequence[int], now: float) -> None:
        """A request on ``replica_id`` ended; ``token_ids``: its prompt and the output it got."""

    def forget(self, replica_id: str) -> None:
        """Drop what the router keeps about a replica that left the fleet."""

    # -- shared scoring pieces ------------------------------------------------------------

    def _lowest(self, keys: Sequence[tuple[float, ...]], among: Sequence[int]) -> int:
        """The index in ``among`` with the lowest key; ties broken at random (seeded)."""
        best = min(keys[i] for i in among)
        tied = [i for i in among if keys[i] == best]
        return tied[0] if len(tied) == 1 else tied[int(self._rng.integers(len(tied)))]

    def _two_choices(self, replicas: Sequence[ReplicaView]) -> int:
        """Power of two choices: two distinct replicas at random, the one with less load."""
        n = len(replicas)
        i = int(self._rng.integers(n))
        j = int(self._rng.integers(n - 1))
        j += j >= i  # distinct from i, uniform over the other n - 1
        # Differs: Ray Serve compares queue lengths it probes (or caches for a while); the
        # view's load is running + waiting as the replica last reported it.
        return j if replicas[j].load < replicas[i].load else i


class RoundRobinRouter(Router):
    """Each replica in turn, in the order the caller lists them (ignores load and cache)."""

    name = "round_robin"

    def __init__(self, *, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self._turn = 0

    def _pick(
        self, prompt_ids: Sequence[int], replicas: Sequence[ReplicaView], now: float
    ) -> tuple[int, str]:
        index = self._turn % len(replicas)
        self._turn += 1
        return index, "turn"


class PowerOfTwoRouter(Router):
    """Ray Serve's default: two replicas drawn at random (seeded), the less loaded one."""

    name = "power_of_two"

    def _pick(
        self, prompt_ids: Sequence[int], replicas: Sequence[ReplicaView], now: float
    ) -> tuple[int, str]:
        return self._two_choices(replicas), "load"


class LeastKvRouter(Router):
    """The replica with the smallest fraction of KV blocks used; ties: less load, then random.

    # Differs: llm-d's kv-cache-utilization scorer is one weighted term (weight 2 in its
    # default profile beside prefix 3 and queue 2); here it is the whole decision.
    """

    name = "least_kv"

    def _pick(
        self, prompt_ids: Sequence[int], replicas: Sequence[ReplicaView], now: float
    ) -> tuple[int, str]:
        keys = [(r.kv_use, float(r.load)) for r in replicas]
        return self._lowest(keys, range(len(replicas))), "kv"


class _PrefixMemory:
    """The block keys one replica is believed to hold: an LRU bounded like its cache.

    How it approximates the replica's pool (exact keys, approximate membership): every
    routed prompt's full blocks enter, as they do on the replica (a hit or a fresh
    prefill); a finished request's blocks are touched again, since the replica frees them
    then and its LRU is in order of freeing; a prompt's blocks are touched tail first so
    that its head is evicted last, vLLM's order. It does not know which blocks running
    sequences pin (never evicted while held), nor a replica's preemptions or restarts, so
    under memory pressure it may keep keys the replica dropped, or drop ones it kept.
    """

    __slots__ = ("capacity", "keys")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.keys: OrderedDict[int, None] = OrderedDict()

    def match(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes``, from the first, are held: the cached prefix, in blocks."""
        n = 0
        for h in hashes:
            if h not in self.keys:
                break
            n += 1
        return n

    def add(self, hashes: Sequence[int]) -> None:
        keys = self.keys
        for h in reversed(hashes):
            keys[h] = None
            keys.move_to_end(h)
        while len(keys) > self.capacity:
            keys.popitem(last=False)


class PrefixRouter(Router):
    """The replica holding the longest prefix of the prompt (by block keys); see the module.

    Args:
        block_size: tokens per KV block, the replicas' (the keys are
            :func:`~labserve.generation.blocks.block_hashes`, the cache's own).
        cache_blocks: keys remembered per replica; 0: each replica's reported
            ``kv_blocks_total`` (65,536 when it reports none).
        balance_abs_threshold, balance_rel_threshold: the load is out of balance when
            max - min load > abs AND max > rel x min (SGLang's two conditions); then power of
            two chooses. Only with ``fallback``.
        match_rate_threshold: the smallest matched fraction of the prompt's full blocks that
            counts as a match; below it the replica with the fewest remembered keys
            (least loaded among ties) takes the prompt, as Ray and SGLang do.
        fallback: False gives ``prefix_affinity``: never falls back on load.
        seed: the random draws (ties, power of two).

    # Differs: SGLang's cache_aware matches characters of the text in a radix tree per
    # worker (cache_threshold 0.5 by default; the balance thresholds' defaults vary by
    # version, abs 32-64, rel 1.0001-1.5), routes an imbalanced fleet to the shortest queue
    # rather than power of two, and trims its trees on a timer to max_tree_size. Ray's
    # PrefixCacheAffinityRouter matches characters too (one tree actor for all routers),
    # compares queue lengths only (imbalanced_threshold, default inf: it never falls back
    # unless set), match_rate_threshold 0.1, and evicts nothing unless do_eviction is set.
    # Keys here are whole blocks: a shared prefix shorter than a block matches nothing, as
    # it hits nothing in the cache.
    """

    name = "prefix"
    option_names: ClassVar[tuple[str, ...]] = (
        "block_size",
        "cache_blocks",
        "balance_abs_threshold",
        "balance_rel_threshold",
        "match_rate_threshold",
        "seed",
    )

    def __init__(
        self,
        *,
        block_size: int = 16,
        cache_blocks: int = 0,
        balance_abs_threshold: float = 4,
        balance_rel_threshold: float = 1.5,
        match_rate_threshold: float = 0.1,
        seed: int = 0,
        fallback: bool = True,
    ) -> None:
        super().__init__(seed=seed)
        name = self.name
        self.block_size = _int_option(name, "block_size", block_size, 1)
        self.cache_blocks = _int_option(name, "cache_blocks", cache_blocks, 0)
        self.balance_abs_threshold = _float_option(
            name, "balance_abs_threshold", balance_abs_threshold, 0
        )
        self.balance_rel_threshold = _float_option(
            name, "balance_rel_threshold", balance_rel_threshold, 1
        )
        self.match_rate_threshold = _float_option(
            name, "match_rate_threshold", match_rate_threshold, 0, 1
        )
        self.fallback = fallback
        self._memory: dict[str, _PrefixMemory] = {}
        self._last: tuple[tuple[int, ...], list[int]] = ((), [])

    def hashes(self, token_ids: Sequence[int]) -> list[int]:
        """The block keys of ``token_ids`` (the last prompt's are kept: choose, then routed)."""
        ids = tuple(token_ids)
        if ids != self._last[0]:
            self._last = (ids, block_hashes(ids, self.block_size))
        return self._last[1]

    def cached_blocks(self, replica_id: str, token_ids: Sequence[int]) -> int:
        """How many leading blocks of ``token_ids`` the router believes ``replica_id`` holds."""
        memory = self._memory.get(replica_id)
        return memory.match(self.hashes(token_ids)) if memory else 0

    def _memory_of(self, replica: ReplicaView) -> _PrefixMemory:
        capacity = self.cache_blocks or replica.kv_blocks_total or _UNKNOWN_CAPACITY_BLOCKS
        memory = self._memory.get(replica.replica_id)
        if memory is None:
            memory = self._memory[replica.replica_id] = _PrefixMemory(capacity)
        memory.capacity = capacity  # a live replica may be resized
        return memory

    def imbalanced(self, replicas: Sequence[ReplicaView]) -> bool:
        """True when the load spread passes both thresholds (never without ``fallback``)."""
        if not self.fallback:
            return False
        loads = [r.load for r in replicas]
        high, low = max(loads), min(loads)
        return high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low

    def _pick(
        self, prompt_ids: Sequence[int], replicas: Sequence[ReplicaView], now: float
    ) -> tuple[int, str]:
        if self.imbalanced(replicas):
            return self._two_choices(replicas), "balance"
        hashes = self.hashes(prompt_ids)
        memories = [self._memory_of(r) for r in replicas]
        matched = [m.match(hashes) for m in memories]
        best = max(matched)
        if best and best >= self.match_rate_threshold * len(hashes):
            keys = [(-float(m), float(r.load)) for m, r in zip(matched, replicas, strict=True)]
            return self._lowest(keys, range(len(replicas))), "prefix"
        keys = [
            (float(len(m.keys)), float(r.load)) for m, r in zip(memories, replicas, strict=True)
        ]
        return self._lowest(keys, range(len(replicas))), "no_match"

    def routed(self, replica_id: str, prompt_ids: Sequence[int], now: float) -> None:
        """Remember the prompt's blocks as cached on ``replica_id``."""
        memory = self._memory.get(replica_id)
        if memory is None:
            memory = self._memory[replica_id] = _PrefixMemory(
                self.cache_blocks or _UNKNOWN_CAPACITY_BLOCKS
            )
        memory.add(self.hashes(prompt_ids))

    def finished(self, replica_id: str, token_ids: Sequence[int], now: float) -> None:
        """Touch the ended request's blocks (prompt and output): the replica frees them now."""
        memory = self._memory.get(replica_id)
        if memory is not None:
            memory.add(block_hashes(token_ids, self.block_size))

    def forget(self, replica_id: str) -> None:
        """Drop the replica's remembered keys."""
        self._memory.pop(replica_id, None)


class PrefixAffinityRouter(PrefixRouter):
    """:class:`PrefixRouter` without the load fallback: the pile-up a pure affinity causes."""

    name = "prefix_affinity"
    option_names: ClassVar[tuple[str, ...]] = (
        "block_size",
        "cache_blocks",
        "match_rate_threshold",
        "seed",
    )

    def __init__(
        self,
        *,
        block_size: int = 16,
        cache_blocks: int = 0,
        match_rate_threshold: float = 0.1,
        seed: int = 0,
    ) -> None:
        super().__init__(
            block_size=block_size,
            cache_blocks=cache_blocks,
            match_rate_threshold=match_rate_threshold,
            seed=seed,
            fallback=False,
        )


ROUTERS: dict[str, type[Router]] = {
    cls.name: cls
    for cls in (
        RoundRobinRouter,
        PowerOfTwoRouter,
        LeastKvRouter,
        PrefixRouter,
        PrefixAffinityRouter,
    )
}
"""The routers by name, as :func:`make_router`, ``router=`` and ``--router`` take them."""


def make_router(name: str, **options: Any) -> Router:
    """A new router by name with its options (see each router's class).

    Raises:
        ConfigError: an unknown name, an option the router does not take, or a bad value.

    >>> make_router("power_of_two", seed=3)
    make_router('power_of_two', seed=3)
    """
    cls = ROUTERS.get(name)
    if cls is None:
        raise ConfigError("router", name, f"one of {', '.join(map(repr, ROUTERS))}")
    for key, value in options.items():
        if key not in cls.option_names:
            rule = f"an option of {name!r} ({', '.join(cls.option_names)})"
            raise ConfigError(f"{name}.{key}", value, rule)
    return cls(**options)
