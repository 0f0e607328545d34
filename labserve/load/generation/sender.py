"""The HTTP side of a generation load: the model, /stats, and each request's stream. Loop-only.

:class:`GenerationSender` opens a :class:`~labserve.load.http_client.pool.ConnectionPool` to
the server, finds the model (the only one ``GET /v1/models`` lists, unless named), reads the
server's ``/stats`` entry for it before and after the run, and streams request ``k``
(its body from :class:`~labserve.load.generation.prompts.GenerationMix`) into a
:class:`~labserve.load.generation.stream.CompletionStream` that records it.
"""

from __future__ import annotations

import json
from typing import Any

from labserve.base.errors import LoadTargetError
from labserve.base.vocabulary import CONNECT_ERROR, RESET, TIMEOUT
from labserve.load.generation.prompts import CHAT_PATH, COMPLETIONS_PATH, GenerationMix
from labserve.load.generation.server_view import find_model_stats, generation_server_view
from labserve.load.generation.stream import CompletionStream, GenRecord
from labserve.load.http_client.endpoint import Endpoint
from labserve.load.http_client.pool import ConnectionPool
from labserve.load.http_client.reply import Reply
from labserve.load.records import Sender, clock_s

__all__ = ["GenerationSender"]

_PREWARM = 64  # connections opened before the clock starts (each is a handshake less in TTFT)
_SIDE_TIMEOUT_S = 5.0  # /v1/models and /stats, read outside the timed run


class GenerationSender(Sender[GenRecord]):
    """Sends request ``k`` of a generation run and records it. Loop-only."""

    def __init__(
        self,
        url: str,
        *,
        model: str | None,
        mix_args: tuple[Any, Any, int, bool],
        token: str | None,
        connections: int,
        timeout_s: float,
    ) -> None:
        self.url = url
        self.target = Endpoint.parse(url)
        self.chat = self.target.path.split("?", 1)[0].rstrip("/").endswith(CHAT_PATH)
        input_len, output_len, seed, ignore_eos = mix_args
        # The model is known only once /v1/models answers; the mix checks its lengths now.
        self.mix = GenerationMix(
            model or "", input_len, output_len, chat=self.chat, seed=seed, ignore_eos=ignore_eos
        )
        self.model = model
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.headers |= self.auth
        self.connections = connections
        self.timeout_s = timeout_s
        self.pool: ConnectionPool | None = None
        self.pool_seen: ConnectionPool | None = None
        """The pool of the run once closed: who waited for a connection."""
        self.stats_before: dict[str, Any] | None = None
        self.stats_after: dict[str, Any] | None = None

    @property
    def root(self) -> str:
        """The path the ``/v1`` routes hang from (``""`` at the server's root)."""
        path = self.target.path.split("?", 1)[0].rstrip("/")
        return path[: -len(CHAT_PATH if self.chat else COMPLETIONS_PATH)]

    async def open(self) -> None:
        """Open the pool, find the model, read /stats, open connections ahead of the clock."""
        t = self.target
        self.pool = ConnectionPool(t.host, t.port, tls=t.tls, limit=self.connections)
        try:
            if self.model is None:
                self.model = await self._only_model()
            self.mix.model = self.model
            self.stats_before = await self._stats()
            await self.pool.prewarm(min(self.connections, _PREWARM), _SIDE_TIMEOUT_S)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Read /stats once more (if it answered before), then close the pool (idempotent)."""
        if self.pool is None:
            return
        self.pool_seen = self.pool
        if self.stats_before is not None and self.stats_after is None:
            self.stats_after = await self._stats()
        pool, self.pool = self.pool, None
        await pool.close()

    def new_record(self) -> GenRecord:
        """An empty generation record."""
        return GenRecord()

    def new_slot(self, rec: GenRecord, intended_s: float) -> int:
        """A slot for the next request, with the lengths the mix drew for it."""
        return rec.new_slot(intended_s, *self.mix.lengths(len(rec.arrival)))

    async def send(self, rec: GenRecord, k: int) -> None:
        """Stream request ``k`` (its slot is made) and record its one outcome."""
        assert self.pool is not None
        body, _, _ = self.mix.body(k)
        data = self.target.request("POST", self.target.path, self.headers, body)
        written_at = await self.pool.send(
            data, CompletionStream(rec, k), self.timeout_s, idle_timeout=True
        )
        rec.went_out(k, written_at or clock_s())

    def why_behind(self, rec: GenRecord) -> str:
        """Requests that found every connection streaming when due, if any did."""
        waited = self.pool_seen.waited_at_limit if self.pool_seen is not None else 0
        if not waited:
            return ""
        return (
            f"; {waited / len(rec.lag):.0%} of the requests found all {self.connections} "
            "connections streaming when due (give more with connections=, --connections)"
        )

    async def _get(self, path: str) -> Reply:
        assert self.pool is not None
        data = self.target.request("GET", path, self.auth)
        return await self.pool.request(data, _SIDE_TIMEOUT_S)

    def _json(self, reply: Reply) -> Any:
        try:
            return json.loads(reply.body) if reply.status == 200 and reply.body else None
        except ValueError:
            return None

    async def _only_model(self) -> str:
        got = await self._get(f"{self.root}/v1/models")
        listed = self._json(got)
        where = f"{self.target.origin}{self.root}/v1/models"
        if got.status == 401:
            said = "unauthorized: give the server's token (token=, --token)"
            raise LoadTargetError(self.url, said)
        if got.status == 0 and got.outcome in (CONNECT_ERROR, RESET, TIMEOUT):
            raise LoadTargetError(
                self.url, f"the server is not reachable at {self.target.origin} ({got.detail})"
            )
        data = listed.get("data") if isinstance(listed, dict) else None
        if not isinstance(data, list):
            said = got.detail or f"status {got.status}"
            raise LoadTargetError(
                self.url,
                f"cannot list the served models at {where} ({said}): say which model to ask"
                " (model=, --model)",
            )
        names = [str(m["id"]) for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if len(names) != 1:
            served = ", ".join(names) or "none"
            raise LoadTargetError(
                self.url, f"say which model with model= (--model); {where} lists {served}"
            )
        return str(names[0])

    async def _stats(self) -> dict[str, Any] | None:
        got = await self._get(f"{self.root}/stats")
        assert self.model is not None
        return find_model_stats(self._json(got), self.model)

    def server_view(self) -> dict[str, Any] | None:
        """The server's /stats for the model over the run (None when it had none)."""
        if self.stats_before is None or self.stats_after is None or self.model is None:
            return None
        return generation_server_view(self.stats_before, self.stats_after, self.model)
