"""Request and reply bodies: JSON arrays (or objects of named arrays) and ``.npy``. No pickle.

Decoding refuses with InputError (400) whatever a client can get wrong, before allocating
for it: an ``.npy`` header is checked against the bytes that follow it. Replies are
standard JSON: NaN and infinities are written as ``null`` (strict parsers reject ``NaN``).

JSON is read and written with orjson when it is installed (``pip install 'labserve[fast]'``)
and ``$LABSERVE_JSON`` is not ``stdlib``; whatever orjson refuses or reads otherwise
(``NaN`` or ``1e400`` in a request, an integer past 64 bits, UTF-16, lone surrogates,
nesting deeper than its limit) goes to the standard library's ``json``, so that the same
bodies are read, the same replies meant, and the same errors raised, with either.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from types import ModuleType
from typing import Any

import numpy as np

from labserve.base.errors import InputError, OutputError
from labserve.base.ragged import RaggedRows

__all__ = ["JSON", "NPY", "decode", "dumps", "encode", "jsonable", "load_json"]

JSON = "application/json"
NPY = "application/x-npy"
_NUMERIC_KINDS = "biufc"


def _fast_json() -> ModuleType | None:
    """orjson, unless ``$LABSERVE_JSON`` says ``stdlib`` or it is not installed."""
    kind = os.environ.get("LABSERVE_JSON", "").strip() or "auto"
    if kind not in ("auto", "orjson", "stdlib"):
        raise ValueError(f"$LABSERVE_JSON must be auto, orjson or stdlib, got {kind!r}")
    if kind == "stdlib":
        return None
    try:
        import orjson
    except ImportError:
        if kind == "orjson":
            raise ValueError(
                "$LABSERVE_JSON asks for orjson, which is not installed: "
                "pip install 'labserve[fast]'"
            ) from None
        return None
    return orjson


_orjson = _fast_json()
# orjson reads an integer past 64 bits as a float; the standard library keeps it an int
# (which the wire then refuses, or range-checks against the tensor's datatype). Bodies
# with a run of 19 digits or more are read by the standard library, so nothing changes.
_LONG_DIGITS = re.compile(rb"\d{19}")


def load_json(body: bytes, what: str) -> Any:
    """``json.loads``, with InputError (400) naming ``what`` for bad or too deeply nested JSON."""
    if _orjson is not None and _LONG_DIGITS.search(body) is None:
        try:
            return _orjson.loads(body)
        except _orjson.JSONDecodeError:
            pass  # read by the standard library, which accepts a little more, or says why not
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} is not valid JSON: {exc}") from exc
    except RecursionError:
        raise InputError(f"{what} is JSON nested too deeply to read") from None


def decode(body: bytes, content_type: str) -> tuple[Any, str]:
    """A request body as one call argument, and the kind of reply it asks for ("json"/"npy").

    Raises InputError (400) for a body that does not parse or does not hold numbers.
    """
    if content_type.split(";")[0].strip().lower() == NPY:
        return _npy(body), "npy"
    data = load_json(body, "body")
    if isinstance(data, list):
        return _array(data, "body"), "json"
    if isinstance(data, dict) and data:
        return {str(k): _array(v, f"body[{k!r}]") for k, v in data.items()}, "json"
    raise InputError(
        "body must be a JSON array (the batch rows) or an object of named arrays, "
        f"got {type(data).__name__}"
    )


def _npy(body: bytes) -> np.ndarray:
    """An ``.npy`` body, its header checked against its length before anything is allocated."""
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version in ((2, 0), (3, 0)):
            shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"unknown .npy format version {version}")
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        raise InputError(f"body is not a valid .npy array (pickles are refused): {exc}") from exc
    if dtype.hasobject or dtype.kind not in _NUMERIC_KINDS:
        raise InputError(f"the .npy array must hold numbers, got dtype {dtype}")
    declared = math.prod(shape) * dtype.itemsize
    held = len(body) - stream.tell()
    if declared != held:
        raise InputError(
            f"the .npy header declares {dtype}{list(shape)} ({declared} bytes) but "
            f"{held} bytes follow it"
        )
    stream.seek(0)
    try:
        arr: np.ndarray = np.load(stream, allow_pickle=False)
    except (ValueError, OSError, EOFError, MemoryError) as exc:
        raise InputError(f"body is not a valid .npy array: {exc}") from exc
    return arr


def _array(value: Any, where: str) -> np.ndarray | RaggedRows:
    if not isinstance(value, list):
        raise InputError(f"{where} must be an array, got {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except (ValueError, OverflowError, RecursionError, MemoryError) as exc:
        # Rows of different lengths: a method with a ragged axis pads them (any other
        # refuses them at admission, naming its missing pad=).
        rows = RaggedRows.parse(value)
        if rows is not None:
            return rows
        raise InputError(f"{where} is not a rectangular array of numbers: {exc}") from exc
    if arr.dtype.kind not in "biuf":
        raise InputError(f"{where} must hold numbers, got {arr.dtype.name} values")
    return arr


def encode(value: Any, kind: str) -> tuple[bytes, str]:
    """A method's result as a reply body of ``kind``, and its content type.

    Raises OutputError (500) for a result the wire cannot carry.
    """
    if kind == "npy" and isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise OutputError(f"{value.dtype} values (nothing is pickled)", ".npy")
        buf = io.BytesIO()
        np.save(buf, value, allow_pickle=False)
        return buf.getvalue(), NPY
    return dumps(jsonable(value)), JSON


def dumps(data: Any) -> bytes:
    """Standard JSON bytes of ``data`` (already :func:`jsonable`); OutputError if impossible."""
    if _orjson is not None:
        try:
            # NaN and infinities become null, as _finite makes them below.
            return _orjson.dumps(data)  # type: ignore[no-any-return]
        except _orjson.JSONEncodeError:
            pass  # an integer past 64 bits, deep nesting: the standard library decides
    try:
        return json.dumps(data, allow_nan=False).encode()
    except ValueError:
        pass  # NaN or an infinity: rewritten as null below (rare, so checked only then)
    except (TypeError, RecursionError) as exc:
        raise OutputError(str(exc), "JSON") from exc
    try:
        return json.dumps(_finite(data), allow_nan=False).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise OutputError(str(exc), "JSON") from exc


def jsonable(value: Any) -> Any:
    """``value`` with arrays and numpy scalars as Python lists and numbers.

    OutputError for values JSON cannot hold (complex, strings, objects in arrays).
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise OutputError(f"{value.dtype} values", "JSON")
        return value.tolist()
    if isinstance(value, np.generic):
        return jsonable(np.asarray(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def _finite(data: Any) -> Any:
    """Plain JSON data with NaN and infinities replaced by None."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_finite(v) for v in data]
    return data
