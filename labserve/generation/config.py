"""The generation config, as the generation core imports it.

The config lives on the config floor (:mod:`labserve.config.generation`), beside the batching
config and checked by the same mechanism; this module re-exports it, so that
``from labserve.generation.config import GenerationConfig`` keeps working.
"""

from labserve.config.generation import (
    ARRIVAL_SETTINGS,
    GENERATION_SETTINGS,
    GENERATION_STRATEGIES,
    SCHEDULING_POLICIES,
    START_SETTINGS,
    STEP_SETTINGS,
    GenerationConfig,
    GenerationStrategy,
    SchedulingPolicy,
)

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
