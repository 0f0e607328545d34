"""An open loop opens connections as it needs them, up to a stated limit, and counts the waits."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import labserve
from labserve.base.descriptors import socket_budget
from labserve.load.http_client import ConnectionPool, request_bytes

# A busy test machine may delay sends; the warning is tested in test_generator.py.
pytestmark = pytest.mark.filterwarnings("ignore::labserve.LoadWarning")

REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def _held_server(
    hold_until: int,
) -> tuple[asyncio.AbstractServer, list[asyncio.StreamWriter]]:
    """Answers no request until ``hold_until`` have arrived at once; then answers them all."""
    writers: list[asyncio.StreamWriter] = []
    seen = 0
    arrived = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal seen
        writers.append(writer)
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                seen += 1
                if seen >= hold_until:
                    arrived.set()
                await arrived.wait()
                writer.write(REPLY)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the pool closed the connection
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, writers


def test_the_pool_grows_past_its_prewarm_to_its_limit_and_counts_who_waited():
    async def run() -> tuple[ConnectionPool, list[int]]:
        server, writers = await _held_server(hold_until=4)
        port = server.sockets[0].getsockname()[1]
        pool = ConnectionPool("127.0.0.1", port, limit=4)
        await pool.prewarm(1, timeout_s=5)
        data = request_bytes("GET", "/", f"127.0.0.1:{port}", {})
        replies = await asyncio.gather(*(pool.request(data, 10.0) for _ in range(6)))
        await pool.close()
        server.close()
        for writer in writers:
            writer.close()
            await writer.wait_closed()
        await server.wait_closed()
        return pool, [r.status for r in replies]

    pool, statuses = asyncio.run(run())
    assert statuses == [200] * 6
    # One opened ahead; three more as the requests found none idle; two waited at the limit.
    assert (pool.most_open, pool.waited_at_limit) == (4, 2)


def test_an_open_loop_over_http_is_not_capped_at_its_first_64_connections():
    run = labserve.start_load(
        "http://127.0.0.1:1/runners/m/predict",  # nothing listens: the run ends at once
        example=np.ones((1, 4)),
        duration_s=0.01,
        arrivals=labserve.ConstantArrivals(100),
    )
    run.result(timeout=30)
    sender = run._sender
    assert sender.prewarm == 64 and sender.connections == socket_budget()


def test_a_summary_row_without_a_figure_says_why_instead_of_nan():
    result = labserve.load_test(
        "http://127.0.0.1:1/runners/m/predict",  # nothing listens: nothing is served
        example=np.ones((1, 4)),
        duration_s=0.01,
        arrivals=labserve.ConstantArrivals(100),
    )
    table = result.table()
    assert "nan" not in table
    assert "latency_p50_ms        - (nothing was served)" in table
    assert "- (not seen here: the batches ran in the server)" in table
