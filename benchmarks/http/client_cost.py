"""What an HTTP client costs the load generator: CPU µs per request, side by side.

Run from the repository root: `.venv/bin/python benchmarks/http/client_cost.py`.
A bare tornado server (benchmarks/http/servers.py bare) in its own process; each client in
its own process keeps 16 requests in flight (one JSON row per POST, keep-alive where the
client has it) for --seconds, and reports requests per second and its own CPU time per
request (time.process_time over the measured span, imports excluded). Clients missing
from the environment (aiohttp, httpx, uvloop) are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
PORT = 18778
URL = f"http://127.0.0.1:{PORT}/runners/m/predict"
BODY = b"[[1.0, 1.0, 1.0, 1.0]]"
HEADERS = {"Content-Type": "application/json"}
CLIENTS = ("labserve", "labserve+uvloop", "aiohttp", "tornado", "httpx")


async def run_labserve(seconds: float, n: int) -> int:
    from labserve.load.http_client import ConnectionPool, request_bytes

    pool = ConnectionPool("127.0.0.1", PORT, limit=n)
    data = request_bytes("POST", "/runners/m/predict", f"127.0.0.1:{PORT}", HEADERS, BODY)
    await pool.prewarm(n, 5.0)
    return await _clients(seconds, n, lambda: pool.request(data, 10.0), pool.close)


async def run_aiohttp(seconds: float, n: int) -> int:
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=n))

    async def one() -> None:
        async with session.post(URL, data=BODY, headers=HEADERS) as reply:
            await reply.read()

    return await _clients(seconds, n, one, session.close)


async def run_tornado(seconds: float, n: int) -> int:
    from tornado.httpclient import AsyncHTTPClient

    client = AsyncHTTPClient(force_instance=True, max_clients=n)

    async def one() -> None:
        await client.fetch(URL, method="POST", body=BODY, headers=HEADERS)

    async def close() -> None:
        client.close()

    return await _clients(seconds, n, one, close)


async def run_httpx(seconds: float, n: int) -> int:
    import httpx

    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=n))

    async def one() -> None:
        await client.post(URL, content=BODY, headers=HEADERS)

    return await _clients(seconds, n, one, client.aclose)


async def _clients(seconds: float, n: int, one, close) -> int:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    count = 0

    async def client() -> None:
        nonlocal count
        while loop.time() < end:
            await one()
            count += 1

    await asyncio.gather(*(client() for _ in range(n)))
    await close()
    return count


def child(name: str, seconds: float) -> None:
    runner = {
        "labserve": run_labserve,
        "labserve+uvloop": run_labserve,
        "aiohttp": run_aiohttp,
        "tornado": run_tornado,
        "httpx": run_httpx,
    }[name]
    try:
        if name.endswith("+uvloop"):
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        asyncio.run(runner(0.5, 16))  # warm-up: imports, connections
    except ImportError:
        print(json.dumps(None))
        return
    cpu0, wall0 = time.process_time(), time.perf_counter()
    count = asyncio.run(runner(seconds, 16))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(json.dumps({"rps": count / wall, "cpu_us": 1e6 * cpu / max(count, 1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.seconds)
        return
    server = subprocess.Popen(
        [sys.executable, str(HERE / "servers.py"), "bare", str(PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    results: dict[str, list[dict[str, float]]] = {c: [] for c in CLIENTS}
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        for _ in range(args.repeats):
            for name in CLIENTS:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", name, "--seconds", str(args.seconds)],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                got = json.loads(out.strip().splitlines()[-1])
                if got is not None:
                    results[name].append(got)
    finally:
        server.terminate()
        server.wait(10)
    print("| client (16 in flight, bare tornado server) | req/s | client CPU µs per request |")
    print("|---|---:|---:|")
    for name, runs in results.items():
        if not runs:
            print(f"| {name} | not installed | |")
            continue
        rps = sorted(r["rps"] for r in runs)
        cpu = sorted(r["cpu_us"] for r in runs)
        print(
            f"| {name} | {' / '.join(f'{v:,.0f}' for v in rps)} | "
            f"{' / '.join(f'{v:.0f}' for v in cpu)} |"
        )


if __name__ == "__main__":
    main()
