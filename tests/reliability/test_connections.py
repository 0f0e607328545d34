"""Idle, slow, numerous and vanishing clients on real sockets: bounded, logged briefly, survived.

Waits are bounded with generous margins; nothing asserts how fast the server is.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import labserve

GOOD = (
    b"POST /runners/m/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 5\r\nConnection: close\r\n\r\n[[1]]"
)


class Model(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=8, max_latency_ms=1, on_overload="wait")
    def predict(self, x):
        time.sleep(0.002)
        return x * 2


@pytest.fixture
def runner():
    r = labserve.Runner(Model, name="m")
    yield r
    r.stop()


def good_request(port, timeout_s=30.0):
    """The status of one good request on a new connection (it may wait in the backlog)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(GOOD)
        return int(sock.makefile("rb").readline().split()[1])


def closed_by_server(sock, timeout_s=20.0):
    """True once the server closed ``sock`` (EOF or reset) within a generous bound."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def test_idle_slow_header_and_slow_body_connections_are_closed(runner):
    server = labserve.serve(runner, idle_timeout_s=0.5, body_timeout_s=0.5)
    try:
        idle = socket.create_connection(("127.0.0.1", server.port))
        slow_header = socket.create_connection(("127.0.0.1", server.port))
        slow_header.sendall(b"POST /runners/m/predict HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        slow_body = socket.create_connection(("127.0.0.1", server.port))
        slow_body.sendall(GOOD[: GOOD.index(b"[[1]]")] + b"[[")  # 3 of 5 body bytes
        # A slowloris client keeps sending a header byte now and then: still closed.
        stop = threading.Event()

        def trickle():
            while not stop.wait(0.1):
                try:
                    slow_header.sendall(b"X")
                except OSError:
                    return

        threading.Thread(target=trickle, daemon=True).start()
        try:
            assert closed_by_server(idle)
            assert closed_by_server(slow_header)
            assert closed_by_server(slow_body)
        finally:
            stop.set()
            for s in (idle, slow_header, slow_body):
                s.close()
        assert good_request(server.port) == 200
    finally:
        server.stop()


def test_over_the_connection_limit_the_rest_wait_and_are_served_once_it_frees(runner, caplog):
    server = labserve.serve(runner, max_connections=8)
    hogs = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(8)]
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            waiting = [pool.submit(good_request, server.port) for _ in range(4)]
            time.sleep(0.3)  # not a timing claim: gives a wrong server the chance to answer
            assert not any(f.done() for f in waiting), "served past max_connections"
            for hog in hogs:
                hog.close()
            assert [f.result(timeout=30) for f in waiting] == [200] * 4
        assert good_request(server.port) == 200
    finally:
        for hog in hogs:
            hog.close()
        server.stop()
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 0


def test_a_disconnect_storm_leaves_every_request_with_one_outcome(runner, caplog):
    server = labserve.serve(runner)
    try:

        def vanish(i):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(GOOD if i % 3 else GOOD[: len(GOOD) // 2])  # some mid-request
                if i % 2:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(vanish, range(300)))
        deadline = time.monotonic() + 30
        while (snap := runner.stats("predict")).pending and time.monotonic() < deadline:
            time.sleep(0.05)
        assert snap.pending == 0  # every admitted request got its outcome
        assert snap.admitted == snap.served + snap.cancelled + snap.failed + snap.rejected
        assert good_request(server.port) == 200
    finally:
        server.stop()
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert noisy == []


SERVER_SCRIPT = textwrap.dedent(
    """
    import resource, sys, threading
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
    import labserve

    class Model(labserve.Runnable):
        @labserve.method(batchable=True, max_latency_ms=1)
        def predict(self, x):
            return x * 2

    runner = labserve.Runner(Model, name="m")
    server = labserve.serve(runner)
    print(server.port, flush=True)
    sys.stdin.read()  # until the test closes it
    server.stop()
    runner.stop()
    """
)


def cpu_s(pid):
    """User plus system CPU seconds of process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_running_out_of_file_descriptors_neither_spins_nor_floods_the_log(tmp_path):
    # The default max_connections (512) is above this process's fd limit (128): accept()
    # fails with "Too many open files" while the idle connections hold every fd.
    err_path = tmp_path / "stderr"
    with err_path.open("wb") as err:
        _flood_a_server_with_few_fds(err)
    log = err_path.read_text(errors="replace")
    assert "Too many open files" in log  # the case was reached ...
    assert len(log) < 2000, log[:2000]  # ... and reported in a line or two, not megabytes
    assert "Traceback" not in log


def _flood_a_server_with_few_fds(err):
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=err,
    )
    hogs = []
    try:
        port = int(proc.stdout.readline())
        for _ in range(200):
            try:
                hogs.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                break  # the listen backlog is full too: enough
        time.sleep(0.5)  # let the server reach its fd limit
        before, started = cpu_s(proc.pid), time.monotonic()
        time.sleep(1.5)
        used, elapsed = cpu_s(proc.pid) - before, time.monotonic() - started
        # Spinning on accept() burns a whole core; calm retries use almost none.
        assert used < 0.3 * elapsed, f"{used:.2f} s of CPU in {elapsed:.2f} s"
        for hog in hogs:
            hog.close()
        hogs = []
        deadline = time.monotonic() + 30
        while True:
            try:
                assert good_request(port, timeout_s=10) == 200
                break
            except (OSError, ValueError, IndexError):
                assert time.monotonic() < deadline, "not serving again after the flood"
                time.sleep(0.2)
    finally:
        for hog in hogs:
            hog.close()
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
