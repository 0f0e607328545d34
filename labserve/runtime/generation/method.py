"""A served generative method: streaming and whole generations, from any thread or loop.

``@labserve.method(generative=True)`` marks a model method that advances a batch of
sequences by one step (a :class:`~labserve.generation.batch.SeqBatch`: each sequence's new
tokens, a prefill chunk or its last output, from its position; it returns the next-token
logits, or the token ids, of the sequences that sample). The runner serves it by
continuous batching (:mod:`labserve.runtime.generation.driver`): labserve owns the
schedule, the KV budget, sampling, stop rules and each sequence's life; the model owns its
tensors. The model's optional hooks and attributes, found on its Runnable:

- ``encode(text) -> list[int]`` (a text prompt; without it prompts are token ids);
- ``token_bytes(id) -> bytes`` or ``decode(ids) -> str`` (the text of what it generates);
- ``free_sequences(ids)`` and ``rollback_step(batch)`` (its state: ended or preempted
  sequences, a step that raised; without ``rollback_step``, ``isolate_errors`` cannot
  bisect a step), for a model that keeps its own caches;
- ``allocate_kv(num_blocks, block_size)`` and ``kv_bytes_per_token``: the model stores K/V
  in labserve's blocks (each step carries the block tables; see
  :mod:`labserve.generation.batch`). ``allocate_kv`` is called once, when the method's
  driver starts, with the pool's size (``num_kv_blocks``, or ``kv_cache_bytes`` over
  ``kv_bytes_per_token`` x ``block_size``, or room for ``max_num_seqs`` sequences of
  ``max_model_len``); the KV figures are then the bytes of the arrays it returns. Such a
  model needs no ``free_sequences`` or ``rollback_step``;
- ``vocab_size``, ``eos_token_id``, ``max_model_len``.

>>> import labserve
>>> from labserve.lab.demo import TinyLM
>>> lm = labserve.Runner(TinyLM, name="lm")
>>> for piece in lm.generate.stream("Once", max_tokens=4, temperature=0):  # doctest: +SKIP
...     print(piece, end="")
>>> lm.generate.run("Once", max_tokens=4, temperature=0).finish_reason  # doctest: +SKIP
'length'
>>> lm.stop()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from labserve.base.clock import Clock
from labserve.base.errors import (
    ConfigError,
    InputError,
    LabServeError,
    LoopThreadError,
    RunnerStoppedError,
)
from labserve.config.generation import PAGED_START_SETTINGS, START_SETTINGS, GenerationConfig
from labserve.generation.admission import check_lengths, check_token_ids
from labserve.generation.api import ChatPrompt, Completion, GenerateRequest
from labserve.generation.blocks import pool_blocks
from labserve.generation.sampling import SamplingParams, SequenceSampler, TextDecoder
from labserve.generation.stats import GenerationSnapshot
from labserve.runtime.generation.driver import GenerationDriver, GenerativeModel, NewSequence
from labserve.runtime.generation.streams import AnyStream, AsyncTokenStream, TokenStream
from labserve.runtime.loop import BackgroundLoop
from labserve.runtime.runnable import MethodSpec
from labserve.runtime.scheduling import LoopHost

__all__ = ["DEFAULT_MAX_TOKENS", "GenerativeMethod"]

DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` when a call gives none (OpenAI's completions default)."""

Prompt = str | Sequence[int] | ChatPrompt


class _Owner(Protocol):
    """What a generative method needs of its Runner."""

    name: str
    clock: Clock

    @property
    def bg(self) -> BackgroundLoop: ...

    @property
    def stopped(self) -> bool: ...

    def _started(self) -> None: ...


class GenerativeMethod:
    """One served generative method of a Runner.

    Thread-safe: every method. ``stream`` and ``run`` block and may not be called from
    labserve's loop thread; ``astream``, ``async_run`` and ``start`` work on any running
    event loop. Sampling settings (``max_tokens``, ``temperature`` — 0 is greedy —,
    ``seed``, ``stop``, ``stop_token_ids``, ``ignore_eos``, ``priority``) are keywords of
    every call; see :class:`~labserve.generation.sampling.SamplingParams`. A
    :class:`~labserve.runtime.served.ServedMethod`.
    """

    generative = True
    batchable = False

    def __init__(
        self, runner: _Owner, spec: MethodSpec, instance: Any, config: GenerationConfig
    ) -> None:
        self.runner = runner
        self.spec = spec
        self.name = spec.name
        self._instance = instance
        self._config = config
        self._lock = threading.Lock()
        self._driver: GenerationDriver | None = None
        self.max_model_len = int(getattr(instance, "max_model_len", 0) or 0)
        vocab = getattr(instance, "vocab_size", None)
        self.vocab_size: int | None = int(vocab) if vocab is not None else None
        eos = getattr(instance, "eos_token_id", None)
        self.eos_token_id: int | None = int(eos) if eos is not None else None
        self.paged = callable(getattr(instance, "allocate_kv", None))
        """Whether the model stores K/V in labserve's blocks (it has ``allocate_kv``)."""
        self._config = config = self._resolved(config)
        self._kv_pool_blocks = self._pool_size(config)

    def _resolved(self, config: GenerationConfig) -> GenerationConfig:
        """``config`` with ``enable_prefix_caching`` decided for this model.

        Raises:
            ConfigError: True for a model that keeps its own caches (labserve cannot
                share K/V it does not hold).
        """
        on = config.enable_prefix_caching
        if on is None:
            return config.replace(enable_prefix_caching=self.paged)
        if on and not self.paged:
            raise ConfigError(
                "enable_prefix_caching",
                on,
                f"false for {type(self._instance).__name__}, which keeps its own caches (no "
                "allocate_kv): a cached prefix is K/V in labserve's blocks",
            )
        return config

    def _pool_size(self, config: GenerationConfig) -> int:
        """The KV pool of a model that stores K/V in our blocks (0: an account). Checked at once.

        Raises:
            ConfigError: a byte budget for a model that keeps its own caches, or a pool
                that cannot be sized (see :func:`~labserve.generation.blocks.pool_blocks`).
        """
        if not self.paged:
            if config.kv_cache_bytes:
                raise ConfigError(
                    "kv_cache_bytes",
                    config.kv_cache_bytes,
                    f"0 for {type(self._instance).__name__}, which keeps its own caches (no "
                    "allocate_kv): labserve cannot size its memory; num_kv_blocks bounds "
                    "the blocks its sequences are counted for",
                )
            return 0
        per_token = int(getattr(self._instance, "kv_bytes_per_token", 0) or 0)
        if config.kv_cache_bytes and per_token < 1:
            raise ConfigError(
                "kv_cache_bytes",
                config.kv_cache_bytes,
                f"0 unless the model declares kv_bytes_per_token "
                f"({type(self._instance).__name__} does not)",
            )
        return pool_blocks(
            num_kv_blocks=config.num_kv_blocks,
            kv_cache_bytes=config.kv_cache_bytes,
            block_size=config.block_size,
            kv_bytes_per_token=per_token,
            max_num_seqs=config.max_num_seqs,
            max_model_len=self.max_model_len,
        )

    # -- settings and figures ----------------------------------------------------------------

    @property
    def config(self) -> GenerationConfig:
        """The latest config asked for (read from the scheduler, its one owner). Thread-safe."""
        return self._driver.config if self._driver is not None else self._config

    @property
    def step_in_flight(self) -> bool:
        """Whether a model step is running in a worker thread."""
        return self._driver is not None and self._driver.step_in_flight

    def configure(self, **changes: Any) -> GenerationConfig:
        """Change scheduling settings live (validated first).

        ``request_timeout_ms``, ``max_queue_size`` and the goodput targets act at once, on
        every sequence admitted from then on; the settings that shape steps apply at the
        next step, where a sequence the new config can never run ends with the typed error
        admission would have given it.
        """
        with self._lock:
            old = self.config
            new = self._resolved(old.replace(**changes))
            for name in PAGED_START_SETTINGS if self.paged else START_SETTINGS:
                if getattr(new, name) != getattr(old, name):
                    raise ConfigError(
                        name,
                        getattr(new, name),
                        f"left at {getattr(old, name)!r} while the runner runs (a start-time "
                        "setting: it sizes the KV memory; set it in the decorator, "
                        "Runner(...) or the config file)",
                    )
            if self._driver is not None:
                self._driver.configure(new)
            else:
                self._config = new
        return new

    def stats(self) -> GenerationSnapshot:
        """The method's figures now (TTFT, ITL, TPOT, goodput, running, KV). Thread-safe."""
        return self._started().snapshot()

    def reset_stats(self) -> None:
        """Forget recorded sequences and steps. Thread-safe."""
        if self._driver is not None:
            self._driver.reset_stats()

    def start_driver(self) -> None:
        """Start the background loop and this method's driver now (idempotent)."""
        self._started()

    # -- calls ---------------------------------------------------------------------------------

    def stream(self, prompt: Prompt, **params: Any) -> TokenStream:
        """Generate from ``prompt``; iterate the returned stream for text pieces. Blocking use.

        Raises a refusal at once (InputError, LengthLimitError, QueueFullError); later
        errors (RequestTimeoutError, ModelError, ...) are raised by the iteration.
        """
        driver = self._started()
        if self.runner.bg.in_loop_thread():
            raise LoopThreadError(
                f"{self.runner.name}.{self.name}.stream() blocks, and was called from "
                "labserve's loop thread; use `async for ... in ...astream()` there"
            )
        seq_id = driver.new_id()
        stream = TokenStream(lambda: driver.cancel_threadsafe(seq_id))
        admitted: concurrent.futures.Future[None] = concurrent.futures.Future()
        driver.submit_threadsafe(seq_id, self._checked(driver, prompt, params, stream), admitted)
        admitted.result()  # the scheduler's refusal, raised here
        return stream

    def run(self, prompt: Prompt, **params: Any) -> Completion:
        """Generate from ``prompt`` and block for the whole generation."""
        with self.stream(prompt, **params) as stream:
            return stream.result()

    def astream(self, prompt: Prompt, **params: Any) -> AsyncTokenStream:
        """Generate from ``prompt``; ``async for`` over the returned stream. Any running loop."""
        loop = asyncio.get_running_loop()
        driver = self._started()
        seq_id = driver.new_id()
        here = loop is driver.loop
        stream = AsyncTokenStream(
            loop,
            (lambda: driver.cancel(seq_id)) if here else lambda: driver.cancel_threadsafe(seq_id),
        )
        arrival_s = self.runner.clock.now()
        if here:  # the server's routes: tokenise and check the prompt off the loop thread
            driver.admit_later(
                seq_id, lambda: self._prepare(prompt, params, stream, arrival_s), stream
            )
        else:
            driver.submit_threadsafe(seq_id, self._checked(driver, prompt, params, stream))
        return stream

    async def async_run(self, prompt: Prompt, **params: Any) -> Completion:
        """Generate from ``prompt`` and await the whole generation, from any running loop."""
        stream = self.astream(prompt, **params)
        try:
            return await stream.result()
        finally:
            await stream.aclose()

    def start(self, request: GenerateRequest) -> AsyncTokenStream:
        """The OpenAI-compatible routes' door (a :class:`Generator`): one request's stream."""
        # A chat goes with its messages: a model with a chat template makes its ids from them.
        chat = ChatPrompt(request.messages, request.prompt) if request.messages else None
        return self.astream(
            chat or request.prompt,
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            seed=request.seed,
            stop=request.stop,
            ignore_eos=request.ignore_eos,
        )

    # -- helpers --------------------------------------------------------------------------------

    def _started(self) -> GenerationDriver:
        if self.runner.stopped:
            raise RunnerStoppedError(self.runner.name)
        driver = self._driver
        if driver is None:
            with self._lock:
                if self._driver is None:
                    self._driver = GenerationDriver(
                        self._model(),
                        self._config,
                        host=LoopHost(self.runner.bg, self.runner.clock),
                        runner=self.runner.name,
                        method=self.name,
                        max_model_len=self.max_model_len,
                        kv_pool_blocks=self._kv_pool_blocks,
                    )
                    self.runner._started()
                driver = self._driver
        return driver

    def _model(self) -> GenerativeModel:
        inst = self._instance
        if self.paged:  # its K/V are in our blocks: freeing and rollback are ours too
            return GenerativeModel(step=getattr(inst, self.name), allocate_kv=inst.allocate_kv)
        return GenerativeModel(
            step=getattr(inst, self.name),
            free_sequences=getattr(inst, "free_sequences", None),
            rollback_step=getattr(inst, "rollback_step", None),
        )

    def _checked(
        self, driver: GenerationDriver, prompt: Prompt, params: dict[str, Any], stream: AnyStream
    ) -> NewSequence:
        """:meth:`_prepare` on the caller's thread: its refusal is counted, then raised."""
        try:
            return self._prepare(prompt, params, stream, self.runner.clock.now())
        except LabServeError as exc:
            driver.refuse(None, exc)
            raise

    def _prepare(
        self, prompt: Prompt, params: dict[str, Any], stream: AnyStream, arrival_s: float
    ) -> NewSequence:
        """Check a call and make its sequence: typed errors for what the call got wrong.

        What the model's context allows is checked before any per-token work (a prompt of
        millions of tokens is refused at once); the config-dependent limits are the
        scheduler's to decide, at admission.
        """
        if params.get("max_tokens") is None:
            params = {**params, "max_tokens": DEFAULT_MAX_TOKENS}
        unknown = set(params) - set(SamplingParams.__dataclass_fields__)
        if unknown:
            raise InputError(
                f"{self.runner.name}.{self.name} does not take {', '.join(sorted(unknown))} "
                f"(it takes {', '.join(SamplingParams.__dataclass_fields__)})",
                sent=sorted(unknown),
            )
        sampling = SamplingParams(**params)
        ids = self._tokens(prompt, sampling.max_tokens)
        sampler = SequenceSampler(
            sampling, self._decoder(), self.eos_token_id, vocab_size=self.vocab_size
        )
        return NewSequence(ids, sampler, stream, arrival_s)

    def _chat_ids(self, prompt: ChatPrompt) -> Sequence[int] | None:
        """The ids of a chat by the model's own template; None when it has none."""
        template = getattr(self._instance, "apply_chat_template", None)
        if template is None:
            return None
        try:
            ids: Sequence[int] | None = template(prompt.messages)
        except Exception as exc:  # the template refuses these messages: the input's fault
            raise InputError(
                f"{self.runner.name}.{self.name}'s chat template could not render the "
                f"messages: {type(exc).__name__}: {exc}",
                sent="the messages",
                expected="messages the model's chat template accepts",
            ) from exc
        return ids

    def _tokens(self, prompt: Prompt, max_tokens: int) -> list[int]:
        ids: Sequence[int]
        if isinstance(prompt, ChatPrompt):
            chat = self._chat_ids(prompt)
            prompt = prompt.text if chat is None else chat
        if isinstance(prompt, str):
            encode = getattr(self._instance, "encode", None)
            if encode is None:
                raise InputError(
                    f"{self.runner.name}.{self.name} takes token ids (its model has no "
                    "encode()); got a string",
                    sent="str",
                    expected="a list of token ids",
                )
            try:
                ids = encode(prompt)
            except Exception as exc:  # the tokeniser refuses this text: the input's fault
                raise InputError(
                    f"{self.runner.name}.{self.name}'s tokeniser could not encode the prompt: "
                    f"{type(exc).__name__}: {exc}",
                    sent="the prompt",
                    expected="text the model's tokeniser can encode",
                ) from exc
        else:
            ids = prompt
        if not isinstance(ids, (str, bytes)) and hasattr(ids, "__len__") and len(ids):
            check_lengths(len(ids), max_tokens, self.max_model_len)
        vocab = self.vocab_size if self.vocab_size is not None else 2**63 - 1
        return check_token_ids(ids, vocab)

    def _decoder(self) -> TextDecoder:
        inst = self._instance
        token_bytes = getattr(inst, "token_bytes", None)
        decode = getattr(inst, "decode", None)
        if token_bytes is None and decode is None:
            return TextDecoder(decode=lambda ids: "")  # no text: token ids only
        return TextDecoder(token_bytes=token_bytes, decode=None if token_bytes else decode)

    async def _aclose(self) -> None:
        if self._driver is not None:
            await self._driver.aclose()

    def __repr__(self) -> str:
        return f"<GenerativeMethod {self.runner.name}.{self.name}>"
