"""Request and reply bodies: JSON arrays (or objects of named arrays) and ``.npy``. No pickle."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

from labserve.base.errors import InputError

__all__ = ["NPY", "decode", "encode"]

NPY = "application/x-npy"


def decode(body: bytes, content_type: str) -> tuple[Any, str]:
    """A request body as one call argument, and the kind of reply it asks for ("json"/"npy").

    Raises InputError (400) for a body that does not parse.
    """
    if content_type.split(";")[0].strip() == NPY:
        try:
            return np.load(io.BytesIO(body), allow_pickle=False), "npy"
        except (ValueError, OSError, EOFError) as exc:
            raise InputError(
                f"body is not a valid .npy array (pickles are refused): {exc}"
            ) from exc
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"body is not valid JSON: {exc}") from exc
    if isinstance(data, list):
        return _array(data, "body"), "json"
    if isinstance(data, dict) and data:
        return {str(k): _array(v, f"body[{k!r}]") for k, v in data.items()}, "json"
    raise InputError(
        "body must be a JSON array (the batch rows) or an object of named arrays, "
        f"got {type(data).__name__}"
    )


def _array(value: Any, where: str) -> np.ndarray:
    if not isinstance(value, list):
        raise InputError(f"{where} must be an array, got {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except ValueError as exc:
        raise InputError(f"{where} is not a rectangular array: {exc}") from exc
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise InputError(f"{where} must hold numbers, got {arr.dtype.name} values")
    return arr


def encode(value: Any, kind: str) -> tuple[bytes, str]:
    """A method's result as a reply body of ``kind``, and its content type."""
    if kind == "npy" and isinstance(value, np.ndarray):
        buf = io.BytesIO()
        np.save(buf, value, allow_pickle=False)
        return buf.getvalue(), NPY
    return json.dumps(_jsonable(value)).encode(), "application/json"


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
