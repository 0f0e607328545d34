"""A ragged axis: requests of different lengths share a batch, padded, and are cut back.

A method declares it with ``@labserve.method(batchable=True, pad=Padding(axis=1))``. Each
request's ragged inputs are held as :class:`Ragged` (its rows' data, padded to its own
longest row, and each row's true length). A batch pads every part to the batch's width
(its longest row, rounded up to ``pad_to_multiple_of``) and tells the model each row's
true length in one way: the keyword argument ``lengths_arg`` (an int64 array, one length
per item); a dict of named arrays (``input_ids`` + ``attention_mask``) is padded
consistently, so a mask the caller sent covers exactly its own tokens. Outputs that carry
the ragged axis (``output_axis``) are cut back to each caller's own length.

The names follow Hugging Face tokenizers (``pad_to_multiple_of``, ``padding_side``).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from labserve.base.errors import InputError, PaddedOutputError

__all__ = ["Padding", "Ragged"]

PaddingSide = Literal["right", "left"]
_SIDES = ("right", "left")
_Key = str | int


def _axis_ok(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Padding:
    """How a batchable method's inputs vary in length along one axis, and how they are padded.

    It is part of the method's contract, fixed at declaration like ``batch_dim``. With an
    ``input_spec``, the ragged axis must be ``-1`` there (any size), and the Open Inference
    Protocol metadata shows it as ``-1`` beside the batch axis: a v2 request then carries its
    own ``[1, L]`` shape. Unlike a plain ``-1`` axis (requests of other sizes on it are
    valid but never share a batch), the ragged axis is padded so that they do.

    Attributes:
        axis: The ragged axis of every ragged input, counted in the full shape (batch axis
            included, as ``batch_dim`` is): ``1`` for ``[N, L]`` token ids.
        pad_value: What fills the padding: one number, or ``{key: number}`` per dict key
            (keys not named get 0), as ``{"input_ids": tokenizer.pad_token_id}``.
        pad_to_multiple_of: Round each batch's width up to a multiple of this (fewer
            distinct shapes for a compiled model); None: the batch's longest row.
        padding_side: ``"right"`` (pad after the tokens) or ``"left"`` (before them).
        keys: Which inputs are ragged: dict keys and/or argument positions. None: every
            array input, and every list of rows (a list of lists or arrays; a list of
            strings stays a list).
        output_axis: Where outputs carry the ragged axis: None (they do not, e.g. a pooled
            embedding), an int (every output array, at that axis), or ``{key: axis}`` for a
            dict output (tuple outputs: by position). Each caller gets them cut back to its
            own length; a model output of another width on that axis is a
            PaddedOutputError.
        lengths_arg: The keyword argument under which the model gets each row's true
            length (an int64 array, one per item). None: none is passed (the model reads
            the attention mask it was sent, padded with zeros).

    >>> Padding(axis=1, pad_value={"input_ids": 0}, output_axis={"tokens": 1}).axis
    1
    """

    axis: int = 1
    pad_value: float | Mapping[str, float] = 0
    pad_to_multiple_of: int | None = None
    padding_side: PaddingSide = "right"
    keys: tuple[_Key, ...] | None = None
    output_axis: int | Mapping[_Key, int] | None = None
    lengths_arg: str | None = "lengths"

    def __post_init__(self) -> None:
        if not _axis_ok(self.axis):
            raise TypeError(f"Padding axis must be an integer >= 0, got {self.axis!r}")
        values = (
            self.pad_value.values() if isinstance(self.pad_value, Mapping) else [self.pad_value]
        )
        if not all(isinstance(v, numbers.Number) and not isinstance(v, bool) for v in values):
            raise TypeError(
                f"Padding pad_value must be a number or {{key: number}}, got {self.pad_value!r}"
            )
        multiple = self.pad_to_multiple_of
        if multiple is not None and not (_axis_ok(multiple) and multiple >= 1):
            raise ValueError(
                f"Padding pad_to_multiple_of must be an integer >= 1 or None, got {multiple!r}"
            )
        if self.padding_side not in _SIDES:
            raise ValueError(
                f"Padding padding_side must be 'right' or 'left', got {self.padding_side!r}"
            )
        if self.keys is not None:
            keys = (self.keys,) if isinstance(self.keys, (str, int)) else tuple(self.keys)
            if not keys or not all(isinstance(k, (str, int)) for k in keys):
                raise TypeError(f"Padding keys must be dict keys or positions, got {self.keys!r}")
            object.__setattr__(self, "keys", keys)
        out = self.output_axis
        if isinstance(out, Mapping):
            if not all(_axis_ok(a) for a in out.values()):
                raise TypeError(f"Padding output_axis values must be integers >= 0, got {out!r}")
            object.__setattr__(self, "output_axis", dict(out))
        elif out is not None and not _axis_ok(out):
            raise TypeError(
                f"Padding output_axis must be None, an integer >= 0 or {{key: axis}}, got {out!r}"
            )
        if self.lengths_arg is not None and not self.lengths_arg.isidentifier():
            raise ValueError(
                f"Padding lengths_arg must be a keyword name or None, got {self.lengths_arg!r}"
            )

    def value_for(self, key: _Key | None) -> float:
        """The pad value of the input named ``key`` (a dict key), 0 if none is given."""
        if isinstance(self.pad_value, Mapping):
            return self.pad_value.get(key, 0) if isinstance(key, str) else 0
        return self.pad_value

    def selects(self, position: int, key: str | None) -> bool:
        """True if the input at argument ``position`` (dict ``key``) is declared ragged."""
        return self.keys is None or position in self.keys or (key is not None and key in self.keys)

    def round_width(self, longest: int) -> int:
        """The padded width of a batch whose longest row is ``longest``."""
        m = self.pad_to_multiple_of
        return longest if m is None or longest % m == 0 else (longest // m + 1) * m

    def out_axis(self, key: _Key | None) -> int | None:
        """The ragged axis of the output named ``key`` (None: it carries none)."""
        out = self.output_axis
        if isinstance(out, Mapping):
            return out.get(key) if key is not None else None
        return out


class Ragged:
    """One request's ragged input: its rows' data (padded to its own longest) and lengths.

    ``rows`` is True when the caller sent a list of rows: outputs on the ragged axis then
    come back to it as a list, each row cut to its own length.
    """

    __slots__ = ("axis", "data", "lengths", "rows")

    def __init__(self, data: np.ndarray, lengths: np.ndarray, rows: bool, axis: int) -> None:
        self.data = data
        self.lengths = lengths
        self.rows = rows
        self.axis = axis

    def replace(self, data: np.ndarray, lengths: np.ndarray | None = None) -> Ragged:
        """The same rows with other data (a slice, a cast), and other lengths if given."""
        return Ragged(data, self.lengths if lengths is None else lengths, self.rows, self.axis)

    def signature(self, batch_axis: int) -> tuple[Any, ...]:
        """What it can be stacked with: its dtype and item shape, any size on the ragged axis."""
        shape = list(self.data.shape)
        shape[self.axis] = -1
        del shape[batch_axis]
        return ("r", self.data.dtype, tuple(shape))

    def __repr__(self) -> str:
        return f"Ragged({self.data.dtype.name}{list(self.data.shape)}, lengths={self.lengths})"


def _is_rows(value: Any) -> bool:
    """A list of rows (arrays, or sequences of numbers), not a list of strings or objects."""
    if not isinstance(value, list) or not value:
        return False
    first = value[0]
    return isinstance(first, (np.ndarray, list, tuple)) and not isinstance(first, str)


def to_ragged(
    value: Any, padding: Padding, in_dim: int, key: str | None, where: str
) -> Ragged | Any:
    """One ragged input as :class:`Ragged`; raises InputError naming what is wrong."""
    axis = padding.axis
    if isinstance(value, np.ndarray):
        if value.ndim <= max(axis, in_dim):
            raise InputError(
                f"{where}: an array of shape {list(value.shape)} has no ragged axis {axis}",
                sent=list(value.shape),
                expected=f"an array with axis {axis}",
            )
        n = value.shape[in_dim]
        return Ragged(value, np.full(n, value.shape[axis], dtype=np.int64), False, axis)
    if not _is_rows(value):
        return value
    if in_dim != 0 or axis == 0:
        raise InputError(
            f"{where}: a list of rows needs the batch axis 0 and a ragged axis >= 1 "
            f"(batch_dim {in_dim}, ragged axis {axis})",
            sent="a list of rows",
        )
    return _pad_rows(value, padding, key, where)


def _pad_rows(value: list[Any], padding: Padding, key: str | None, where: str) -> Ragged:
    axis = padding.axis - 1  # within a row (the batch axis is gone)
    rows = []
    for i, row in enumerate(value):
        try:
            rows.append(np.asarray(row))
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}[{i}]: cannot read it as an array: {exc}") from exc
    first = rows[0]
    if first.ndim <= axis or first.dtype == object:
        raise InputError(
            f"{where}[0]: a row of shape {list(first.shape)} has no ragged axis {axis}",
            sent=list(first.shape),
        )
    other = first.shape[:axis] + first.shape[axis + 1 :]
    for i, row in enumerate(rows):
        if row.ndim != first.ndim or row.shape[:axis] + row.shape[axis + 1 :] != other:
            raise InputError(
                f"{where}[{i}]: a row of shape {list(row.shape)} does not match row 0's "
                f"{list(first.shape)} on the axes other than the ragged axis",
                sent=list(row.shape),
                expected=list(first.shape),
            )
    dtype = np.result_type(*rows)
    lengths = np.array([r.shape[axis] for r in rows], dtype=np.int64)
    width = int(lengths.max())
    shape = (len(rows), *first.shape[:axis], width, *first.shape[axis + 1 :])
    data = np.full(shape, padding.value_for(key), dtype=dtype)
    left = padding.padding_side == "left"
    for i, row in enumerate(rows):
        n = row.shape[axis]
        index: list[Any] = [i, *([slice(None)] * first.ndim)]
        index[axis + 1] = slice(width - n, width) if left else slice(0, n)
        data[tuple(index)] = row
    return Ragged(data, lengths, True, padding.axis)


def agree(lengths: Sequence[tuple[str, np.ndarray]], where: str) -> np.ndarray:
    """The rows' lengths that every ragged input of a request shares; InputError if not."""
    name, first = lengths[0]
    for other_name, other in lengths[1:]:
        if other.shape != first.shape or not np.array_equal(other, first):
            raise InputError(
                f"{where}: ragged inputs of other lengths: {name} has {first.tolist()}, "
                f"{other_name} has {other.tolist()}",
                sent={name: first.tolist(), other_name: other.tolist()},
            )
    return first


def pad_to(ragged: Ragged, width: int, padding: Padding, key: str | None) -> np.ndarray:
    """``ragged``'s data padded (or trimmed of padding) to ``width`` on the ragged axis."""
    data, axis = ragged.data, padding.axis
    have = data.shape[axis]
    if have == width:
        return data
    left = padding.padding_side == "left"
    if have > width:  # a slice of a request whose longest row is in another slice
        index: list[Any] = [slice(None)] * data.ndim
        index[axis] = slice(have - width, have) if left else slice(0, width)
        trimmed: np.ndarray = data[tuple(index)]
        return trimmed
    widths = [(0, 0)] * data.ndim
    widths[axis] = (width - have, 0) if left else (0, width - have)
    return np.pad(data, widths, constant_values=padding.value_for(key))


def cut(
    value: np.ndarray, axis: int, width: int, length: int, padding: Padding, where: str
) -> np.ndarray:
    """Cut a part's output on the ragged ``axis`` from the batch's ``width`` to ``length``."""
    if value.ndim <= axis or value.shape[axis] != width:
        got = value.shape[axis] if value.ndim > axis else None
        raise PaddedOutputError(where, axis, width, got)
    index: list[Any] = [slice(None)] * value.ndim
    left = padding.padding_side == "left"
    index[axis] = slice(width - length, width) if left else slice(0, length)
    mine: np.ndarray = value[tuple(index)]
    return mine
