"""The generation config: how a generative method's sequences are scheduled, step by step.

One frozen, validated object per generative method. The knobs carry vLLM's names where they
mean the same thing (``max_num_seqs``, ``max_num_batched_tokens``, ``enable_chunked_prefill``,
``long_prefill_token_threshold``, ``block_size``, ``scheduling_policy``), so a setting tuned
here reads the same on the engine it is exported to. A live change builds a whole new config;
the scheduler swaps it in at the next step.

Each setting is declared as the batching settings are, ``name: type = setting(default,
rule)``, and checked by the same mechanism (:mod:`labserve.config.settings`), so both configs
give the same messages. It lives on the config floor beside ``BatchingConfig``;
``labserve.config.generation`` re-exports it for the generation core's imports.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from typing import Literal

from labserve.config.settings import (
    BOOLEAN,
    Rule,
    Settings,
    integer_at_least,
    number_at_least,
    one_of,
    setting,
)

__all__ = [
    "ARRIVAL_SETTINGS",
    "GENERATION_SETTINGS",
    "GENERATION_STRATEGIES",
    "PAGED_START_SETTINGS",
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

SchedulingPolicy = Literal["fcfs", "priority", "lpm"]
SCHEDULING_POLICIES: tuple[SchedulingPolicy, ...] = ("fcfs", "priority", "lpm")
"""The waiting queue's order: arrival, or (priority, arrival) with the lowest value first
(vLLM's ``--scheduling-policy``), or longest prefix match first (SGLang's ``lpm``: the most
cached prompt tokens first, ties by arrival; a prompt that shares nothing can wait behind
later ones that do)."""

_MILLISECONDS = number_at_least(0.0, of="milliseconds")


@dataclasses.dataclass(frozen=True)
class GenerationConfig(Settings):
    """How one generative method is scheduled. Frozen: change it with :meth:`replace`.

    >>> GenerationConfig(max_num_seqs=8).replace(enable_chunked_prefill=False).max_num_seqs
    8
    """

    strategy: GenerationStrategy = setting("continuous", one_of(GENERATION_STRATEGIES))
    """``continuous`` (sequences join and leave at every step) or ``static`` (the baseline)."""
    scheduling_policy: SchedulingPolicy = setting("fcfs", one_of(SCHEDULING_POLICIES))
    """Order of the waiting queue: ``fcfs``, ``priority`` (lowest value first) or ``lpm``
    (the longest cached prefix first; as ``fcfs`` with prefix caching off)."""
    max_num_seqs: int = setting(32, integer_at_least(1))
    """Most sequences running at once (in one step)."""
    max_num_batched_tokens: int = setting(2048, integer_at_least(1))
    """Most tokens computed in one step: a decode counts 1, a prefill chunk its length."""
    enable_chunked_prefill: bool = setting(True, BOOLEAN)
    """Split a prompt that does not fit the step's token budget across steps. Off, a prompt
    longer than ``max_num_batched_tokens`` is refused at admission, and a prompt that does
    not fit what is left of a step waits, in order, for a step with room."""
    long_prefill_token_threshold: int = setting(0, integer_at_least(0))
    """Most prompt tokens one sequence computes in one step, so that one long prompt does
    not take a whole step's budget (0: no cap but the budget)."""
    block_size: int = setting(16, integer_at_least(1))
    """Tokens per KV-cache block: a sequence holding t tokens holds ceil(t / block_size)."""
    num_kv_blocks: int = setting(0, integer_at_least(0))
    """KV-cache blocks in all (vLLM's ``num_gpu_blocks_override``); 0: no limit (for a model
    that stores K/V in labserve's blocks: sized from ``kv_cache_bytes`` or a default). When a
    running sequence needs a block and none is free, the newest running sequence is
    preempted: its blocks are freed and it is recomputed when it runs again. A start-time
    setting for a model that stores K/V in labserve's blocks (it sizes that memory)."""
    kv_cache_bytes: int = setting(0, integer_at_least(0))
    """The KV memory budget in bytes of a model that stores K/V in labserve's blocks (as
    vLLM's ``gpu_memory_utilization`` sizes its cache): the pool is this divided by the
    model's ``kv_bytes_per_token`` x ``block_size`` blocks. 0: ``num_kv_blocks`` if set, else
    room for ``max_num_seqs`` sequences of the model's ``max_model_len``. A start-time setting."""
    enable_prefix_caching: bool | None = setting(
        None,
        Rule(
            "true, false or null (on for a model that stores K/V in labserve's blocks)",
            lambda v: v is None or isinstance(v, bool),
        ),
    )
    """Keep full KV blocks cached by a hash of their tokens and their prefix, and start a
    prompt after the longest run of them (vLLM's automatic prefix caching). None (the
    default): on for a model that stores K/V in labserve's blocks (as vLLM V1), off for one
    that keeps its own caches, which refuses True. Live: off drops every cached hash; on
    caches from the next step."""
    max_queue_size: int = setting(10_000, integer_at_least(1))
    """Most sequences waiting; the next one is refused at admission (QueueFullError)."""
    request_timeout_ms: float = setting(60_000.0, _MILLISECONDS)
    """Longest a sequence may live, from admission to its last token (0: no limit); past it
    the sequence ends with RequestTimeoutError at once, even while its step runs. Each
    sequence keeps the value in force when it was admitted."""
    isolate_errors: bool = setting(False, BOOLEAN)
    """On a step that raises, bisect it so that only the poisoned sequences fail."""
    ttft_slo_ms: float = setting(0.0, _MILLISECONDS)
    """The time-to-first-token target for goodput, in milliseconds (0: no target)."""
    tpot_slo_ms: float = setting(0.0, _MILLISECONDS)
    """The time-per-output-token target for goodput, in milliseconds (0: no target)."""

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


GENERATION_SETTINGS: tuple[str, ...] = GenerationConfig.names()
"""The names of the generation settings, in declaration order."""

ARRIVAL_SETTINGS: tuple[str, ...] = (
    "request_timeout_ms",
    "max_queue_size",
    "ttft_slo_ms",
    "tpot_slo_ms",
)
"""Settings that act on arrivals: a live change acts at once, on every sequence admitted
after it (the goodput targets: on the next snapshot)."""
START_SETTINGS: tuple[str, ...] = ("block_size", "kv_cache_bytes")
"""Settings that size memory or fix a contract at start: refused live (``ConfigError``, a
422 over HTTP); set them in the decorator, ``Runner(...)`` or the config file."""
PAGED_START_SETTINGS: tuple[str, ...] = (*START_SETTINGS, "num_kv_blocks")
"""The start-time settings of a model that stores K/V in labserve's blocks: the pool's size
is its memory, allocated once (``num_kv_blocks`` stays live for a model with its own caches,
where it is an account)."""
STEP_SETTINGS: tuple[str, ...] = tuple(
    name for name in GENERATION_SETTINGS if name not in ARRIVAL_SETTINGS + START_SETTINGS
)
"""Settings that shape steps: a live change applies at the next step, where a sequence the
new config can never run ends with the error admission would have given it."""
