"""Export a method's batching settings for deployment: labserve YAML, Ray, Triton, TF Serving.

A generative method's scheduler knobs (a GenerationConfig) go to the engines' own flags:
vLLM, SGLang, TGI and TensorRT-LLM (:mod:`labserve.lab.engines`); a fleet's router (a
:class:`~labserve.generation.routing.Router`) to SGLang's router, Ray Serve LLM and llm-d
(:mod:`labserve.lab.generation.routers`).

The caps carry over; the semantics do not always. Each snippet starts with a comment that
says where its target counts differently, so nobody deploys a tuned number with a silently
different meaning.

>>> print(export_config(BatchingConfig(max_batch_size=16), "triton"))  # doctest: +ELLIPSIS
# Triton config.pbtxt fragment ...
"""

from __future__ import annotations

import yaml

from labserve.config.batching import BatchingConfig
from labserve.config.generation import GenerationConfig
from labserve.generation.routing import Router
from labserve.lab.engines import ENGINE_FORMATS, export_engine
from labserve.lab.generation.routers import ROUTER_FORMATS, export_router
from labserve.runtime.generation.method import GenerativeMethod
from labserve.runtime.runner import RunnerMethod

__all__ = ["BATCHING_FORMATS", "FORMATS", "export_config"]

BATCHING_FORMATS: tuple[str, ...] = ("labserve", "ray", "triton", "tfserving")
"""The formats for a request-batching method's BatchingConfig."""

FORMATS: tuple[str, ...] = BATCHING_FORMATS + ENGINE_FORMATS + ROUTER_FORMATS
"""The formats :func:`export_config` writes: BATCHING_FORMATS for a batchable method,
ENGINE_FORMATS (vLLM, SGLang, TGI, TensorRT-LLM) for a generative one, ROUTER_FORMATS
(SGLang's router, Ray Serve LLM, llm-d) for a router."""

_LABSERVE_ONLY = (
    "strategy",
    "on_overload",
    "max_queue_size",
    "max_concurrent_batches",
    "max_batch_tokens",
    "length_buckets",
    "padding",
)


def _resolve(
    source: object, runner: str | None, method: str | None
) -> tuple[BatchingConfig, str | None, str | None]:
    if isinstance(source, BatchingConfig):
        return source, runner, method
    if not isinstance(source, RunnerMethod):
        raise TypeError(
            f"export_config needs a RunnerMethod (runner.<method>) or a BatchingConfig, "
            f"got {type(source).__name__}"
        )
    if not source.batchable:
        raise TypeError(f"{source.runner.name}.{source.name} is not batchable: nothing to export")
    return source.config, runner or source.runner.name, method or source.name


def _labserve(cfg: BatchingConfig, runner: str | None, method: str | None) -> str:
    if runner == "batching":
        raise ValueError("runner must not be named 'batching': that key is the global section")
    if runner:
        scope = f"runner {runner!r}; the section applies to every batchable method of the runner"
    else:
        scope = "the global section: it applies to every runner"
    # YAML has no tuples: bucket bounds are a list there.
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.as_dict().items()}
    body = {"batching": settings} if runner is None else {runner: {"batching": settings}}
    header = [
        f"# labserve/BentoML config, {scope}"
        + (f" (exported from method {method!r})." if method else "."),
        "# Differs: BentoML reads only enabled, max_batch_size and max_latency_ms, and counts the"
        " estimated model time against max_latency_ms (labserve caps the queue wait);"
        f" {', '.join(_LABSERVE_ONLY)} and isolate_errors are labserve-only;"
        " request_timeout_ms is closest to BentoML's service-wide traffic.timeout (seconds).",
    ]
    if cfg.latency_slo_ms:
        header.append(
            f"# latency_slo_ms={cfg.latency_slo_ms:g} (p{cfg.slo_percentile:g}) is labserve's"
            " target, planned for by batching; BentoML's nearest is max_latency_ms used as a"
            " whole-latency budget, which it enforces by refusing (503) what it predicts will"
            f" miss it: set max_latency_ms: {cfg.latency_slo_ms:g} there for that behaviour."
        )
    text = yaml.safe_dump({"runners": body}, sort_keys=False, default_flow_style=False)
    return "\n".join(header) + "\n" + text


def _ray(cfg: BatchingConfig, method: str | None) -> str:
    strategy = cfg.effective_strategy
    if strategy == "off":
        size, wait_s = 1, 0.0
        note = "batching is off here: Ray calls the method with lists of one request."
    else:
        size, wait_s = cfg.max_batch_size, cfg.max_latency_s
        note = (
            "Ray waits like labserve's 'fixed' (batch_wait_timeout_s counts from the first"
            " request of a batch) and its max_batch_size counts requests, not items;"
            + (
                f" labserve's {strategy!r} strategy has no Ray equivalent."
                if strategy != "fixed"
                else " the strategy matches."
            )
        )
    args = f"max_batch_size={size}, batch_wait_timeout_s={_number(wait_s)}"
    if cfg.max_concurrent_batches != 1:
        args += f", max_concurrent_batches={cfg.max_concurrent_batches}"
    tokens = ""
    if strategy != "off" and cfg.max_batch_tokens:
        # Ray's batch_size_fn makes max_batch_size count what it returns: here, tokens.
        args = (
            f"max_batch_size={cfg.max_batch_tokens}, batch_wait_timeout_s={_number(wait_s)},"
            " batch_size_fn=_tokens"
        )
        tokens = (
            f"# max_batch_tokens={cfg.max_batch_tokens}: Ray's batch_size_fn sums what it"
            " returns per request and caps that at max_batch_size, so here it counts tokens;"
            " Ray counts each request's own length (no padding), labserve the padded batch"
            f" (items x its longest), and labserve's max_batch_size={cfg.max_batch_size}"
            " item cap has no second Ray setting.\n"
        )
    tokens += _ray_lengths(cfg)
    name = method or "predict"
    timeout = ""
    if cfg.latency_slo_ms:
        timeout += (
            f"# latency_slo_ms={cfg.latency_slo_ms:g}: Ray has no latency target;"
            " batch_wait_timeout_s is a batching wait (the nearest: keep it below the target"
            " less the batch's run time).\n"
        )
    if cfg.request_timeout_s:
        timeout += (
            "# request_timeout_ms: Ray Serve's proxy-wide http_options.request_timeout_s="
            f"{_number(cfg.request_timeout_s)} (serve.start), not per method.\n"
        )
    helper = ""
    if "batch_size_fn" in args:
        helper = (
            "def _tokens(request) -> int:  # one request's tokens (its input's length)\n"
            "    return len(request)\n"
            "\n"
            "\n"
        )
    return (
        "# Ray Serve: decorate a method of your @serve.deployment class.\n"
        f"# Differs: {note}\n"
        f"{timeout}{tokens}"
        "from ray import serve\n"
        "\n"
        "\n"
        f"{helper}"
        f"@serve.batch({args})\n"
        f"async def {name}(self, requests: list) -> list:  # one result per request, in order\n"
        "    ...\n"
    )


def _ray_lengths(cfg: BatchingConfig) -> str:
    """Comments for the length settings Ray has no equivalent of."""
    lines = ""
    if cfg.length_buckets:
        lines += (
            f"# length_buckets={list(cfg.length_buckets)}: Ray has no length buckets (#49844);"
            " the nearest is one deployment (or method) per bucket, routed by length.\n"
        )
    if not cfg.padding:
        lines += (
            "# padding=False (one length per batch): Ray batches whatever comes; group by"
            " length before @serve.batch for that.\n"
        )
    return lines


def _triton_tokens(cfg: BatchingConfig) -> list[str]:
    """Comments mapping the token settings to Triton's nearest (it has no token budget)."""
    lines = []
    if cfg.max_batch_tokens:
        lines.append(
            f"# max_batch_tokens={cfg.max_batch_tokens}: Triton has no token budget; its"
            " nearest is a max_batch_size for your longest expected rows (budget / length)."
        )
    if cfg.length_buckets:
        sizes = (
            sorted(
                {
                    max(1, min(cfg.max_batch_size, cfg.max_batch_tokens // b))
                    for b in cfg.length_buckets
                }
            )
            if cfg.max_batch_tokens
            else []
        )
        lines.append(
            f"# length_buckets={list(cfg.length_buckets)}: Triton does not group by length;"
            " preferred_batch_size prefers batch sizes, not lengths"
            + (f" (the budget's sizes per bucket would be {sizes})" if sizes else "")
            + ". Without padding, Triton's ragged batching (allow_ragged_batch on the input,"
            " a batch_input of kind BATCH_ACCUMULATED_ELEMENT_COUNT) hands the model the rows"
            " concatenated with their offsets: the model must change to read them."
        )
    return lines


def _tfserving(cfg: BatchingConfig, runner: str | None, method: str | None) -> str:
    model = ".".join(p for p in (runner, method) if p) or "your model"
    strategy = cfg.effective_strategy
    lines = [f"# TF Serving batching_parameters (--batching_parameters_file) for {model}."]
    if strategy == "off":
        lines.append("# Differs: batching is off here: run TF Serving without --enable_batching.")
        return "\n".join(lines) + "\n"
    lines.append(
        "# Differs: TF Serving fires a batch when full or batch_timeout_micros after its first"
        " request, like labserve's 'fixed'"
        + ("" if strategy == "fixed" else f"; labserve's {strategy!r} has no TF equivalent")
        + "; pad_variable_length_inputs pads ragged inputs to the batch's longest, as"
        " labserve's padding does (undocumented, TF Serving #1934; it has returned wrong"
        " results for short rows when the model does not mask, tensor2tensor #1489)."
    )
    if cfg.max_batch_tokens:
        lines.append(
            f"# max_batch_tokens={cfg.max_batch_tokens}: TF Serving has no token budget;"
            " its nearest is max_batch_size for your longest expected rows (budget / length)."
        )
    if cfg.length_buckets:
        lines.append(
            f"# length_buckets={list(cfg.length_buckets)}: no TF equivalent;"
            " allowed_batch_sizes pads the number of items up (labserve never pads items)."
        )
    lines += [
        f"max_batch_size {{ value: {cfg.max_batch_size} }}",
        f"batch_timeout_micros {{ value: {round(cfg.max_latency_ms * 1000)} }}",
        f"num_batch_threads {{ value: {cfg.max_concurrent_batches} }}",
        f"max_enqueued_batches {{ value: {max(1, cfg.max_queue_size // cfg.max_batch_size)} }}",
        f"pad_variable_length_inputs: {'true' if cfg.padding else 'false'}",
    ]
    return "\n".join(lines) + "\n"


def _triton(cfg: BatchingConfig, runner: str | None, method: str | None) -> str:
    model = ".".join(p for p in (runner, method) if p) or "your model"
    strategy = cfg.effective_strategy
    lines = [
        f"# Triton config.pbtxt fragment for {model}.",
    ]
    if strategy == "off":
        lines.append(
            "# Differs: batching is off here, so no dynamic_batching block: Triton runs each"
            " request alone (a request may still carry up to max_batch_size items)."
        )
        lines.append(f"max_batch_size: {cfg.max_batch_size}")
        return "\n".join(lines) + "\n"
    delay_us = round(cfg.max_latency_ms * 1000)
    if strategy == "fixed":
        match = "the strategy matches"
    else:
        match = f"labserve's {strategy!r} strategy has no Triton equivalent"
    concurrency = ""
    if cfg.max_concurrent_batches != 1:
        concurrency = (
            f"; max_concurrent_batches={cfg.max_concurrent_batches} is closest to"
            f" instance_group count {cfg.max_concurrent_batches}"
        )
    lines.append(
        "# Differs: Triton holds a batch up to max_queue_delay_microseconds from its oldest"
        f" request while it is short of max_batch_size, like labserve's 'fixed'; {match}"
        f"{concurrency}."
    )
    if cfg.latency_slo_ms:
        lines.append(
            f"# latency_slo_ms={cfg.latency_slo_ms:g}: Triton has no latency target;"
            " max_queue_delay_microseconds is a batching wait (the nearest: keep it below the"
            " target less the batch's run time; model_analyzer searches for it offline)."
        )
    lines += _triton_tokens(cfg)
    policy = [f"    max_queue_size: {cfg.max_queue_size}"]
    if cfg.request_timeout_s:
        lines.append(
            "# request_timeout_ms: Triton's default_timeout_microseconds bounds only the time in"
            " the queue (timeout_action REJECT); labserve's counts queue plus model."
        )
        policy += [
            "    timeout_action: REJECT",
            f"    default_timeout_microseconds: {round(cfg.request_timeout_ms * 1000)}",
        ]
    lines += [
        f"max_batch_size: {cfg.max_batch_size}",
        "dynamic_batching {",
        f"  max_queue_delay_microseconds: {delay_us}",
        "  default_queue_policy {",
        *policy,
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    """A float as Python source, without float noise (0.01, not 0.010000000000000002)."""
    text = f"{value:.9f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def _router(source: object, fmt: str) -> str:
    if not isinstance(source, Router):
        raise TypeError(f"{fmt!r} takes a router (make_router(...)), got {type(source).__name__}")
    if fmt not in ROUTER_FORMATS:
        raise TypeError(f"a router's settings export to {', '.join(ROUTER_FORMATS)}, not {fmt!r}")
    return export_router(source, fmt)


def export_config(
    source: RunnerMethod | GenerativeMethod | BatchingConfig | GenerationConfig | Router,
    fmt: str = "labserve",
    *,
    runner: str | None = None,
    method: str | None = None,
) -> str:
    """The settings of ``source`` as a config file or snippet for ``fmt``.

    Args:
        source: a batchable runner method (``runner.predict``: its current config, with
            live changes), a :class:`BatchingConfig`, or a generative method's
            :class:`GenerationConfig`, or a generative runner method (``runner.generate``:
            its current GenerationConfig), or a fleet's router (``make_router(...)``).
        fmt: for batching, ``"labserve"`` (a YAML file that :func:`labserve.load_config_file`
            and ``Runner(config=...)`` read, in BentoML's shape), ``"ray"`` (an
            ``@serve.batch`` decorator), ``"triton"`` (a ``config.pbtxt`` fragment) or
            ``"tfserving"`` (a ``batching_parameters`` file); for generation, ``"vllm"``,
            ``"sglang"``, ``"tgi"`` (each a command line) or ``"tensorrt-llm"`` (a YAML of
            LLM API options); for a router, ``"sglang-router"``, ``"ray-serve-llm"`` or
            ``"llm-d"``.
        runner: the runner name to write; defaults to the method's runner. With a
            BatchingConfig and no runner, the YAML is the global ``runners.batching`` section.
        method: the method name for the snippet; defaults to the method's own.

    Returns:
        The text, starting with a comment on where the target's semantics differ.

    Raises:
        ValueError: ``fmt`` is not one of :data:`FORMATS`, ``method`` is not an identifier,
            or the runner is named ``batching``.
        TypeError: ``source`` is none of these, the method is not batchable, or ``fmt``
            is for the other kind of config (a batching format for a GenerationConfig).

    >>> print(export_config(runner.predict, "ray"))  # doctest: +SKIP
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(map(repr, FORMATS))}, got {fmt!r}")
    if method is not None and not method.isidentifier():
        raise ValueError(f"method must be a Python identifier, got {method!r}")
    if isinstance(source, Router) or fmt in ROUTER_FORMATS:
        return _router(source, fmt)
    generation = source if isinstance(source, GenerationConfig) else None
    if isinstance(source, GenerativeMethod):
        generation = source.config
    if generation is not None:
        if fmt not in ENGINE_FORMATS:
            raise TypeError(
                f"a generative method's settings export to {', '.join(ENGINE_FORMATS)}, not {fmt!r}"
            )
        return export_engine(generation, fmt)
    if fmt in ENGINE_FORMATS:
        raise TypeError(
            f"{fmt!r} takes a generative method's GenerationConfig; a batchable method's"
            f" settings export to {', '.join(BATCHING_FORMATS)}"
        )
    cfg, runner_name, method_name = _resolve(source, runner, method)
    if fmt == "labserve":
        return _labserve(cfg, runner_name, method_name)
    if fmt == "ray":
        return _ray(cfg, method_name)
    if fmt == "tfserving":
        return _tfserving(cfg, runner_name, method_name)
    return _triton(cfg, runner_name, method_name)
