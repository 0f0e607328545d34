#!/usr/bin/env python3
"""Soak: minutes of mixed load on a real server with faults injected; nothing lost, no growth.

Run: `.venv/bin/python benchmarks/soak.py --minutes 10` (not part of `make test`).

One in-process server (`labserve.serve`) over a batchable model (2 ms + 0.1 ms per row,
request_timeout_ms=500). For the whole run, at once:
- clients on keep-alive connections POST one JSON row each, about --rate req/s in all;
- 1% of those rows are poisoned (the model raises on them; isolate_errors is on, so only
  they fail);
- once, a minute in, the model hangs for 2 s (its callers time out, the slot is stuck, the
  method refuses until it returns);
- clients that vanish: a request written on a fresh connection, closed before the reply;
- a PATCH /config every 10 ms, flipping max_batch_size between 16 and 64 and the strategy.
At the end it prints requests sent and answered by status, the server's outcome counters
(admitted = served + rejected + failed + cancelled + timeout, nothing pending) and the
process's RSS, open fds and threads at start, half-way and end. Exit status 1 if anything
was lost or a 500 was seen.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import socket
import threading
import time

import numpy as np

import labserve

POISON = -1.0


class Soaked(labserve.Runnable):
    """2 ms + 0.1 ms per row; raises on a poisoned row; hangs once when told to."""

    def __init__(self) -> None:
        self.hang = threading.Event()

    @labserve.method(batchable=True, max_batch_size=64, max_latency_ms=5, isolate_errors=True)
    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.hang.is_set():
            self.hang.clear()
            time.sleep(2.0)
        if (x == POISON).any():
            raise ValueError("poisoned row")
        time.sleep(0.002 + 0.0001 * len(x))
        return x * 2


def process_stats() -> dict[str, float]:
    """RSS (MiB), open file descriptors and threads of this process."""
    with open("/proc/self/status", encoding="ascii") as f:
        rss_kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return {
        "rss_mib": rss_kib / 1024,
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
    }


class Tally:
    """Client-side counts, shared by the client threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = 0
        self.poisoned = 0
        self.status: collections.Counter[str] = collections.Counter()

    def add(self, status: str) -> None:
        with self.lock:
            self.status[status] += 1


def client(url: str, rate: float, stop: threading.Event, tally: Tally, seed: int) -> None:
    """POST single rows at about ``rate`` req/s on one keep-alive connection (reconnecting)."""
    rng = np.random.default_rng(seed)
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {"Content-Type": "application/json"}
    while not stop.is_set():
        poisoned = rng.random() < 0.01
        row = [POISON] * 4 if poisoned else rng.random(4).tolist()
        with tally.lock:
            tally.sent += 1
            tally.poisoned += poisoned
        try:
            conn.request("POST", "/runners/soaked/predict", json.dumps([row]), headers)
            reply = conn.getresponse()
            reply.read()
            tally.add(str(reply.status))
        except (OSError, http.client.HTTPException) as exc:
            tally.add(type(exc).__name__)
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
        stop.wait(rng.exponential(1.0 / rate))
    conn.close()


def vanisher(url: str, stop: threading.Event, tally: Tally) -> None:
    """Write a request on a fresh connection and close it before the reply, 20 times a second."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps([[0.5, 0.5, 0.5, 0.5]]).encode()
    head = (
        f"POST /runners/soaked/predict HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    while not stop.wait(0.05):
        try:
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(head + body)
        except OSError as exc:
            tally.add(f"vanisher {type(exc).__name__}")
        with tally.lock:
            tally.sent += 1
        tally.add("vanished")


def patcher(url: str, token: str, stop: threading.Event, tally: Tally) -> None:
    """PATCH /config every 10 ms, flipping the cap and the strategy."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    flips = [
        {"max_batch_size": 16, "strategy": "greedy"},
        {"max_batch_size": 64, "strategy": "adaptive"},
    ]
    i = 0
    while not stop.wait(0.01):
        body = {"runner": "soaked", "method": "predict", **flips[i % 2]}
        i += 1
        try:
            conn.request("PATCH", "/config", json.dumps(body), headers)
            reply = conn.getresponse()
            reply.read()
            tally.add(f"patch {reply.status}")
        except (OSError, http.client.HTTPException) as exc:
            tally.add(f"patch {type(exc).__name__}")
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=600.0, help="normal requests per second")
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()

    model = Soaked()
    runner = labserve.Runner(model, name="soaked", request_timeout_ms=500)
    server = labserve.serve(runner)
    print(f"serving {server.url}; {args.minutes:g} min, ~{args.rate:g} req/s, faults on")
    stats = {"start": process_stats()}
    stop = threading.Event()
    tally = Tally()
    threads = [
        threading.Thread(target=client, args=(server.url, args.rate / args.clients, stop, tally, i))
        for i in range(args.clients)
    ]
    threads.append(threading.Thread(target=vanisher, args=(server.url, stop, tally)))
    threads.append(threading.Thread(target=patcher, args=(server.url, server.token, stop, tally)))
    for t in threads:
        t.start()
    end = time.monotonic() + args.minutes * 60
    hung = False
    half = time.monotonic() + args.minutes * 30
    while time.monotonic() < end:
        time.sleep(1.0)
        if not hung and time.monotonic() > end - args.minutes * 60 + min(60, args.minutes * 20):
            model.hang.set()
            hung = True
        if "half" not in stats and time.monotonic() > half:
            stats["half"] = process_stats()
    stop.set()
    for t in threads:
        t.join(30)
    time.sleep(1.0)  # the vanished requests' batches finish
    snap = runner.stats("predict")
    stats["end"] = process_stats()
    server.stop()
    runner.stop()

    print(f"\nrequests sent {tally.sent:,}; answers and events by kind:")
    for kind, count in sorted(tally.status.items()):
        print(f"  {kind:>28}: {count:,}")
    accounted = snap.served + snap.rejected + snap.failed + snap.cancelled + snap.timeout
    print(
        f"\nserver: admitted {snap.admitted:,} = served {snap.served:,} + rejected "
        f"{snap.rejected:,} + failed {snap.failed:,} + cancelled {snap.cancelled:,} + timeout "
        f"{snap.timeout:,} (sum {accounted:,}); pending {snap.pending}; refused {snap.refused:,}"
    )
    print("\nprocess:        rss MiB   fds  threads")
    for when, s in stats.items():
        print(f"  {when:>6}   {s['rss_mib']:10.1f} {s['fds']:5.0f} {s['threads']:8.0f}")
    lost = snap.pending != 0 or accounted != snap.admitted
    # By design: 500 only for the poisoned rows (the model raised), 503 while the hung call
    # held the slot (ModelStuckError), 504 for its callers (RequestTimeoutError).
    expected = {"200", "500", "503", "504", "vanished", "patch 200"}
    odd = {k: c for k, c in tally.status.items() if k not in expected}
    print(f"\npoisoned rows sent {tally.poisoned:,}, answered 500 {tally.status.get('500', 0):,}")
    print(f"lost: {'YES' if lost else 'none'}; unexpected answers: {odd or 'none'}")
    if tally.status.get("500", 0) > tally.poisoned:
        print("500s beyond the poisoned rows: something other than the model failed")
        lost = True
    return 1 if lost or odd else 0


if __name__ == "__main__":
    raise SystemExit(main())
