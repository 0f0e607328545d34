"""Stack requests into a batch and split a batch's output back into each caller's part.

A payload is a numpy array, a list, or a dict or tuple of those (several inputs or
outputs). Items are counted along the batch axis: ``shape[batch_dim]`` for an array,
``len()`` for a list (whose batch axis is always 0). A request's *signature* (its dtype
and shape without the batch axis) says which other requests it can be stacked with.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from labserve.base.errors import InputError, PaddedOutputError
from labserve.base.ragged import RaggedRows
from labserve.batching import frameworks as _fw
from labserve.batching import padding as _pad
from labserve.batching.padding import Padding, Ragged

__all__ = ["Codec", "Padding", "TensorSpec"]


@dataclass(frozen=True)
class TensorSpec:
    """What one input or output holds per item: dtype, and shape without the batch axis.

    ``-1`` in ``shape`` accepts any size on that axis.

    >>> TensorSpec("float32", (4,))
    TensorSpec(dtype='float32', shape=(4,))
    """

    dtype: str
    shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        try:
            canonical = np.dtype(self.dtype).name
        except TypeError as exc:
            raise TypeError(
                f"TensorSpec dtype must name a numpy dtype, got {self.dtype!r}"
            ) from exc
        shape = tuple(self.shape)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape):
            raise TypeError(f"TensorSpec shape must hold integers >= -1, got {self.shape!r}")
        object.__setattr__(self, "dtype", canonical)
        object.__setattr__(self, "shape", shape)

    def describe(self, batch_dim: int) -> str:
        """The full shape with the batch axis shown as ``N``, e.g. ``float32[N, 4]``."""
        dims = ["-1" if d == -1 else str(d) for d in self.shape]
        dims.insert(batch_dim, "N")
        return f"{self.dtype}[{', '.join(dims)}]"


def _describe(arr: np.ndarray) -> str:
    return f"{arr.dtype.name}[{', '.join(map(str, arr.shape))}]"


def _item_shape(arr: np.ndarray, axis: int) -> tuple[int, ...]:
    return arr.shape[:axis] + arr.shape[axis + 1 :]


def _count(value: Any, axis: int, where: str) -> int:
    if isinstance(value, np.ndarray):
        if value.ndim <= axis:
            raise InputError(
                f"{where}: an array of shape {value.shape} has no batch axis {axis}; "
                f"send the items stacked along axis {axis} (a single item as x[None])",
                sent=value.shape,
            )
        return int(value.shape[axis])
    if isinstance(value, list):
        if isinstance(value, RaggedRows):
            raise InputError(
                f"{where}: rows of different lengths {[len(r) for r in value]}, and the method "
                "declares no ragged axis (pad=); send rows of one length",
                sent=[len(r) for r in value],
            )
        return len(value)
    if isinstance(value, Ragged):
        return len(value.lengths)
    if isinstance(value, tuple):
        return _agree([_count(v, axis, f"{where}[{i}]") for i, v in enumerate(value)], where)
    if isinstance(value, Mapping):
        return _agree([_count(v, axis, f"{where}[{k!r}]") for k, v in value.items()], where)
    which = _fw.kind(value)
    if which is not None:
        return _fw.count(value, which, axis, where)
    raise InputError(
        f"{where}: cannot batch a {type(value).__name__}; expected a numpy array, a torch "
        "tensor, a pandas DataFrame or Series, a list, or a dict or tuple of those",
        sent=type(value).__name__,
    )


def _agree(counts: list[int], where: str) -> int:
    if not counts:
        raise InputError(f"{where}: an empty container has nothing to batch")
    if any(c != counts[0] for c in counts):
        raise InputError(
            f"{where}: its parts hold different numbers of items along the batch axis: {counts}",
            sent=counts,
        )
    return counts[0]


def _signature(value: Any, axis: int) -> Hashable:
    if isinstance(value, np.ndarray):
        return ("a", value.dtype, _item_shape(value, axis))
    if isinstance(value, list):
        return ("l",)
    if isinstance(value, Ragged):
        return value.signature(axis)
    if isinstance(value, tuple):
        return ("t", *(_signature(v, axis) for v in value))
    if isinstance(value, Mapping):
        return ("d", *((k, _signature(v, axis)) for k, v in value.items()))
    which = _fw.kind(value)
    assert which is not None  # _count let nothing else through
    return _fw.signature(value, which, axis)


def _concat(parts: Sequence[Any], axis: int) -> Any:
    first = parts[0]
    if len(parts) == 1:
        return first
    if isinstance(first, np.ndarray):
        return np.concatenate(parts, axis=axis)
    if isinstance(first, list):
        out: list[Any] = []
        for p in parts:
            out.extend(p)
        return out
    if isinstance(first, tuple):
        return tuple(_concat([p[i] for p in parts], axis) for i in range(len(first)))
    if isinstance(first, Mapping):
        return {k: _concat([p[k] for p in parts], axis) for k in first}
    return _fw.concat(parts, _framework(first), axis)


def _framework(value: Any) -> str:
    which = _fw.kind(value)
    if which is None:
        raise InputError(f"cannot batch a {type(value).__name__}", sent=type(value).__name__)
    return which


def _slice(value: Any, start: int, stop: int, axis: int) -> Any:
    if isinstance(value, np.ndarray):
        index = [slice(None)] * value.ndim
        index[axis] = slice(start, stop)
        return value[tuple(index)]
    if isinstance(value, list):
        return value[start:stop]
    if isinstance(value, Ragged):
        return value.replace(_slice(value.data, start, stop, axis), value.lengths[start:stop])
    if isinstance(value, tuple):
        return tuple(_slice(v, start, stop, axis) for v in value)
    if isinstance(value, Mapping):
        return {k: _slice(v, start, stop, axis) for k, v in value.items()}
    return _fw.slice_items(value, _framework(value), start, stop, axis)


# A batch output at least this large is copied out part by part: a caller keeping its small
# result must not pin the whole batch's array (a view would). Below it, views are cheaper.
_OWN_BYTES = 1 << 16


def _split(value: Any, offsets: list[int], axis: int) -> list[Any]:
    if isinstance(value, np.ndarray):
        bounds = [0, *offsets, value.shape[axis]]
        if axis == 0:
            parts = [value[a:b] for a, b in itertools.pairwise(bounds)]
        else:
            parts = [_slice(value, a, b, axis) for a, b in itertools.pairwise(bounds)]
        if value.nbytes >= _OWN_BYTES:
            return [p.copy() for p in parts]
        return parts
    if isinstance(value, list):
        bounds = [0, *offsets, len(value)]
        return [value[a:b] for a, b in itertools.pairwise(bounds)]
    if isinstance(value, tuple):
        columns = [_split(v, offsets, axis) for v in value]
        return [tuple(row) for row in zip(*columns, strict=True)]
    if not isinstance(value, Mapping):
        return _fw.split(value, _framework(value), offsets, axis)
    keys = list(value)
    columns = [_split(value[k], offsets, axis) for k in keys]
    return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]


_BATCH_DIM_RULE = "batch_dim must be an int or (input_dim, output_dim), got {!r}"


class Codec:
    """Counts, checks, stacks and splits one batchable method's payloads.

    ``batch_dim`` is the batch axis of inputs and outputs, or ``(input_dim, output_dim)``.
    ``input_spec`` optionally declares each positional argument (one TensorSpec, or one per
    argument); a request that does not match fails alone at admission with both shapes.
    Pure and thread-safe: it holds no mutable state.
    """

    def __init__(
        self,
        method: str,
        batch_dim: int | tuple[int, int] = 0,
        input_spec: TensorSpec | Sequence[TensorSpec] | None = None,
        padding: Padding | int | None = None,
    ) -> None:
        if isinstance(batch_dim, tuple):
            if len(batch_dim) != 2 or not all(isinstance(d, int) for d in batch_dim):
                raise TypeError(_BATCH_DIM_RULE.format(batch_dim))
            self.in_dim, self.out_dim = batch_dim
        elif isinstance(batch_dim, int) and not isinstance(batch_dim, bool):
            self.in_dim = self.out_dim = batch_dim
        else:
            raise TypeError(_BATCH_DIM_RULE.format(batch_dim))
        if self.in_dim < 0 or self.out_dim < 0:
            raise ValueError(f"batch_dim must be >= 0, got {batch_dim!r}")
        self.method = method
        if isinstance(input_spec, TensorSpec):
            input_spec = (input_spec,)
        self.input_spec: tuple[TensorSpec, ...] | None = (
            tuple(input_spec) if input_spec is not None else None
        )
        if isinstance(padding, int) and not isinstance(padding, bool):
            padding = Padding(axis=padding)
        elif padding is not None and not isinstance(padding, Padding):
            raise TypeError(f"pad must be a Padding, an axis (int) or None, got {padding!r}")
        self.padding: Padding | None = padding
        if padding is not None:
            self._check_padding(padding)

    def admit(self, args: tuple[Any, ...]) -> tuple[tuple[Any, ...], int, Hashable]:
        """Check one request's arguments; return them (cast to the spec), its items and signature.

        Raises InputError, naming what was sent and what was expected.
        """
        if len(args) == 1 and self.input_spec is None and self.padding is None:
            # The common case, kept lean: it runs once per request on the loop.
            arg = args[0]
            if type(arg) is np.ndarray:
                shape = arg.shape
                d = self.in_dim
                if not d:
                    if shape and shape[0]:
                        return args, shape[0], ("t", ("a", arg.dtype, shape[1:]))
                elif len(shape) > d and shape[d]:
                    key = ("a", arg.dtype, shape[:d] + shape[d + 1 :])
                    return args, shape[d], ("t", key)  # as _signature(args)
        if not args:
            raise InputError(f"{self.method}: a batchable call needs at least one argument")
        if self.padding is not None:
            args = self._to_ragged(args, self.padding)
        if self.input_spec is not None:
            args = self._check_spec(args)
        items = _agree(
            [_count(a, self.in_dim, f"{self.method} argument {i}") for i, a in enumerate(args)],
            f"{self.method} arguments",
        )
        if items < 1:
            raise InputError(
                f"{self.method}: the request holds 0 items along batch axis {self.in_dim}; "
                "send at least one",
                sent=0,
            )
        return args, items, _signature(args, self.in_dim)

    def _check_spec(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        specs = self.input_spec or ()
        if len(args) != len(specs):
            raise InputError(
                f"{self.method}: takes {len(specs)} argument(s), got {len(args)}",
                sent=len(args),
                expected=len(specs),
            )
        checked = []
        for i, (arg, spec) in enumerate(zip(args, specs, strict=True)):
            expected = spec.describe(self.in_dim)
            ragged = arg if isinstance(arg, Ragged) else None
            if ragged is not None:
                arg = ragged.data
            arr = arg if isinstance(arg, np.ndarray) else None
            if arr is None:
                try:
                    arr = np.asarray(arg, dtype=spec.dtype)
                except (TypeError, ValueError) as exc:
                    raise InputError(
                        f"{self.method} argument {i}: cannot read it as {expected}: {exc}",
                        sent=type(arg).__name__,
                        expected=expected,
                    ) from exc
            ok_dtype = np.can_cast(arr.dtype, spec.dtype, casting="same_kind")
            ok_rank = arr.ndim == len(spec.shape) + 1 and arr.ndim > self.in_dim
            ok_shape = ok_rank and all(
                want in (-1, got)
                for want, got in zip(spec.shape, _item_shape(arr, self.in_dim), strict=True)
            )
            if not (ok_dtype and ok_shape):
                raise InputError(
                    f"{self.method} argument {i}: sent {_describe(arr)}, expected {expected}",
                    sent=_describe(arr),
                    expected=expected,
                )
            cast = arr.astype(spec.dtype, copy=False)
            checked.append(cast if ragged is None else ragged.replace(cast))
        return tuple(checked)

    # -- a ragged axis (padding) ----------------------------------------------------------

    def _check_padding(self, padding: Padding) -> None:
        if padding.axis == self.in_dim:
            raise ValueError(
                f"{self.method}: the ragged axis ({padding.axis}) must not be the batch axis"
            )
        for i, spec in enumerate(self.input_spec or ()):
            if not padding.selects(i, None):
                continue
            dims = list(spec.shape)
            dims.insert(self.in_dim, -1)
            if len(dims) <= padding.axis or dims[padding.axis] != -1:
                raise TypeError(
                    f"{self.method}: input_spec {i} ({spec.describe(self.in_dim)}) must leave "
                    f"the ragged axis {padding.axis} free (-1)"
                )

    def _to_ragged(self, args: tuple[Any, ...], padding: Padding) -> tuple[Any, ...]:
        """The call's ragged inputs as Ragged; InputError if their lengths disagree."""
        found: list[tuple[str, np.ndarray]] = []
        out: list[Any] = []
        for i, arg in enumerate(args):
            where = f"{self.method} argument {i}"
            if isinstance(arg, Mapping):
                converted = {}
                for k, v in arg.items():
                    converted[k] = self._ragged_leaf(v, i, k, f"{where}[{k!r}]", found)
                out.append(converted)
            else:
                out.append(self._ragged_leaf(arg, i, None, where, found))
        if not found:
            raise InputError(
                f"{self.method}: declares the ragged axis {padding.axis}, but no input has it "
                "(send arrays, or lists of rows)",
                sent=[type(a).__name__ for a in args],
            )
        _pad.agree(found, f"{self.method} arguments")
        return tuple(out)

    def _ragged_leaf(
        self, value: Any, i: int, key: Any, where: str, found: list[tuple[str, np.ndarray]]
    ) -> Any:
        padding = self.padding
        assert padding is not None
        name = key if isinstance(key, str) else None
        if not padding.selects(i, name):
            return value
        leaf = _pad.to_ragged(value, padding, self.in_dim, name, where)
        if isinstance(leaf, Ragged):
            found.append((where, leaf.lengths))
        return leaf

    def lengths(self, args: tuple[Any, ...]) -> np.ndarray:
        """Each item's true length on the ragged axis (int64), of admitted ``args``."""
        for arg in args:
            for leaf in arg.values() if isinstance(arg, Mapping) else (arg,):
                if isinstance(leaf, Ragged):
                    return leaf.lengths
        raise TypeError(f"{self.method}: these arguments hold no ragged input")

    def sent_rows(self, args: tuple[Any, ...]) -> bool:
        """True if the caller sent its ragged input as a list of rows."""
        for arg in args:
            for leaf in arg.values() if isinstance(arg, Mapping) else (arg,):
                if isinstance(leaf, Ragged):
                    return leaf.rows
        return False

    def measure(self, parts: Sequence[tuple[np.ndarray, int, int]]) -> tuple[int, int]:
        """A padded batch's width and true tokens, from each part's (lengths, start, stop)."""
        padding = self.padding
        assert padding is not None
        longest = true = 0
        for lengths, a, b in parts:
            mine = lengths[a:b]
            longest = max(longest, int(mine.max()))
            true += int(mine.sum())
        return padding.round_width(longest), true

    def stack_padded(self, requests: Sequence[tuple[Any, ...]], width: int) -> tuple[Any, ...]:
        """Stack requests padded to ``width``; the true lengths come last if the model takes them.

        With ``Padding.lengths_arg`` set, the result's last element is the int64 lengths
        (:meth:`bind` passes it to the model by keyword).
        """
        padding = self.padding
        assert padding is not None
        d = self.in_dim

        def column(parts: list[Any], key: Any) -> Any:
            first = parts[0]
            if isinstance(first, Ragged):
                name = key if isinstance(key, str) else None
                padded = [_pad.pad_to(p, width, padding, name) for p in parts]
                return padded[0] if len(padded) == 1 else np.concatenate(padded, axis=d)
            if isinstance(first, Mapping):
                return {k: column([p[k] for p in parts], k) for k in first}
            return _concat(parts, d)

        stacked = [column([r[i] for r in requests], None) for i in range(len(requests[0]))]
        if padding.lengths_arg is not None:
            lengths = [self.lengths(r) for r in requests]
            stacked.append(lengths[0] if len(lengths) == 1 else np.concatenate(lengths))
        return tuple(stacked)

    def bind(self, fn: Any) -> Any:
        """``fn`` as the driver calls it: with the true lengths by keyword, if it takes them."""
        padding = self.padding
        if padding is None or padding.lengths_arg is None:
            return fn
        name = padding.lengths_arg

        def call(*args: Any) -> Any:
            return fn(*args[:-1], **{name: args[-1]})

        return call

    def split_padded(
        self,
        output: Any,
        counts: Sequence[int],
        cuts: Sequence[tuple[np.ndarray, bool, int]],
        width: int,
    ) -> list[Any]:
        """Split a padded batch's output; cut what carries the ragged axis per caller.

        ``cuts[i]`` is part i's rows' true lengths, whether its caller sent a list of rows
        (each row comes back cut to its own length, in a list), and its caller's length
        (its longest row, over all its parts). Raises PaddedOutputError for an output of
        another width on the ragged axis.
        """
        padding = self.padding
        assert padding is not None
        parts = self.split(output, counts)
        where = f"{self.method} output"
        return [
            self._cut_part(part, padding, width, cut, where)
            for part, cut in zip(parts, cuts, strict=True)
        ]

    def _cut_part(
        self,
        part: Any,
        padding: Padding,
        width: int,
        cut: tuple[np.ndarray, bool, int],
        where: str,
    ) -> Any:
        lengths, rows, length = cut

        def leaf(value: Any, key: Any) -> Any:
            axis = padding.out_axis(key)
            if axis is None or not isinstance(value, np.ndarray):
                return value
            name = where if key is None else f"{where}[{key!r}]"
            if axis == self.out_dim:
                raise PaddedOutputError(name, axis, width, None)
            if not rows:  # every row of the caller's array has its length
                return _pad.cut(value, axis, width, length, padding, name)
            # Each row back to its own length (a list, as the caller sent its rows).
            row_axis = axis - 1 if axis > self.out_dim else axis
            return [
                _pad.cut(
                    _slice(value, j, j + 1, self.out_dim).squeeze(self.out_dim),
                    row_axis,
                    width,
                    int(n),
                    padding,
                    name,
                )
                for j, n in enumerate(lengths)
            ]

        if isinstance(part, Mapping):
            return {k: leaf(v, k) for k, v in part.items()}
        if isinstance(part, tuple):
            return tuple(leaf(v, i) for i, v in enumerate(part))
        return leaf(part, None)

    def slice(self, args: tuple[Any, ...], start: int, stop: int) -> tuple[Any, ...]:
        """Items ``start:stop`` of a request (to split one larger than the cap)."""
        return tuple(_slice(a, start, stop, self.in_dim) for a in args)

    def stack(self, requests: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
        """Stack same-signature requests along the input batch axis, argument by argument."""
        if len(requests) == 1:
            return requests[0]
        if len(requests[0]) == 1:  # one argument: the common case
            return (_concat([r[0] for r in requests], self.in_dim),)
        return tuple(
            _concat([r[i] for r in requests], self.in_dim) for i in range(len(requests[0]))
        )

    def output_items(self, output: Any) -> int:
        """Items along the output batch axis (raises InputError for an unbatchable output)."""
        return _count(output, self.out_dim, f"{self.method} output")

    def split(self, output: Any, counts: Sequence[int]) -> list[Any]:
        """Split a batch's output into one part per request, ``counts[i]`` items each."""
        if len(counts) == 1:
            return [output]
        if (
            type(output) is np.ndarray
            and self.out_dim == 0
            and output.ndim
            and len(counts) == output.shape[0]
        ):
            # One item per part (parts hold at least one): the rows, each kept 2-D.
            rows = list(output[:, np.newaxis])
            return [r.copy() for r in rows] if output.nbytes >= _OWN_BYTES else rows
        offsets = np.cumsum(counts[:-1]).tolist()
        return _split(output, offsets, self.out_dim)

    def join(self, outputs: Sequence[Any]) -> Any:
        """Rejoin the outputs of one request that was split across batches."""
        return _concat(outputs, self.out_dim)
