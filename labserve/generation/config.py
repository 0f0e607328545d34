"""The generation config: how a generative method's sequences are scheduled, step by step.

One frozen, validated object per generative method. The knobs carry vLLM's names where they
mean the same thing (``max_num_seqs``, ``max_num_batched_tokens``, ``enable_chunked_prefill``,
``long_prefill_token_threshold``, ``block_size``, ``scheduling_policy``), so a setting tuned
here reads the same on the engine it is exported to. A live change builds a whole new config;
the scheduler swaps it in at the next step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import cached_property
from typing import Any, Literal

from labserve.base.errors import ConfigError

__all__ = [
    "ARRIVAL_SETTINGS",
    "GENERATION_SETTINGS",
    "GENERATION_STRATEGIES",
    "SCHEDULING_POLICIES",
    "START_SETTINGS",
    "STEP_SETTINGS",
    "GenerationConfig",
    "GenerationStrategy",
    "SchedulingPolicy",
]

GenerationStrategy = Literal["continuous", "static"]
GENERATION_STRATEGIES: tuple[GenerationStrategy, ...] = ("continuous", "static")
"""``continuous``: sequences join and leave the batch at every step (Orca, vLLM).
``static``: a batch of prompts runs until its longest sequence ends, then the next batch
forms (what request micro-batching gives a generator): the baseline."""

SchedulingPolicy = Literal["fcfs", "priority"]
SCHEDULING_POLICIES: tuple[SchedulingPolicy, ...] = ("fcfs", "priority")
"""The waiting queue's order: arrival, or (priority, arrival) with the lowest value first
(vLLM's ``--scheduling-policy``)."""


def _int_at_least(low: int) -> Callable[[str, Any], int]:
    def rule(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(key, value, f"an integer >= {low}")
        return value

    return rule


def _ms(key: str, value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise ConfigError(key, value, "a finite number of milliseconds >= 0")
    return float(value)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, value, "true or false")
    return value


def _one_of(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    def rule(key: str, value: Any) -> str:
        if value not in choices:
            raise ConfigError(key, value, "one of " + ", ".join(map(repr, choices)))
        return str(value)

    return rule


_RULES: dict[str, Callable[[str, Any], Any]] = {
    "strategy": _one_of(GENERATION_STRATEGIES),
    "scheduling_policy": _one_of(SCHEDULING_POLICIES),
    "max_num_seqs": _int_at_least(1),
    "max_num_batched_tokens": _int_at_least(1),
    "enable_chunked_prefill": _bool,
    "long_prefill_token_threshold": _int_at_least(0),
    "block_size": _int_at_least(1),
    "num_kv_blocks": _int_at_least(0),
    "max_queue_size": _int_at_least(1),
    "request_timeout_ms": _ms,
    "isolate_errors": _bool,
    "ttft_slo_ms": _ms,
    "tpot_slo_ms": _ms,
}


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """How one generative method is scheduled. Frozen: change it with :meth:`replace`.

    >>> GenerationConfig(max_num_seqs=8).replace(enable_chunked_prefill=False).max_num_seqs
    8
    """

    strategy: GenerationStrategy = "continuous"
    """``continuous`` (sequences join and leave at every step) or ``static`` (the baseline)."""
    scheduling_policy: SchedulingPolicy = "fcfs"
    """Order of the waiting queue: ``fcfs`` or ``priority`` (lowest value first)."""
    max_num_seqs: int = 32
    """Most sequences running at once (in one step)."""
    max_num_batched_tokens: int = 2048
    """Most tokens computed in one step: a decode counts 1, a prefill chunk its length."""
    enable_chunked_prefill: bool = True
    """Split a prompt that does not fit the step's token budget across steps. Off, a prompt
    longer than ``max_num_batched_tokens`` is refused at admission, and a prompt that does
    not fit what is left of a step waits, in order, for a step with room."""
    long_prefill_token_threshold: int = 0
    """Most prompt tokens one sequence computes in one step, so that one long prompt does
    not take a whole step's budget (0: no cap but the budget)."""
    block_size: int = 16
    """Tokens per KV-cache block: a sequence holding t tokens holds ceil(t / block_size)."""
    num_kv_blocks: int = 0
    """KV-cache blocks in all (vLLM's ``num_gpu_blocks_override``); 0: no limit. When a
    running sequence needs a block and none is free, the newest running sequence is
    preempted: its blocks are freed and it is recomputed when it runs again."""
    max_queue_size: int = 10_000
    """Most sequences waiting; the next one is refused at admission (QueueFullError)."""
    request_timeout_ms: float = 60_000.0
    """Longest a sequence may live, from admission to its last token (0: no limit); past it
    the sequence ends with RequestTimeoutError at once, even while its step runs. Each
    sequence keeps the value in force when it was admitted."""
    isolate_errors: bool = False
    """On a step that raises, bisect it so that only the poisoned sequences fail."""
    ttft_slo_ms: float = 0.0
    """The time-to-first-token target for goodput, in milliseconds (0: no target)."""
    tpot_slo_ms: float = 0.0
    """The time-per-output-token target for goodput, in milliseconds (0: no target)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _RULES[f.name](f.name, getattr(self, f.name)))

    @cached_property
    def request_timeout_s(self) -> float:
        """``request_timeout_ms`` in seconds (0: no limit)."""
        return self.request_timeout_ms / 1000.0

    @property
    def kv_limited(self) -> bool:
        """Whether the KV cache has a block budget."""
        return self.num_kv_blocks > 0

    def blocks_for(self, tokens: int) -> int:
        """KV blocks that ``tokens`` cached tokens occupy."""
        return -(-tokens // self.block_size)

    def replace(self, **changes: Any) -> GenerationConfig:
        """Return a validated copy with ``changes``; raises ConfigError and changes nothing."""
        unknown = sorted(set(changes) - set(GENERATION_SETTINGS))
        if unknown:
            allowed = ", ".join(GENERATION_SETTINGS)
            raise ConfigError(unknown[0], changes[unknown[0]], f"a known setting ({allowed})")
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The settings as a plain dict (for JSON, YAML and snapshots)."""
        return {name: getattr(self, name) for name in GENERATION_SETTINGS}


GENERATION_SETTINGS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(GenerationConfig))
"""The names of the generation settings, in declaration order."""

ARRIVAL_SETTINGS: tuple[str, ...] = (
    "request_timeout_ms",
    "max_queue_size",
    "ttft_slo_ms",
    "tpot_slo_ms",
)
"""Settings that act on arrivals: a live change acts at once, on every sequence admitted
after it (the goodput targets: on the next snapshot)."""
START_SETTINGS: tuple[str, ...] = ("block_size",)
"""Settings that size memory or fix a contract at start: refused live (``ConfigError``, a
422 over HTTP); set them in the decorator, ``Runner(...)`` or the config file."""
STEP_SETTINGS: tuple[str, ...] = tuple(
    name for name in GENERATION_SETTINGS if name not in ARRIVAL_SETTINGS + START_SETTINGS
)
"""Settings that shape steps: a live change applies at the next step, where a sequence the
new config can never run ends with the error admission would have given it."""
