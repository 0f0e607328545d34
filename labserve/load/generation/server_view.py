"""A labserve server's own view of a generation load: its ``/stats`` for the model, over the run.

The load generator reads ``GET /stats`` before and after a run against labserve and shows
what the server says about the model beside what the client measured. The generator
section of ``/stats`` is the runtime's to define, so nothing here depends on its field
names: every number the model's entry holds is shown, counters (names ending in
``_total``, ``_count`` or ``_sum_s``, and the outcome words ``served``, ``cancelled``...)
as their increase over the run and everything else (gauges, percentiles, settings) as the
server reported it at the end. A server without the entry (another server, an older
labserve, a model not found) gives None and the summary says so. Pure functions over the
JSON; thread-safe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from labserve.base.vocabulary import OUTCOMES

__all__ = [
    "find_model_stats",
    "generation_server_view",
    "server_percentile_key",
    "server_percentile_ms",
]

_COUNTER_ENDS = ("_total", "_count", "_sum_s", "_sum_ms")
# Besides the outcome words: counts since the last reset, as labserve's generator snapshot
# names them (its tokens of ended sequences, its preemptions).
_COUNTER_NAMES = frozenset(OUTCOMES) | {
    "requests",
    "steps",
    "batches",
    "preemptions",
    "num_preemptions",
    "prompt_tokens",
    "output_tokens",
}
_DEPTH = 3  # nested objects flattened to dotted keys this deep; lists are left out


def find_model_stats(stats: Any, model: str) -> dict[str, Any] | None:
    """The entry of ``model`` in a ``/stats`` reply (runner ``r``, method ``m`` for ``r.m``).

    ``/stats`` holds ``{runner: {method: snapshot}}``; a model named ``r.m`` is
    ``stats[r][m]``, a model named ``r`` is the runner's only entry (or ``stats[r]``
    itself when it is a snapshot). None when nothing there fits.
    """
    if not isinstance(stats, Mapping):
        return None
    runner, _, method = model.partition(".")
    entry = stats.get(model) if model in stats else stats.get(runner)
    if not isinstance(entry, Mapping):
        return None
    if method and model not in stats:
        found = entry.get(method)
        return dict(found) if isinstance(found, Mapping) else None
    nested = [v for v in entry.values() if isinstance(v, Mapping)]
    if len(nested) < len(entry):  # the entry is a snapshot itself
        return dict(entry)
    generators = [v for v in nested if v.get("kind") == "generation"]
    if len(generators) == 1:  # a runner's one generative method (beside batchable ones)
        return dict(generators[0])
    return dict(nested[0]) if len(nested) == 1 else None


def generation_server_view(
    before: Mapping[str, Any], after: Mapping[str, Any], model: str
) -> dict[str, Any]:
    """What the server's entry for ``model`` said over the run.

    ``over_run``: each counter's increase between the two reads; ``at_end``: every other
    number or string as read after the run. Keys are the entry's, nested ones dotted.
    """
    b, a = _flatten(before), _flatten(after)
    over_run: dict[str, float] = {}
    at_end: dict[str, Any] = {}
    for key, value in a.items():
        if _is_counter(key) and isinstance(value, (int, float)) and not isinstance(value, bool):
            was = b.get(key, 0)
            over_run[key] = value - (was if isinstance(was, (int, float)) else 0)
        else:
            at_end[key] = value
    return {"model": model, "over_run": over_run, "at_end": at_end}


def server_percentile_ms(view: Mapping[str, Any] | None, metric: str, q: str = "p50") -> float:
    """The server's ``q`` of ``metric`` (``ttft``, ``itl``, ``tpot``, ``e2e``) in ms, if it has one.

    Looks for an end-of-run key naming both (``percentiles_ms.ttft.p50``,
    ``time_to_first_token_seconds_p50``...); a key in seconds (``_s``, ``seconds``) is
    converted. NaN when none is there.
    """
    return server_percentile_key(view, metric, q)[1]


def server_percentile_key(
    view: Mapping[str, Any] | None, metric: str, q: str = "p50"
) -> tuple[str, float]:
    """The key :func:`server_percentile_ms` reads (``""`` if none) and its value in ms."""
    if view is None:
        return "", math.nan
    for key, value in view.get("at_end", {}).items():
        low = key.lower()
        if metric not in low or q not in low.replace("_", "."):
            continue
        if value is None:  # the server has no sample in its window
            return key, math.nan
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            in_s = ("seconds" in low or "_s." in low or low.endswith("_s")) and "ms" not in low
            return key, float(value) * (1000.0 if in_s else 1.0)
    return "", math.nan


def _is_counter(key: str) -> bool:
    last = key.rsplit(".", 1)[-1]
    return last in _COUNTER_NAMES or last.endswith(_COUNTER_ENDS)


def _flatten(entry: Mapping[str, Any], prefix: str = "", depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in entry.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if depth + 1 < _DEPTH:
                out.update(_flatten(value, f"{name}.", depth + 1))
        elif isinstance(value, bool):
            out[name] = value
        elif isinstance(value, (int, float, str)) or value is None:
            out[name] = value
    return out
