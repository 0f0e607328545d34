"""RaggedRows: rows of different lengths, as a JSON body decodes them."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["RaggedRows"]


class RaggedRows(list[np.ndarray]):
    """A list of 1-item rows whose lengths differ (each a numpy array), from a JSON body.

    Only a method with a ragged axis (``pad=``) takes it: it pads them. Any other method
    refuses it at admission, as it refused a non-rectangular array before.
    """

    @classmethod
    def parse(cls, value: list[Any]) -> RaggedRows | None:
        """``value``'s rows as arrays of numbers, or None if they are not that."""
        rows = []
        for row in value:
            if not isinstance(row, list):
                return None
            try:
                arr = np.asarray(row)
            except (ValueError, OverflowError, RecursionError, MemoryError):
                return None
            if arr.dtype.kind not in "biuf" or arr.ndim == 0:
                return None
            rows.append(arr)
        return cls(rows) if rows else None
