"""The load generator's HTTP side: labserve's simple route and any OIP v2 server.

One keep-alive pool of HTTP/1.1 connections per run (:mod:`labserve.load.http_client`),
sized to the load and opened before the clock starts; the request's bytes made once; every
way a request can end recorded as an outcome of its own kind (a 4xx, a 503, a timeout, a
refused connection, a dropped one), never raised. A v2 target's inputs (names, datatypes,
shapes) come from the model's metadata (``GET /v2/models/{name}``); ``binary=True`` sends
them as binary tensors. When the target is a labserve server, ``GET /stats`` before and
after the run gives the server's own view of it (:mod:`labserve.load.server_view`).
Loop-only, like every sender.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from labserve.base.errors import InputError, LoadTargetError
from labserve.base.vocabulary import SERVED
from labserve.load.examples import ExampleMix
from labserve.load.http_client.endpoint import Endpoint, path_of
from labserve.load.http_client.pool import ConnectionPool
from labserve.load.http_client.reply import Reply, WholeReply
from labserve.load.mix import LengthMix
from labserve.load.records import Record, Sender, clock_s
from labserve.load.server_view import find_method, server_view
from labserve.wire.datatypes import datatype, numpy_dtype

__all__ = ["NO_INPUTS", "HttpSender", "HttpTarget"]

NO_INPUTS = "the model's metadata declares no inputs"
"""How a LoadTargetError's ``problem`` begins when a v2 model needs ``example=``."""

_V2 = re.compile(
    r"^(?P<base>.*)/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$"
)
_SIMPLE = re.compile(r"^(?P<base>.*)/runners/(?P<runner>[^/]+)/(?P<method>[^/]+)$")
_HEADER_LENGTH = "Inference-Header-Content-Length"
# /stats and the v2 metadata are read outside the timed run; they must not hold it up.
_SIDE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class HttpTarget(Endpoint):
    """What a load URL points at: labserve's simple route, a v2 infer URL, or another URL.

    ``runner``/``method`` name the labserve method behind it, as far as the URL tells
    (a v2 model ``r.m`` is runner ``r``, method ``m``; a model ``r`` is the runner's only
    batchable method); ``base`` is the server's root, where ``/stats`` would be.
    """

    base: str = ""
    kind: str = "other"
    """"simple", "v2" or "other" (posted as on the simple route)."""
    runner: str | None = None
    method: str | None = None
    model: str | None = None
    version: str | None = None

    @classmethod
    def parse(cls, url: str) -> HttpTarget:
        """Read a load URL; LoadTargetError if it is not an http(s) URL."""
        endpoint = Endpoint.parse(url)
        target = cls(**dataclasses.asdict(endpoint), base=endpoint.origin)
        path_url = endpoint.origin + endpoint.path.split("?", 1)[0].rstrip("/")
        if m := _V2.match(path_url):
            runner, _, method = m["model"].partition(".")
            return dataclasses.replace(
                target,
                base=m["base"],
                kind="v2",
                runner=runner,
                method=method or None,
                model=m["model"],
                version=m["version"],
            )
        if m := _SIMPLE.match(path_url):
            return dataclasses.replace(
                target, base=m["base"], kind="simple", runner=m["runner"], method=m["method"]
            )
        return target

    @property
    def metadata_url(self) -> str:
        """The v2 model metadata URL (v2 targets only)."""
        version = f"/versions/{self.version}" if self.version else ""
        return f"{self.base}/v2/models/{self.model}{version}"


class HttpSender(Sender[Record]):
    """POSTs one example to an HTTP target over a keep-alive pool. Loop-only.

    ``connections`` bounds the pool (requests beyond it wait for a free connection, and
    that wait counts in their latency); ``timeout_s`` bounds each request, from its send
    to the last byte of its reply. ``token`` goes in ``Authorization: Bearer`` on every
    request (the load, the metadata and /stats).
    """

    def __init__(
        self,
        url: str,
        example: Any,
        *,
        binary: bool = False,
        token: str | None = None,
        connections: int = 64,
        timeout_s: float = 10.0,
        prewarm: int | None = None,
        mix: LengthMix | ExampleMix | None = None,
    ) -> None:
        self.target = HttpTarget.parse(url)
        if mix is not None and self.target.kind == "v2":
            what = "input_len=" if isinstance(mix, LengthMix) else "examples="
            raise TypeError(f"{what} sends a mix to the simple route only, not {url}")
        self.mix = mix
        self._requests: dict[int, tuple[bytes, int]] = {}  # per length: (request, items)
        self._headers: dict[str, str] = {}
        if example is None and self.target.kind != "v2":
            raise TypeError(f"load_test needs example= for {url} (only a v2 URL has metadata)")
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        if isinstance(connections, bool) or not isinstance(connections, int) or connections < 1:
            raise ValueError(f"connections must be an integer >= 1, got {connections!r}")
        self.example = example
        self.binary = binary
        self.connections = connections
        self.prewarm = connections if prewarm is None else prewarm
        self.timeout_s = float(timeout_s)
        self.headers: dict[str, str] = {"Authorization": f"Bearer {token}"} if token else {}
        self.request = b""
        self.items = 1
        self.pool: ConnectionPool | None = None
        self.pool_seen: ConnectionPool | None = None
        """The pool of the run once closed: how many connections it opened, who waited."""
        self._stats_before: dict[str, Any] | None = None
        self._stats_after: dict[str, Any] | None = None

    async def open(self) -> None:
        """Open the pool, read the v2 metadata, encode the request, read /stats."""
        t = self.target
        self.pool = ConnectionPool(t.host, t.port, tls=t.tls, limit=self.connections)
        try:
            headers = dict(self.headers)
            if t.kind == "v2":
                inputs = _v2_inputs(await self._metadata_inputs(), self.example, t.url)
                self.items = int(inputs[0][1].shape[0]) if inputs[0][1].ndim else 1
                body, headers["Content-Type"], extra = _v2_body(inputs, self.binary)
                headers.update(extra)
            else:
                arr = np.asarray(self.example)
                self.items = int(arr.shape[0]) if arr.ndim else 1
                body, headers["Content-Type"] = _simple_body(arr, self.binary)
            self.request = t.request("POST", t.path, headers, body)
            self._headers = headers
            self._stats_before = await self._stats()
            await self.pool.prewarm(self.prewarm, min(self.timeout_s, _SIDE_TIMEOUT_S))
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Read /stats once more (if it answered before), then close the pool."""
        if self.pool is None:
            return
        self.pool_seen = self.pool
        if self._stats_before is not None and self._stats_after is None:
            self._stats_after = await self._stats()
        pool, self.pool = self.pool, None
        await pool.close()

    def _request_for(self, k: int) -> tuple[bytes, int]:
        """Request ``k``'s bytes and items: the one request, or its length's (a mix)."""
        if self.mix is None:
            return self.request, self.items
        n = self.mix.length(k)
        made = self._requests.get(n)
        if made is None or not getattr(self.mix, "reuse", True):
            arr = np.asarray(self.mix.payload(k))
            headers = dict(self._headers)
            body, headers["Content-Type"] = _simple_body(arr, self.binary)
            items = int(arr.shape[0]) if arr.ndim else 1
            made = (self.target.request("POST", self.target.path, headers, body), items)
            if getattr(self.mix, "reuse", True):  # not a function's (one body per request)
                self._requests[n] = made
        return made

    def new_record(self) -> Record:
        """An empty request record."""
        return Record()

    def new_slot(self, rec: Record, intended_s: float) -> int:
        """A slot for the next request."""
        return rec.new_slot(intended_s)

    async def send(self, rec: Record, k: int) -> None:
        """POST the request; record its outcome and finish time."""
        assert self.pool is not None
        request, rec.items[k] = self._request_for(k)
        if rec.track_lag:  # open loop: send_soon found no idle connection
            rec.waited_for_connection += 1
        written_at = await self.pool.send(request, _Recorded(rec, k), self.timeout_s)
        rec.went_out(k, written_at or clock_s())  # after the wait for a connection

    def send_soon(self, rec: Record, k: int) -> asyncio.Future[Any] | None:
        """Write the request now on an idle connection (no task); None if none is idle."""
        assert self.pool is not None
        request, items = self._request_for(k)
        sent = self.pool.try_send(request, _Recorded(rec, k), self.timeout_s)
        if sent is None:
            return None
        rec.went_out(k, clock_s())
        rec.items[k] = items
        return sent

    def why_behind(self, rec: Record) -> str:
        """How the pool explains sends behind schedule: at its limit, or not the cause."""
        pool = self.pool_seen
        if pool is not None and pool.waited_at_limit:
            share = pool.waited_at_limit / len(rec.arrival)
            return (
                f"; {share:.1%} of the requests found all {pool.limit} connections (the "
                "limit) open and busy when due, and waited: the server answers slower "
                "than this rate needs; raise the limit with connections=, --connections"
            )
        if pool is not None and rec.waited_for_connection:
            return (
                f"; connections opened as needed, {pool.most_open} at most (limit "
                f"{pool.limit}): the generator, not the pool, fell behind"
            )
        return ""

    def server_view(self, duration_s: float) -> dict[str, Any] | None:
        """The labserve server's view of the run (None for other servers, or before close)."""
        before, after = self._stats_before, self._stats_after
        if before is None or after is None:
            return None
        return server_view(before, after, duration_s)

    async def _get_json(self, url: str) -> tuple[Reply, Any]:
        assert self.pool is not None
        data = self.target.request("GET", path_of(url), self.headers)
        reply = await self.pool.request(data, min(self.timeout_s, _SIDE_TIMEOUT_S))
        try:
            return reply, json.loads(reply.body) if reply.body else None
        except ValueError:
            return reply, None

    async def _stats(self) -> dict[str, Any] | None:
        if self.target.runner is None:
            return None
        reply, body = await self._get_json(f"{self.target.base}/stats")
        if reply.status != 200:
            return None
        return find_method(body, self.target.runner, self.target.method)

    async def _metadata_inputs(self) -> list[Mapping[str, Any]]:
        url = self.target.metadata_url
        reply, body = await self._get_json(url)
        if not reply.status:
            raise LoadTargetError(url, f"no answer for the model's metadata ({reply.detail})")
        if reply.status == 401:
            raise LoadTargetError(url, "unauthorized: give the server's token (token=, --token)")
        if reply.status != 200 or not isinstance(body, Mapping):
            said = body.get("error") if isinstance(body, Mapping) else None
            raise LoadTargetError(
                url, f"model metadata answered {reply.status} ({said or 'no JSON'})"
            )
        inputs = body.get("inputs") or []
        if not isinstance(inputs, list) or not all(isinstance(i, Mapping) for i in inputs):
            raise LoadTargetError(url, f"the metadata's inputs are not tensors: {inputs!r}")
        return inputs


class _Recorded(WholeReply):
    """Request ``k``'s reply, written into the run's record when it ends. Loop-only."""

    __slots__ = ("k", "rec")

    def __init__(self, rec: Record, k: int) -> None:
        super().__init__()
        self.rec = rec
        self.k = k

    def ended(self, outcome: int | None, detail: str, now: float) -> None:
        """Record the request's outcome and finish time (and why, when not served)."""
        super().ended(outcome, detail, now)
        rec, k, reply = self.rec, self.k, self.reply
        rec.outcome[k] = reply.outcome
        rec.finish[k] = now - rec.t0
        if reply.outcome != SERVED:
            rec.note_error(_message(reply))


def _message(reply: Reply) -> str:
    """What a reply without a result said: its JSON error, or the status, or why none came."""
    if not reply.status:
        return reply.detail or "no reply"
    try:
        body = json.loads(reply.body)
    except ValueError:
        body = None
    if isinstance(body, Mapping) and "error" in body:  # labserve's, and v2's {"error": ...}
        detail = body.get("detail")
        return f"HTTP {reply.status} {body['error']}" + (f": {detail}" if detail else "")
    text = reply.body[:120].decode("utf-8", "replace").strip()
    return f"HTTP {reply.status}" + (f": {text}" if text else "")


def _simple_body(arr: np.ndarray, binary: bool) -> tuple[bytes, str]:
    if binary:
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        return buf.getvalue(), "application/x-npy"
    return json.dumps(arr.tolist()).encode(), "application/json"


def _v2_inputs(
    meta: list[Mapping[str, Any]], example: Any, url: str
) -> list[tuple[str, np.ndarray]]:
    """(name, array) per input: names, datatypes and shapes from the metadata.

    The example fills in what the metadata leaves open (a ``-1`` dimension) and stands in
    for metadata that declares no inputs (a labserve method without ``input_spec``);
    without it, an open dimension is 1 (one row per request).
    """
    if isinstance(example, Mapping):
        given: dict[str | int, Any] = dict(example)
    elif isinstance(example, tuple):
        given = dict(enumerate(example))
    elif example is None:
        given = {}
    else:
        given = {0: example}
    if not meta:
        if not given:
            raise LoadTargetError(url, f"{NO_INPUTS}: give example= (or --width)")
        out = []
        for i, (key, value) in enumerate(given.items()):
            arr = np.asarray(value)
            datatype(arr.dtype)  # InputError now if it has no v2 name
            out.append((key if isinstance(key, str) else f"input__{i}", arr))
        return out
    out = []
    for i, spec in enumerate(meta):
        name = str(spec.get("name", f"input__{i}"))
        try:
            dtype = numpy_dtype(spec.get("datatype"), what=f"input {name!r}: datatype")
        except InputError as exc:
            raise LoadTargetError(url, str(exc)) from exc
        shape = spec.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            raise LoadTargetError(url, f"input {name!r}: shape {shape!r} is not a list of integers")
        value = given.get(name, given.get(i))
        if value is not None:
            arr = np.asarray(value)
            fits = arr.ndim == len(shape)
            if fits and all(d in (-1, n) for d, n in zip(shape, arr.shape, strict=True)):
                out.append((name, arr.astype(dtype, copy=False)))
                continue
            raise LoadTargetError(
                url, f"input {name!r}: the example's shape {list(arr.shape)} does not fit {shape}"
            )
        out.append((name, np.ones([1 if d < 0 else d for d in shape], dtype=dtype)))
    return out


def _v2_body(
    inputs: list[tuple[str, np.ndarray]], binary: bool
) -> tuple[bytes, str, dict[str, str]]:
    """The request body, its content type and extra headers (binary: the header length)."""
    tensors: list[dict[str, Any]] = []
    raw: list[bytes] = []
    for name, arr in inputs:
        tensor: dict[str, Any] = {
            "name": name,
            "shape": list(arr.shape),
            "datatype": datatype(arr.dtype),
        }
        if binary:
            data = np.ascontiguousarray(arr).tobytes()
            tensor["parameters"] = {"binary_data_size": len(data)}
            raw.append(data)
        else:
            tensor["data"] = arr.reshape(-1).tolist()
        tensors.append(tensor)
    request: dict[str, Any] = {"inputs": tensors}
    if not binary:
        return json.dumps(request).encode(), "application/json", {}
    request["parameters"] = {"binary_data_output": True}
    head = json.dumps(request).encode()
    return head + b"".join(raw), "application/octet-stream", {_HEADER_LENGTH: str(len(head))}
