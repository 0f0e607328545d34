"""Framework payloads: PyTorch tensors and pandas DataFrames/Series, batched natively.

Torch tensors are concatenated and split with torch (dtype and device kept, no round trip
through numpy); a DataFrame's rows are its batch axis, and each caller gets its own rows
back with the index the model gave them (the batch's index is the callers' indexes
concatenated by pandas: labels of different kinds widen to ``object``). Neither library
is imported until such a payload arrives (they are optional extras: ``labserve[torch]``,
``labserve[pandas]``), and a payload is recognised by its type's module, so that nothing
is imported to ask.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Hashable, Sequence
from typing import Any

from labserve.base.errors import InputError

__all__ = ["concat", "count", "kind", "signature", "slice_items", "split"]

# A part at least this large is copied out of the batch (as for numpy arrays): a caller
# keeping a small result must not pin the whole batch's storage.
_OWN_BYTES = 1 << 16


def kind(value: Any) -> str | None:
    """``"torch"`` for a torch.Tensor, ``"pandas"`` for a DataFrame or Series, else None."""
    module = type(value).__module__
    if module.startswith("torch"):
        torch = sys.modules.get("torch")
        return "torch" if torch is not None and isinstance(value, torch.Tensor) else None
    if module.startswith("pandas"):
        pd = sys.modules.get("pandas")
        if pd is not None and isinstance(value, (pd.DataFrame, pd.Series)):
            return "pandas"
    return None


def count(value: Any, which: str, axis: int, where: str) -> int:
    """Items along the batch axis (a DataFrame's rows); InputError if it has none."""
    if which == "pandas":
        if axis != 0:
            raise InputError(
                f"{where}: a {type(value).__name__}'s batch axis is its rows (0), not {axis}",
                sent=axis,
                expected=0,
            )
        return len(value)
    if value.dim() <= axis:
        raise InputError(
            f"{where}: a tensor of shape {list(value.shape)} has no batch axis {axis}; "
            f"send the items stacked along axis {axis} (a single item as x[None])",
            sent=list(value.shape),
        )
    return int(value.shape[axis])


def signature(value: Any, which: str, axis: int) -> Hashable:
    """What it stacks with: a tensor's dtype, device and item shape; a frame's columns."""
    if which == "pandas":
        if hasattr(value, "columns"):
            return ("D", tuple(value.columns), tuple(str(d) for d in value.dtypes))
        return ("S", value.name, str(value.dtype))
    shape = tuple(value.shape)
    return ("T", str(value.dtype), str(value.device), shape[:axis] + shape[axis + 1 :])


def concat(parts: Sequence[Any], which: str, axis: int) -> Any:
    """Parts joined along the batch axis, by the framework itself."""
    if which == "pandas":
        import pandas as pd

        return pd.concat(list(parts))
    import torch

    return torch.cat(list(parts), dim=axis)


def slice_items(value: Any, which: str, start: int, stop: int, axis: int) -> Any:
    """Items ``start:stop`` along the batch axis."""
    if which == "pandas":
        return value.iloc[start:stop]
    return value.narrow(axis, start, stop - start)


def split(value: Any, which: str, offsets: list[int], axis: int) -> list[Any]:
    """Parts at ``offsets`` along the batch axis (copied out of a large batch)."""
    total = len(value) if which == "pandas" else int(value.shape[axis])
    bounds = [0, *offsets, total]
    if which == "pandas":
        return [value.iloc[a:b] for a, b in itertools.pairwise(bounds)]
    parts = [value.narrow(axis, a, b - a) for a, b in itertools.pairwise(bounds)]
    if value.element_size() * value.nelement() >= _OWN_BYTES:
        return [p.clone() for p in parts]
    return parts
