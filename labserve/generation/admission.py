"""Admission checks for a generative method: what a sequence must fit before it is queued.

Pure functions of the sequence's lengths and the config, so that the runtime, the
simulator and a server route all refuse the same sequences with the same words.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

from labserve.base.errors import InputError, LengthLimitError
from labserve.config.generation import GenerationConfig

__all__ = ["check_admission", "check_lengths", "check_token_ids"]


def _count(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise InputError(
            f"{name} must be an integer >= {low}, got {value!r}", sent=value, expected=f">= {low}"
        )
    return int(value)


def check_lengths(prompt_len: int, max_tokens: int, max_model_len: int = 0) -> None:
    """Raise a typed error if a sequence of these lengths cannot fit the model at all.

    What the model's context fixes, whatever the config: a caller checks it before any
    per-token work on the prompt.

    Raises:
        InputError: ``max_tokens`` below 1, or an empty prompt.
        LengthLimitError: the prompt plus ``max_tokens`` exceeds ``max_model_len`` (> 0).
    """
    prompt_len = _count("the prompt's length in tokens", prompt_len, 1)
    max_tokens = _count("max_tokens", max_tokens, 1)
    total = prompt_len + max_tokens
    if max_model_len and total > max_model_len:
        raise LengthLimitError(
            f"the prompt's {prompt_len} tokens + max_tokens {max_tokens}",
            total,
            "the model's context (max_model_len)",
            max_model_len,
        )


def check_admission(
    prompt_len: int,
    max_tokens: int,
    config: GenerationConfig,
    max_model_len: int = 0,
    kv_blocks: int | None = None,
) -> None:
    """Raise a typed error if a sequence of these lengths can never run under ``config``.

    Raises:
        InputError: ``max_tokens`` below 1, or an empty prompt.
        LengthLimitError: the prompt plus ``max_tokens`` exceeds ``max_model_len`` (when
            > 0); the prompt exceeds ``max_num_batched_tokens`` with chunked prefill off;
            the sequence at its longest needs more KV blocks than ``num_kv_blocks`` (or
            ``kv_blocks``, the pool of a model that stores K/V in labserve's blocks).
    """
    check_lengths(prompt_len, max_tokens, max_model_len)
    total = prompt_len + max_tokens
    if not config.enable_chunked_prefill and prompt_len > config.max_num_batched_tokens:
        raise LengthLimitError(
            "the prompt's length in tokens (chunked prefill is off)",
            prompt_len,
            "max_num_batched_tokens",
            config.max_num_batched_tokens,
        )
    # The last output is never fed back: P + M - 1 tokens are cached at most.
    blocks = config.blocks_for(total - 1)
    limit = config.num_kv_blocks if kv_blocks is None else kv_blocks
    if limit and blocks > limit:
        raise LengthLimitError(
            f"the KV blocks of {total - 1} tokens (block_size {config.block_size})",
            blocks,
            "num_kv_blocks" if kv_blocks is None else "the model's KV pool in blocks",
            limit,
        )


def check_token_ids(token_ids: Sequence[int] | np.ndarray, vocab_size: int) -> list[int]:
    """The prompt's token ids as a list of ints, each in ``0..vocab_size-1``.

    Vectorised (numpy) for a list of Python ints or an integer array: a prompt of a
    million ids takes milliseconds; anything else is checked id by id to name the first
    that is wrong.

    Raises:
        InputError: an id that is not an integer, or is out of the vocabulary (names the
            first such id, its position and the vocabulary size); an empty prompt.
    """
    if isinstance(token_ids, np.ndarray):
        if token_ids.ndim != 1 or not np.issubdtype(token_ids.dtype, np.integer):
            raise InputError(
                f"token ids must be a 1-D array of integers, got {token_ids.dtype} of shape "
                f"{token_ids.shape}",
                sent=str(token_ids.dtype),
                expected="a 1-D integer array",
            )
        arr = token_ids
    else:
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        if set(map(type, ids)) != {int}:  # bools, floats, numpy scalars, ...: one by one
            return _check_one_by_one(ids, vocab_size)
        try:
            arr = np.array(ids, dtype=np.int64)
        except OverflowError:  # an int past int64: out of any vocabulary
            return _check_one_by_one(ids, vocab_size)
    if arr.size == 0:
        raise InputError("a prompt needs at least one token, got none", sent=0, expected=">= 1")
    bad = (arr < 0) | (arr >= vocab_size)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        t = int(arr[i])
        raise InputError(
            f"token id {t} at position {i} is outside the vocabulary 0..{vocab_size - 1}",
            sent=t,
            expected=f"0..{vocab_size - 1}",
        )
    return arr.tolist()  # type: ignore[no-any-return]


def _check_one_by_one(ids: list[object], vocab_size: int) -> list[int]:
    if not ids:
        raise InputError("a prompt needs at least one token, got none", sent=0, expected=">= 1")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise InputError(
                f"token id at position {i} must be an integer, got {t!r}",
                sent=t,
                expected="an integer",
            )
        if not 0 <= int(t) < vocab_size:
            raise InputError(
                f"token id {t} at position {i} is outside the vocabulary 0..{vocab_size - 1}",
                sent=t,
                expected=f"0..{vocab_size - 1}",
            )
    return [int(t) for t in ids]  # type: ignore[call-overload]
