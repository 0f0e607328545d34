"""JSON on the wire: orjson when installed, the standard library otherwise, the same meaning."""

from __future__ import annotations

import json

import numpy as np
import pytest

from labserve.base.errors import InputError, OutputError
from labserve.wire import codec

orjson = pytest.importorskip("orjson")


@pytest.fixture(params=["orjson", "stdlib"])
def engine(request, monkeypatch):
    monkeypatch.setattr(codec, "_orjson", orjson if request.param == "orjson" else None)
    return request.param


def test_orjson_is_used_when_installed_unless_the_environment_says_stdlib(monkeypatch):
    monkeypatch.delenv("LABSERVE_JSON", raising=False)
    assert codec._fast_json() is orjson
    monkeypatch.setenv("LABSERVE_JSON", "stdlib")
    assert codec._fast_json() is None
    monkeypatch.setenv("LABSERVE_JSON", "simdjson")
    with pytest.raises(ValueError, match="auto, orjson or stdlib"):
        codec._fast_json()


@pytest.mark.parametrize(
    "body",
    [
        b"[[1.0, 2.5, -3, 4e-3]]",
        b'{"a": [[1, 2]], "b": [[0.5]]}',
        b"[[NaN, Infinity, -Infinity]]",  # not standard JSON; the stdlib has always read it
        b"[[1e400, -1e400, 1e-400]]",  # orjson refuses infinities; the stdlib reads them
        b"[[-9223372036854775809]]",  # past 64 bits: orjson would read a float
        b"[[18446744073709551616, 1]]",
        "[[1.0]]".encode("utf-16"),  # the stdlib detects UTF-16 and UTF-32
    ],
)
def test_both_engines_read_the_same_bodies_the_same_way(engine, body):
    try:
        got = codec.decode(body, "application/json")[0]
    except InputError as exc:
        got = exc
    want = json.loads(body)
    if isinstance(got, InputError):
        assert engine in ("orjson", "stdlib") and isinstance(want, list)
        assert "must hold numbers" in str(got)  # the huge integer: refused alike
        return
    if isinstance(got, dict):
        assert {k: v.tolist() for k, v in got.items()} == want
    else:
        np.testing.assert_array_equal(got, np.asarray(want))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[[1.0, 2.0]", "body is not valid JSON: Expecting ',' delimiter"),
        (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
        (b"\xff\xfe\x00", "body is not valid JSON"),
    ],
)
def test_both_engines_refuse_bad_bodies_with_the_same_typed_error(engine, body, message):
    with pytest.raises(InputError, match=message) as info:
        codec.decode(body, "application/json")
    assert info.value.status == 400


def test_both_engines_write_nan_and_infinities_as_null(engine):
    value = np.array([[1.5, np.nan, np.inf, -np.inf]], dtype=np.float32)
    body, kind = codec.encode(value, "json")
    assert kind == "application/json"
    assert json.loads(body) == [[1.5, None, None, None]]
    assert b"NaN" not in body and b"Infinity" not in body


def test_both_engines_write_the_same_values(engine):
    rng = np.random.default_rng(0)
    value = {"f32": rng.standard_normal((3, 4), dtype=np.float32), "i": np.arange(3)}
    body = codec.encode(value, "json")[0]
    assert json.loads(body) == {"f32": value["f32"].tolist(), "i": [0, 1, 2]}


def test_what_orjson_cannot_write_goes_to_the_stdlib_with_the_same_outcome(engine):
    assert json.loads(codec.dumps([2**70])) == [2**70]
    deep: list[object] = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(OutputError):
        codec.dumps(deep)
