"""The Open Inference Protocol v2 tensor datatypes and the numpy dtypes they map to.

One table for everyone who speaks v2: the server's decoder and metadata, and the load
generator's encoder.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labserve.base.errors import InputError

__all__ = ["TO_NUMPY", "datatype", "numpy_dtype"]

TO_NUMPY: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
"""v2 datatype name -> numpy dtype name (BYTES is not supported)."""
_FROM_NUMPY = {np.dtype(v).name: k for k, v in TO_NUMPY.items()}


def datatype(dtype: np.dtype[Any]) -> str:
    """The v2 datatype name of a numpy dtype (FP32 for float32); InputError if none."""
    try:
        return _FROM_NUMPY[dtype.name]
    except KeyError:
        raise InputError(f"no v2 datatype for numpy {dtype.name}") from None


def numpy_dtype(name: Any, *, what: str = "datatype") -> np.dtype[Any]:
    """The numpy dtype of a v2 datatype name; InputError naming the accepted ones if none."""
    if not isinstance(name, str) or name not in TO_NUMPY:
        raise InputError(f"{what} must be one of {', '.join(TO_NUMPY)}, got {name!r}")
    return np.dtype(TO_NUMPY[name])
