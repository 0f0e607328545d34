"""Export a generative method's scheduler knobs to the serving engines' own flags.

vLLM, SGLang, TGI and TensorRT-LLM all do continuous batching, each with its own names and
its own way of counting. Each snippet starts with comments where the engine counts
differently from labserve (whose knobs follow vLLM V1), so that a setting tuned here is
deployed with its meaning, not just its number. ``MODEL`` stands for your model's id.

Flag names and meanings as the engines document them: vLLM's engine arguments; SGLang's
server arguments; TGI's ``text-generation-launcher`` arguments; TensorRT-LLM's LLM API
(``max_batch_size``, ``max_num_tokens``, ``scheduler_config.capacity_scheduler_policy``),
as a YAML for ``trtllm-serve --extra_llm_api_options``.

>>> print(export_engine(GenerationConfig(max_num_seqs=64), "vllm"))  # doctest: +ELLIPSIS
# vLLM engine arguments ...
"""

from __future__ import annotations

from labserve.config.generation import GenerationConfig

__all__ = ["ENGINE_FORMATS", "export_engine"]

ENGINE_FORMATS: tuple[str, ...] = ("vllm", "sglang", "tgi", "tensorrt-llm")
"""The engines :func:`export_engine` writes flags for."""

_NO_STATIC = (
    "strategy 'static' (a batch runs until its longest sequence ends) is labserve's baseline"
    " for teaching; {engine} always batches continuously, so these flags give continuous"
    " batching with the same caps."
)


def _command(head: str, flags: list[tuple[str, object]]) -> str:
    """A shell command, one flag per line."""
    parts = [head] + [f"{flag} {value}".rstrip() for flag, value in flags]
    return " \\\n  ".join(parts) + "\n"


def _common_notes(cfg: GenerationConfig, engine: str) -> list[str]:
    notes = []
    if cfg.strategy == "static":
        notes.append(_NO_STATIC.format(engine=engine))
    if cfg.ttft_slo_ms or cfg.tpot_slo_ms:
        notes.append(
            f"ttft_slo_ms={cfg.ttft_slo_ms:g} and tpot_slo_ms={cfg.tpot_slo_ms:g} are goodput"
            " targets, not engine settings: measure them with"
            f" `vllm bench serve --goodput ttft:{cfg.ttft_slo_ms:g} tpot:{cfg.tpot_slo_ms:g}`"
            " or `labserve load ... --goodput`."
        )
    if cfg.isolate_errors:
        notes.append(
            f"isolate_errors (bisecting a failed step) is labserve-only: in {engine} a step"
            " that raises fails the whole engine step."
        )
    return notes


def _unmapped_limits(cfg: GenerationConfig, engine: str, why: str = "") -> str:
    """The note for labserve's admission limits that an engine has no flag for."""
    limits = f"max_queue_size={cfg.max_queue_size}"
    if cfg.request_timeout_ms:
        limits += f" and request_timeout_ms={cfg.request_timeout_ms:g}"
    return (
        f"{limits}: {engine} has no engine flag for this{f' ({why})' if why else ''};"
        " refuse or time out in a proxy or the client."
    )


def _vllm(cfg: GenerationConfig) -> str:
    notes = _common_notes(cfg, "vLLM")
    flags: list[tuple[str, object]] = [
        ("--max-num-seqs", cfg.max_num_seqs),
        ("--max-num-batched-tokens", cfg.max_num_batched_tokens),
        (
            "--enable-chunked-prefill"
            if cfg.enable_chunked_prefill
            else "--no-enable-chunked-prefill",
            "",
        ),
    ]
    if not cfg.enable_chunked_prefill:
        notes.append(
            "chunked prefill off: vLLM V1 lets later, shorter prompts pass a prompt that does"
            " not fit the step; labserve keeps the queue's order (a long prompt waits at the"
            " head until a step has room), so under load vLLM serves short prompts sooner and"
            " the long one later. vLLM also refuses to start unless --max-num-batched-tokens is"
            " at least --max-model-len then; labserve refuses a longer prompt at admission."
        )
    if cfg.long_prefill_token_threshold:
        flags.append(("--long-prefill-token-threshold", cfg.long_prefill_token_threshold))
    if cfg.scheduling_policy == "lpm":
        flags.append(("--scheduling-policy", "fcfs"))
        notes.append(
            "scheduling_policy='lpm': vLLM has no longest-prefix-match order (fcfs or"
            " priority); its prefix cache still saves the prefill, in arrival order."
        )
    else:
        flags.append(("--scheduling-policy", cfg.scheduling_policy))
    caching = cfg.enable_prefix_caching is not False  # unset: on, as for a paged model
    flags.append(("--enable-prefix-caching" if caching else "--no-enable-prefix-caching", ""))
    if caching:
        notes.append(
            "prefix caching: vLLM registers a block's hash when the block is scheduled, so a"
            " request admitted in the same step as the one computing it may hit; labserve"
            " registers once the step that wrote it has completed (a failed step caches"
            " nothing). Both hit full blocks only, at most all but the last prompt token."
        )
    if cfg.kv_limited:
        flags += [
            ("--block-size", cfg.block_size),
            ("--num-gpu-blocks-override", cfg.num_kv_blocks),
        ]
        notes.append(
            f"num_kv_blocks={cfg.num_kv_blocks} x block_size={cfg.block_size}: vLLM's"
            " --num-gpu-blocks-override is a testing override; in production size the cache"
            " with --gpu-memory-utilization, and check that the blocks fit the GPU."
        )
    else:
        notes.append(
            "no KV budget here (num_kv_blocks=0): vLLM sizes its cache from"
            " --gpu-memory-utilization, and preempts (recomputes) when it runs out, as"
            " labserve does with a budget."
        )
    notes.append(_unmapped_limits(cfg, "vLLM", "its queue is unbounded"))
    return _engine_text(
        "vLLM engine arguments (vllm serve)", notes, _command("vllm serve MODEL", flags)
    )


def _sglang(cfg: GenerationConfig) -> str:
    notes = _common_notes(cfg, "SGLang")
    chunk = cfg.max_num_batched_tokens if cfg.enable_chunked_prefill else -1
    if cfg.enable_chunked_prefill and cfg.long_prefill_token_threshold:
        chunk = min(chunk, cfg.long_prefill_token_threshold)
        notes.append(
            f"long_prefill_token_threshold={cfg.long_prefill_token_threshold} caps one"
            " prompt's chunk: SGLang's nearest is a smaller --chunked-prefill-size (it"
            " caps every chunk)."
        )
    flags: list[tuple[str, object]] = [
        ("--max-running-requests", cfg.max_num_seqs),
        ("--chunked-prefill-size", chunk),
        ("--max-prefill-tokens", cfg.max_num_batched_tokens),
    ]
    notes.append(
        f"max_num_batched_tokens={cfg.max_num_batched_tokens} counts a step's decodes and"
        " prompt chunks together; SGLang runs prefill batches apart from decode batches by"
        " default (--enable-mixed-chunk mixes them), so its --max-prefill-tokens and"
        " --chunked-prefill-size count prompt tokens only: the same number lets more"
        " prompt tokens into a step there."
    )
    if not cfg.enable_chunked_prefill:
        notes.append("chunked prefill off: --chunked-prefill-size -1 disables it in SGLang.")
    if cfg.scheduling_policy in ("fcfs", "lpm"):
        flags.append(("--schedule-policy", cfg.scheduling_policy))
    else:
        notes.append(
            "scheduling_policy='priority': SGLang's --schedule-policy orders by prefix"
            " sharing (lpm, dfs-weight), arrival (fcfs) or at random; request priorities need"
            " a version with priority scheduling (check `--help`)."
        )
    if cfg.enable_prefix_caching is False:
        flags.append(("--disable-radix-cache", ""))
    else:
        notes.append(
            "prefix caching: SGLang's radix cache matches tokens at --page-size granularity"
            " (1 by default: a shared prefix shorter than a block still hits there) and"
            " evicts least-recently-used leaves; labserve hits whole blocks only."
        )
    if cfg.scheduling_policy == "lpm":
        notes.append(
            "scheduling_policy='lpm': SGLang falls back to fcfs when more than 128 requests"
            " wait, as labserve does."
        )
    if cfg.kv_limited:
        flags += [
            ("--page-size", cfg.block_size),
            ("--max-total-tokens", cfg.num_kv_blocks * cfg.block_size),
        ]
        notes.append(
            "the KV budget as tokens: --max-total-tokens is SGLang's KV pool in tokens (pages"
            " of --page-size); when it runs out SGLang retracts running requests and"
            " recomputes them, as labserve preempts."
        )
    notes.append(_unmapped_limits(cfg, "SGLang"))
    return _engine_text(
        "SGLang server arguments",
        notes,
        _command("python -m sglang.launch_server --model-path MODEL", flags),
    )


def _tgi(cfg: GenerationConfig) -> str:
    notes = _common_notes(cfg, "TGI")
    concurrent = cfg.max_num_seqs + cfg.max_queue_size
    flags: list[tuple[str, object]] = [
        ("--max-concurrent-requests", concurrent),
        ("--max-batch-size", cfg.max_num_seqs),
        ("--max-batch-prefill-tokens", cfg.max_num_batched_tokens),
    ]
    notes.append(
        f"--max-concurrent-requests counts every request in the server, running or waiting,"
        f" and refuses the next (HTTP 429): labserve's max_num_seqs={cfg.max_num_seqs} plus"
        f" max_queue_size={cfg.max_queue_size}."
    )
    notes.append(
        f"--max-batch-prefill-tokens counts prompt tokens in one prefill pass (TGI runs"
        f" prefill apart from decodes); labserve's max_num_batched_tokens="
        f"{cfg.max_num_batched_tokens} counts a step's decodes too. TGI needs it >= the"
        " longest prompt (--max-input-tokens)."
    )
    if cfg.kv_limited:
        total = cfg.num_kv_blocks * cfg.block_size
        flags.append(("--max-batch-total-tokens", total))
        notes.append(
            f"--max-batch-total-tokens {total} = num_kv_blocks x block_size: TGI counts prompt"
            " plus generated tokens of the whole running batch, and admits a request when its"
            " prompt and max_new_tokens fit (it does not preempt); labserve admits on the"
            " prompt and preempts the newest sequence when decodes run out of blocks."
        )
    else:
        notes.append(
            "no KV budget here: TGI infers --max-batch-total-tokens from the memory left"
            " after loading the model."
        )
    if cfg.enable_chunked_prefill is False or cfg.long_prefill_token_threshold:
        notes.append(
            "TGI has no launcher flag for chunked prefill or a per-prompt chunk cap"
            " (enable_chunked_prefill, long_prefill_token_threshold)."
        )
    if cfg.scheduling_policy != "fcfs":
        notes.append(f"scheduling_policy={cfg.scheduling_policy!r}: TGI serves in arrival order.")
    if cfg.request_timeout_ms:
        notes.append(
            f"request_timeout_ms={cfg.request_timeout_ms:g}: TGI has no per-request timeout"
            " flag; time out in the client or a proxy."
        )
    return _engine_text(
        "TGI launcher arguments (text-generation-launcher)",
        notes,
        _command("text-generation-launcher --model-id MODEL", flags),
    )


def _tensorrt_llm(cfg: GenerationConfig) -> str:
    notes = _common_notes(cfg, "TensorRT-LLM")
    if cfg.strategy == "static":
        policy = "STATIC_BATCH"
        notes = [n for n in notes if not n.startswith("strategy 'static'")]
        notes.append(
            "strategy 'static' -> STATIC_BATCH, TensorRT-LLM's legacy mode (not recommended"
            " for production): the baseline, as here."
        )
    elif cfg.kv_limited:
        policy = "MAX_UTILIZATION"
        notes.append(
            "with a KV budget labserve admits what fits now and preempts when decodes run"
            " out of blocks: that is MAX_UTILIZATION (it pauses requests);"
            " GUARANTEED_NO_EVICT, the default, reserves a request's whole length at"
            " admission and never pauses (fewer requests run at once)."
        )
    else:
        policy = "GUARANTEED_NO_EVICT"
        notes.append(
            "no KV budget here, so nothing is ever preempted: GUARANTEED_NO_EVICT (the"
            " default) behaves alike; MAX_UTILIZATION packs more when the cache is tight."
        )
    notes.append(
        f"max_num_tokens counts a step's prompt and generation tokens together, as"
        f" max_num_batched_tokens={cfg.max_num_batched_tokens} does; max_batch_size caps the"
        " requests scheduled in one step, as max_num_seqs does. An engine built with smaller"
        " build-time caps uses those."
    )
    if cfg.long_prefill_token_threshold:
        notes.append(
            f"long_prefill_token_threshold={cfg.long_prefill_token_threshold}: TensorRT-LLM"
            " chunks by max_num_tokens only."
        )
    if cfg.scheduling_policy == "priority":
        notes.append(
            "scheduling_policy='priority': set request priorities in TensorRT-LLM's"
            " executor API; the capacity policy does not order requests."
        )
    lines = [
        f"max_batch_size: {cfg.max_num_seqs}",
        f"max_num_tokens: {cfg.max_num_batched_tokens}",
        f"enable_chunked_prefill: {'true' if cfg.enable_chunked_prefill else 'false'}",
        "scheduler_config:",
        f"  capacity_scheduler_policy: {policy}",
    ]
    if cfg.kv_limited:
        total = cfg.num_kv_blocks * cfg.block_size
        lines += ["kv_cache_config:", f"  max_tokens: {total}"]
        notes.append(
            f"kv_cache_config.max_tokens {total} = num_kv_blocks x block_size (TensorRT-LLM"
            " sizes its blocks itself)."
        )
    return _engine_text(
        "TensorRT-LLM LLM API options (YAML for trtllm-serve MODEL --extra_llm_api_options FILE)",
        notes,
        "\n".join(lines) + "\n",
    )


def _engine_text(title: str, notes: list[str], body: str) -> str:
    head = [f"# {title}, from labserve's GenerationConfig."]
    head += [f"# Differs: {n}" for n in notes]
    return "\n".join(head) + "\n" + body


def export_engine(cfg: GenerationConfig, fmt: str) -> str:
    """``cfg``'s knobs as ``fmt``'s flags (or YAML), with a comment wherever they differ.

    Raises:
        ValueError: ``fmt`` is not one of :data:`ENGINE_FORMATS`.
        TypeError: ``cfg`` is not a GenerationConfig.
    """
    if not isinstance(cfg, GenerationConfig):
        raise TypeError(f"export_engine needs a GenerationConfig, got {type(cfg).__name__}")
    writers = {"vllm": _vllm, "sglang": _sglang, "tgi": _tgi, "tensorrt-llm": _tensorrt_llm}
    if fmt not in writers:
        raise ValueError(f"fmt must be one of {', '.join(map(repr, ENGINE_FORMATS))}, got {fmt!r}")
    return writers[fmt](cfg)
