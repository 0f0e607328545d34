"""Export a router's settings to the fleets' own: SGLang's router, Ray Serve LLM, llm-d.

Each snippet starts with ``# Differs:`` lines where the target decides differently from
labserve's router (:mod:`labserve.generation.routing`), so that a setting compared on
virtual time is deployed with its meaning. ``MODEL`` and the worker URLs are placeholders.

Names as the projects document them: ``python -m sglang_router.launch_router`` (``--policy``
``cache_aware`` / ``round_robin`` / ``power_of_two`` / ``random``, ``--cache-threshold``,
``--balance-abs-threshold``, ``--balance-rel-threshold``, ``--max-tree-size``); Ray Serve
LLM's ``PrefixCacheAffinityRouter`` (``ray.serve.llm.request_router``; kwargs
``imbalanced_threshold``, ``match_rate_threshold``) in a deployment's
``request_router_config``; llm-d's inference scheduler ``EndpointPickerConfig`` (plugins
``prefix-cache-scorer``, ``queue-scorer``, ``kv-cache-utilization-scorer``,
``max-score-picker``, weighted in a scheduling profile).

>>> from labserve.generation.routing import make_router
>>> print(export_router(make_router("prefix"), "sglang-router"))  # doctest: +ELLIPSIS
# SGLang router (sglang_router.launch_router)
# Differs: ...
"""

from __future__ import annotations

from labserve.generation.routing import PrefixRouter, Router

__all__ = ["ROUTER_FORMATS", "export_router"]

ROUTER_FORMATS: tuple[str, ...] = ("sglang-router", "ray-serve-llm", "llm-d")
"""The fleets :func:`export_router` writes settings for."""

_AFFINITY_OFF = 1_000_000  # a balance threshold no fleet reaches: the fallback never engages


def _text(title: str, notes: list[str], body: str) -> str:
    return "\n".join([f"# {title}", *(f"# Differs: {n}" for n in notes), body])


def _memory_note(router: PrefixRouter, unit: str) -> str:
    size = str(router.cache_blocks) if router.cache_blocks else "as many as the replica has KV"
    return (
        f"labserve remembers up to {size} block keys per replica ({router.block_size} tokens"
        f" a block), an LRU evicted as keys arrive; here the bound counts {unit}."
    )


def _num(value: float) -> str:
    """A threshold as the flag takes it: 4, not 4.0; 1000000, not 1e+06."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _sglang(router: Router) -> str:
    head = "python -m sglang_router.launch_router \\\n  --worker-urls URL1 URL2"
    notes: list[str] = []
    if isinstance(router, PrefixRouter):
        abs_, rel = (
            (router.balance_abs_threshold, router.balance_rel_threshold)
            if router.fallback
            else (_AFFINITY_OFF, router.balance_rel_threshold)
        )
        flags = (
            f"  --policy cache_aware \\\n  --cache-threshold {router.match_rate_threshold:g} \\\n"
            f"  --balance-abs-threshold {_num(abs_)} \\\n  --balance-rel-threshold {_num(rel)}"
        )
        notes += [
            "cache_aware matches characters of the prompt text in a radix tree per worker;"
            " labserve matches whole blocks of token ids, so a shared prefix under one block"
            " matches nothing here and something there.",
            "out of balance, cache_aware sends to the shortest queue; labserve draws two"
            " replicas and takes the less loaded (power of two).",
            "below --cache-threshold both send to the worker with the smallest tree (the"
            " fewest remembered keys here), ties by load.",
            _memory_note(router, "tree nodes (--max-tree-size), trimmed on a timer"),
        ]
        if not router.fallback:
            notes.append(
                f"prefix_affinity never falls back: --balance-abs-threshold {_AFFINITY_OFF}"
                " keeps the imbalance test from passing (both thresholds must pass)."
            )
    elif router.name == "least_kv":
        flags = "  --policy power_of_two"
        notes.append(
            "the router has no KV-use policy; power_of_two compares the two workers' loads"
            " (requests), the nearest it has."
        )
    else:
        flags = f"  --policy {router.name}"
        if router.name == "power_of_two":
            notes.append(
                "labserve compares running + waiting sequences as each replica reports"
                " them; SGLang's router compares the load it counts itself."
            )
    return _text("SGLang router (sglang_router.launch_router)", notes, f"{head} \\\n{flags}\n")


def _ray(router: Router) -> str:
    notes: list[str] = []
    if isinstance(router, PrefixRouter):
        threshold = 'float("inf")' if not router.fallback else _num(router.balance_abs_threshold)
        body = (
            "from ray.serve.llm.request_router import PrefixCacheAffinityRouter\n\n"
            "deployment_config = {\n"
            '    "request_router_config": {\n'
            '        "request_router_class": PrefixCacheAffinityRouter,\n'
            '        "request_router_kwargs": {\n'
            f'            "imbalanced_threshold": {threshold},\n'
            f'            "match_rate_threshold": {router.match_rate_threshold:g},\n'
            "        },\n"
            "    },\n"
            "}  # LLMConfig(..., deployment_config=deployment_config)\n"
        )
        notes += [
            "imbalanced_threshold compares queue lengths (max - min) only; labserve also"
            f" asks max > {router.balance_rel_threshold:g} x min (balance_rel_threshold),"
            " so Ray falls back sooner on a lightly loaded fleet.",
            "Ray matches characters of the prompt text in one prefix tree actor shared by"
            " the routers; labserve matches whole blocks of token ids per router.",
            _memory_note(router, "characters, and evicts only with do_eviction=True"),
        ]
        if not router.fallback:
            notes.append("prefix_affinity: imbalanced_threshold inf, Ray's own default.")
    elif router.name == "power_of_two":
        body = "deployment_config = {}  # Ray Serve's default request router: power of two\n"
        notes.append(
            "Serve compares the ongoing requests it probes on each replica (cached for a"
            " while); labserve compares running + waiting sequences as reported."
        )
    else:
        body = "deployment_config = {}  # no built-in router of this kind: a custom RequestRouter\n"
        notes.append(
            f"Ray Serve LLM has no built-in {router.name} router; deploy a custom"
            " RequestRouter (request_router_class) that calls labserve's."
        )
    return _text("Ray Serve LLM deployment_config", notes, body)


def _llmd_plugins(router: Router) -> list[tuple[str, float, str]]:
    """(plugin type, weight, parameters YAML) of the scheduling profile."""
    if isinstance(router, PrefixRouter):
        params = f"    parameters:\n      blockSizeTokens: {router.block_size}\n"
        if router.cache_blocks:
            params += f"      lruCapacityPerServer: {router.cache_blocks}\n"
        prefix = ("prefix-cache-scorer", 3.0, params)
        if not router.fallback:
            return [prefix]
        return [prefix, ("queue-scorer", 2.0, ""), ("kv-cache-utilization-scorer", 2.0, "")]
    if router.name == "least_kv":
        return [("kv-cache-utilization-scorer", 1.0, "")]
    if router.name == "power_of_two":
        return [("queue-scorer", 1.0, "")]
    return []


def _llmd(router: Router) -> str:
    plugins = _llmd_plugins(router)
    picker = "max-score-picker" if plugins else "random-picker"
    lines = ["apiVersion: inference.networking.x-k8s.io/v1alpha1", "kind: EndpointPickerConfig"]
    lines.append("plugins:")
    for kind, _, params in plugins:
        lines.append(f"  - type: {kind}")
        if params:
            lines.append(params.rstrip("\n"))
    lines += [f"  - type: {picker}", "schedulingProfiles:", "  - name: default", "    plugins:"]
    for kind, weight, _ in plugins:
        lines += [f"      - pluginRef: {kind}", f"        weight: {weight:g}"]
    lines.append(f"      - pluginRef: {picker}")
    notes: list[str] = []
    if isinstance(router, PrefixRouter) and router.fallback:
        notes.append(
            "llm-d adds weighted scores (prefix 3, queue 2, KV use 2: its default profile)"
            " and takes the best; labserve follows the prefix unless the load spread passes"
            f" abs {router.balance_abs_threshold:g} and rel {router.balance_rel_threshold:g},"
            " then draws two: no threshold maps onto a weight."
        )
    if isinstance(router, PrefixRouter):
        notes.append(
            _memory_note(router, "blocks per pod (lruCapacityPerServer; autoTune reads it)")
        )
    elif router.name == "power_of_two":
        notes.append("the queue scorer takes the shortest queue of all pods, not of two.")
    elif router.name == "round_robin":
        notes.append("llm-d has no round robin: random-picker spreads as evenly on average.")
    return _text("llm-d inference scheduler EndpointPickerConfig", notes, "\n".join(lines) + "\n")


def export_router(router: Router, fmt: str) -> str:
    """A router's settings as ``fmt`` (one of :data:`ROUTER_FORMATS`), with what differs.

    Raises:
        ValueError: ``fmt`` is not one of :data:`ROUTER_FORMATS`.
        TypeError: ``router`` is not a :class:`~labserve.generation.routing.Router`.
    """
    if not isinstance(router, Router):
        raise TypeError(f"export_router needs a Router, got {type(router).__name__}")
    if fmt == "sglang-router":
        return _sglang(router)
    if fmt == "ray-serve-llm":
        return _ray(router)
    if fmt == "llm-d":
        return _llmd(router)
    raise ValueError(f"fmt must be one of {', '.join(map(repr, ROUTER_FORMATS))}, got {fmt!r}")
