"""``labserve export``: settings written for another server.

Batching settings as a labserve/BentoML YAML, a Ray Serve ``@serve.batch``, a Triton or a
TF Serving config; generation settings as vLLM, SGLang, TGI or TensorRT-LLM flags. A setting
of the other kind is refused in one line that says which formats take it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from labserve.base.vocabulary import STRATEGIES
from labserve.cli._common import UsageError, check_sections
from labserve.config.generation import GENERATION_STRATEGIES, SCHEDULING_POLICIES
from labserve.lab.engines import ENGINE_FORMATS

if TYPE_CHECKING:
    from labserve.cli._common import Subcommands

__all__ = ["add_command", "run"]

_GENERATION_FLAGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "long_prefill_token_threshold",
    "scheduling_policy",
    "num_kv_blocks",
    "block_size",
)


def add_command(sub: Subcommands) -> None:
    """The ``export`` subcommand (batching settings for another server)."""
    export = sub.add_parser(
        "export",
        help="batching settings as a labserve/BentoML YAML, Ray Serve or Triton config;"
        " generation settings as vLLM, SGLang, TGI or TensorRT-LLM flags",
    )
    export.add_argument(
        "format",
        choices=("labserve", "ray", "triton", "tfserving", *ENGINE_FORMATS),
        help="labserve/BentoML YAML, a Ray Serve @serve.batch, a Triton config.pbtxt fragment, "
        "a TF Serving batching_parameters file; or a generation engine's flags",
    )
    export.add_argument("--config", help="read the settings from this labserve/BentoML YAML")
    export.add_argument("--runner", help="the runner's section (and the name written)")
    export.add_argument("--method", help="the method name in the snippet")
    export.add_argument(
        "--strategy",
        choices=STRATEGIES + GENERATION_STRATEGIES,
        help="override the strategy (continuous or static for a generation format)",
    )
    export.add_argument("--max-batch-size", type=int, help="override max_batch_size")
    export.add_argument("--max-latency-ms", type=float, help="override max_latency_ms")
    gen = export.add_argument_group("generation settings (vllm, sglang, tgi, tensorrt-llm)")
    gen.add_argument("--max-num-seqs", type=int, help="most sequences running at once")
    gen.add_argument("--max-num-batched-tokens", type=int, help="most tokens in one step")
    gen.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="split prompts that do not fit a step",
    )
    gen.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="reuse the KV blocks of a cached prompt prefix",
    )
    gen.add_argument("--long-prefill-token-threshold", type=int, help="one prompt's chunk cap")
    gen.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, help="queue order")
    gen.add_argument("--num-kv-blocks", type=int, help="KV-cache blocks in all (0: no limit)")
    gen.add_argument("--block-size", type=int, help="tokens per KV-cache block")
    export.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Print the settings ``args`` give (file, then flags) in ``args.format``."""
    from labserve.config.batching import BatchingConfig, BatchingLayer
    from labserve.config.file import load_config_file
    from labserve.lab.export import export_config

    if args.format in ENGINE_FORMATS:
        _export_engine(args)
        return
    given = [k for k in _GENERATION_FLAGS if getattr(args, k) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise UsageError(
            f"{flag} is a generation setting: export it with vllm, sglang, tgi or tensorrt-llm"
        )
    file = load_config_file(args.config) if args.config else None
    if file is not None and args.runner:
        check_sections(args.config, [], runner=args.runner)
    flags = {
        key: value
        for key, value in (
            ("strategy", args.strategy),
            ("max_batch_size", args.max_batch_size),
            ("max_latency_ms", args.max_latency_ms),
        )
        if value is not None
    }
    layers = [file.global_batching, file.for_runner(args.runner or "")] if file else []
    cfg = BatchingConfig.from_layers(*layers, BatchingLayer.from_mapping(flags))
    print(export_config(cfg, args.format, runner=args.runner, method=args.method), end="")


def _export_engine(args: argparse.Namespace) -> None:
    """A generative method's knobs, from the flags, as an engine's flags."""
    from labserve.base.errors import ConfigError
    from labserve.config.file import load_config_file
    from labserve.config.generation import GenerationConfig
    from labserve.lab.export import export_config

    if args.max_batch_size is not None or args.max_latency_ms is not None:
        raise UsageError(
            f"{args.format} exports a generative method's settings: give them as"
            " --max-num-seqs, --max-num-batched-tokens, ... (not --max-batch-size"
            " or --max-latency-ms)"
        )
    cfg = GenerationConfig()
    if args.config:
        if not args.runner:
            raise UsageError("--config with a generation format needs --runner (whose section)")
        file = load_config_file(args.config)
        try:
            cfg = cfg.replace(**file.generation_for(args.runner))
        except ConfigError as exc:
            key = f"runners.{args.runner}.generation.{exc.key}"
            raise ConfigError(key, exc.value, exc.rule, source=file.source) from None
    changes = {k: getattr(args, k) for k in _GENERATION_FLAGS if getattr(args, k) is not None}
    if args.strategy is not None:
        changes["strategy"] = args.strategy
    print(export_config(cfg.replace(**changes), args.format), end="")
