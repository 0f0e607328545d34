"""Goodput targets: ``ttft:MS tpot:MS e2el:MS``, as ``vllm bench serve --goodput`` takes them.

A request is *good* when it was served and meets every target given: its time to first
token, its time per output token (0 for a one-token output, as vLLM counts it) and its
end-to-end latency, each at most the target in milliseconds. Goodput is good requests per
second. Pure; thread-safe.

>>> parse_goodput("ttft:300 tpot:30")
{'ttft': 300.0, 'tpot': 30.0}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

__all__ = ["GOODPUT_KEYS", "parse_goodput"]

GOODPUT_KEYS = ("ttft", "tpot", "e2el")
"""The targets goodput can take, as vLLM names them (``e2el``: end-to-end latency)."""

_FORM = "KEY:MS with KEY one of ttft, tpot, e2el and MS a number of milliseconds > 0"


def parse_goodput(spec: str | Iterable[str] | Mapping[str, float] | None) -> dict[str, float]:
    """Targets from ``"ttft:300 tpot:30"``, ``["ttft:300", "tpot:30"]`` or a mapping.

    None or empty: no targets (every served request is good).

    Raises:
        ValueError: a field is not ``KEY:MS`` as above, or a key is given twice.
    """
    if spec is None:
        return {}
    items: list[tuple[str, object]]
    if isinstance(spec, Mapping):
        items = [(str(k), v) for k, v in spec.items()]
    else:
        fields = spec.split() if isinstance(spec, str) else [f for s in spec for f in s.split()]
        items = []
        for field in fields:
            name, sep, text = field.partition(":")
            if not sep:
                raise ValueError(f"goodput takes {_FORM}; got {field!r}")
            items.append((name, text))
    targets: dict[str, float] = {}
    for key, value in items:
        name = key.strip().lower()
        if name not in GOODPUT_KEYS:
            raise ValueError(f"goodput takes {_FORM}; got the key {key!r}")
        if name in targets:
            raise ValueError(f"goodput: {name} is given twice")
        targets[name] = _ms(name, value)
    return targets


def _ms(name: str, value: object) -> float:
    try:
        ms = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"goodput takes {_FORM}; got {name}:{value}") from None
    if not (math.isfinite(ms) and ms > 0):
        raise ValueError(f"goodput takes {_FORM}; got {name}:{value}")
    return ms
