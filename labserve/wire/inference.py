"""Open Inference Protocol v2 infer bodies: the request (JSON and binary tensors), the reply.

Every part of a request is checked against the protocol before any tensor is built, and
refused with InputError (400) naming the part: its JSON types, datatypes and shapes, data
out of range for its datatype, binary sizes against the bytes sent. Replies are standard
JSON (NaN and infinities as ``null``); a result the protocol cannot carry is OutputError.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labserve.base.errors import InputError, OutputError
from labserve.wire.codec import dumps, jsonable, load_json
from labserve.wire.datatypes import datatype, numpy_dtype

__all__ = ["BINARY", "HEADER_LENGTH", "InferRequest", "decode_request", "encode_reply", "outputs"]

HEADER_LENGTH = "Inference-Header-Content-Length"
"""The header giving the JSON part's length when binary tensors follow it."""
BINARY = "application/octet-stream"
"""The Content-Type of a body with binary tensors (a JSON header, then raw bytes)."""


@dataclass(frozen=True)
class InferRequest:
    """A decoded infer request. Immutable."""

    inputs: tuple[np.ndarray, ...]
    outputs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """The outputs asked for, by name, with their parameters; empty: every output."""
    binary_output: bool = False  # the request's parameters.binary_data_output
    id: str | None = None


def decode_request(body: bytes, header_length: str | None) -> InferRequest:
    """An infer request from its body and its Inference-Header-Content-Length header."""
    if header_length is not None:
        if not (header_length.isascii() and header_length.isdigit()):
            raise InputError(f"{HEADER_LENGTH} must be a byte count, got {header_length!r}")
        if int(header_length) > len(body):
            raise InputError(
                f"{HEADER_LENGTH} is {header_length} but the body has {len(body)} bytes"
            )
        head, binary = body[: int(header_length)], body[int(header_length) :]
    else:
        head, binary = body, b""
    request = load_json(head, "inference request")
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise InputError('inference request must be a JSON object with an "inputs" list')
    params = _object(request.get("parameters"), "parameters")
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InputError(f"id must be a string, got {type(request_id).__name__}")
    return InferRequest(
        inputs=_inputs(request["inputs"], binary),
        outputs=_wanted(request.get("outputs")),
        binary_output=bool(params.get("binary_data_output", False)),
        id=request_id,
    )


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def _wanted(value: Any) -> dict[str, Mapping[str, Any]]:
    if value is None:
        return {}
    if not isinstance(value, list):
        raise InputError(f"outputs must be a list, got {type(value).__name__}")
    wanted: dict[str, Mapping[str, Any]] = {}
    for i, out in enumerate(value):
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise InputError(f'outputs[{i}] must be an object with a "name" string')
        wanted[out["name"]] = _object(out.get("parameters"), f"outputs[{i}].parameters")
    return wanted


def _inputs(specs: list[Any], binary: bytes) -> tuple[np.ndarray, ...]:
    if not specs:
        raise InputError("inference request has no inputs")
    arrays = []
    offset = 0
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict):
            raise InputError(f"inputs[{i}] must be an object")
        name = spec.get("name", f"input__{i}")
        where = f"input {name!r}" if isinstance(name, str) else f"inputs[{i}]"
        dtype = numpy_dtype(spec.get("datatype"), what=f"{where}: datatype")
        shape = spec.get("shape")
        if not isinstance(shape, list) or not all(
            type(d) is int and d >= 0
            for d in shape  # not bool: True is no dimension
        ):
            raise InputError(f"{where}: shape must be a list of integers >= 0, got {shape!r}")
        size = _object(spec.get("parameters"), f"{where}: parameters").get("binary_data_size")
        if size is not None:
            if type(size) is not int or size < 0:
                raise InputError(f"{where}: binary_data_size must be an integer >= 0, got {size!r}")
            if offset + size > len(binary):
                raise InputError(
                    f"{where}: binary_data_size is {size} but only "
                    f"{len(binary) - offset} bytes of binary data are left"
                )
            arrays.append(_binary_tensor(binary[offset : offset + size], dtype, shape, where))
            offset += size
        elif "data" in spec:
            arrays.append(_json_tensor(spec["data"], dtype, shape, where))
        else:
            raise InputError(f'{where} has neither "data" nor parameters.binary_data_size')
    if offset != len(binary):
        raise InputError(
            f"the body has {len(binary)} bytes of binary data but the inputs' "
            f"binary_data_size add up to {offset}"
        )
    return tuple(arrays)


def _binary_tensor(raw: bytes, dtype: np.dtype[Any], shape: list[int], where: str) -> np.ndarray:
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) != expected:
        raise InputError(
            f"{where}: {len(raw)} bytes of binary data do not make a "
            f"{datatype(dtype)}{shape} ({expected} bytes)"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _json_tensor(data: Any, dtype: np.dtype[Any], shape: list[int], where: str) -> np.ndarray:
    name = datatype(dtype)
    if not isinstance(data, list):
        raise InputError(f"{where}: data must be a JSON array, got {type(data).__name__}")
    try:
        src = np.asarray(data)
    except (ValueError, OverflowError, RecursionError, MemoryError) as exc:
        raise InputError(f"{where}: data is not a rectangular array of numbers: {exc}") from exc
    if src.size != math.prod(shape):
        raise InputError(f"{where}: {src.size} values do not make a {name}{shape}")
    if src.size == 0:
        return np.empty(shape, dtype)
    kinds = {"b": "b", "i": "biu", "u": "biu", "f": "biuf"}[dtype.kind]
    if src.dtype.kind == "O" and dtype.kind in "iu":
        raise InputError(f"{where}: data holds integers out of range for {name}")
    if src.dtype.kind not in kinds:
        wanted = {"b": "true/false", "i": "integers", "u": "integers", "f": "numbers"}
        raise InputError(f"{where}: {name} data must be {wanted[dtype.kind]}, got {src.dtype}")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if src.min() < info.min or src.max() > info.max:
            raise InputError(
                f"{where}: data out of range for {name} ({info.min}..{info.max}), "
                f"got values from {src.min()} to {src.max()}"
            )
    with np.errstate(over="ignore", invalid="ignore"):
        arr = src.astype(dtype)
    if dtype.kind == "f" and (np.isfinite(src) & ~np.isfinite(arr)).any():
        raise InputError(f"{where}: data out of range for {name}")
    return arr.reshape(shape)


def outputs(result: Any) -> list[tuple[str, np.ndarray]]:
    """A method's result as named output tensors: dict keys, or ``output__0``, ``output__1``..."""
    if isinstance(result, dict):
        named = [(str(k), v) for k, v in result.items()]
    elif isinstance(result, tuple):
        named = [(f"output__{i}", v) for i, v in enumerate(result)]
    else:
        named = [("output__0", result)]
    found = []
    for out_name, value in named:
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise OutputError(f"output {out_name!r} is not an array: {exc}", "a v2 tensor") from exc
        found.append((out_name, arr))
    return found


def encode_reply(
    model: str, request: InferRequest, results: list[tuple[str, np.ndarray]]
) -> tuple[bytes, int | None]:
    """The reply body, and the length of its JSON part when binary tensors follow it."""
    known = [n for n, _ in results]
    missing = [n for n in request.outputs if n not in known]
    if missing:
        raise InputError(f"no output named {missing[0]!r} (the model gives {', '.join(known)})")
    header: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": []}
    if request.id is not None:
        header["id"] = request.id
    chunks: list[bytes] = []
    for out_name, arr in results:
        if request.outputs and out_name not in request.outputs:
            continue
        try:
            name = datatype(arr.dtype)
        except InputError:
            raise OutputError(
                f"output {out_name!r} has dtype {arr.dtype}, which has no v2 datatype",
                "a v2 tensor",
            ) from None
        entry: dict[str, Any] = {"name": out_name, "datatype": name, "shape": list(arr.shape)}
        params = request.outputs.get(out_name, {})
        if params.get("binary_data", request.binary_output):
            raw = np.ascontiguousarray(arr).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = jsonable(arr.reshape(-1))
        header["outputs"].append(entry)
    head = dumps(header)
    if chunks:
        return head + b"".join(chunks), len(head)
    return head, None
