"""Routers exported as SGLang router flags, a Ray Serve LLM config and an llm-d config."""

from __future__ import annotations

import ast

import pytest
import yaml

from labserve import GenerationConfig, export_config, make_router
from labserve.generation.routing import ROUTERS
from labserve.lab.generation.routers import ROUTER_FORMATS, export_router


def _body(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


def _differs(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("# Differs: ")]


@pytest.mark.parametrize("fmt", ROUTER_FORMATS)
@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_every_router_exports_to_every_format_through_export_config(name: str, fmt: str) -> None:
    text = export_config(make_router(name), fmt)
    assert text == export_router(make_router(name), fmt)
    assert text.startswith("# ") and _body(text).strip()
    if name.startswith("prefix"):  # a prefix router always differs somewhere: say where
        assert _differs(text)


def test_sglang_router_flags_carry_the_prefix_settings() -> None:
    router = make_router(
        "prefix", balance_abs_threshold=6, balance_rel_threshold=1.25, match_rate_threshold=0.3
    )
    body = _body(export_router(router, "sglang-router"))
    for flag in (
        "--policy cache_aware",
        "--cache-threshold 0.3",
        "--balance-abs-threshold 6 ",
        "--balance-rel-threshold 1.25",
    ):
        assert flag in body + " "
    pure = _body(export_router(make_router("prefix_affinity"), "sglang-router"))
    assert "--balance-abs-threshold 1000000 " in pure  # the fallback can never engage


def test_ray_serve_llm_config_is_python_with_the_thresholds() -> None:
    def kwargs(name: str, **options: float) -> dict[str, object]:
        tree = ast.parse(_body(export_router(make_router(name, **options), "ray-serve-llm")))
        config = next(n.value for n in tree.body if isinstance(n, ast.Assign))
        source = ast.unparse(config).replace("float('inf')", "None")
        router_config = ast.literal_eval(source.replace("PrefixCacheAffinityRouter", "'cls'"))
        assert router_config["request_router_config"]["request_router_class"] == "cls"
        return router_config["request_router_config"]["request_router_kwargs"]

    got = kwargs("prefix", balance_abs_threshold=7, match_rate_threshold=0.2)
    assert got == {"imbalanced_threshold": 7, "match_rate_threshold": 0.2}
    assert kwargs("prefix_affinity")["imbalanced_threshold"] is None  # float("inf")


def test_llm_d_config_weights_the_scorers_and_keys_blocks_like_the_cache() -> None:
    def profile(name: str, **options: int) -> tuple[dict, dict]:
        doc = yaml.safe_load(_body(export_router(make_router(name, **options), "llm-d")))
        plugins = {p["type"]: p.get("parameters", {}) for p in doc["plugins"]}
        weights = {p["pluginRef"]: p.get("weight") for p in doc["schedulingProfiles"][0]["plugins"]}
        return plugins, weights

    plugins, weights = profile("prefix", block_size=32, cache_blocks=500)
    assert plugins["prefix-cache-scorer"] == {"blockSizeTokens": 32, "lruCapacityPerServer": 500}
    assert weights == {
        "prefix-cache-scorer": 3,
        "queue-scorer": 2,
        "kv-cache-utilization-scorer": 2,
        "max-score-picker": None,
    }
    _, pure = profile("prefix_affinity")
    assert set(pure) == {"prefix-cache-scorer", "max-score-picker"}
    _, kv = profile("least_kv")
    assert "kv-cache-utilization-scorer" in kv


def test_a_format_for_the_other_kind_is_refused() -> None:
    with pytest.raises(TypeError, match="router's settings export to"):
        export_config(make_router("prefix"), "vllm")
    with pytest.raises(TypeError, match="takes a router"):
        export_config(GenerationConfig(), "llm-d")
    with pytest.raises(ValueError, match="fmt must be one of"):
        export_router(make_router("prefix"), "nginx")
