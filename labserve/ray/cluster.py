"""Start or join a Ray cluster with Serve's proxy where labserve's routes are expected.

For the ``labserve serve --ray`` command and scripts; a notebook may call ``ray.init()``
and ``serve.start()`` itself. Not thread-safe: call from the driver's main thread.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import warnings
from typing import Any

import ray
from ray import serve

__all__ = ["init", "start", "stop"]

_log = logging.getLogger(__name__)

INIT_ATTEMPTS = 6
"""How many times :func:`init` starts a local Ray before it gives up. Three ran out in CI on a
2-core machine running 4x slower than usual, beside the browser tests (load 9): lessons 07 and
12 failed at their first cell while the Ray tests before them, started at a lower load, passed."""

_SERVE_PROXY_WAITS = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",  # Ray 2.60's default: 5
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30",  # default: 10
}
"""How long Serve's controller waits for a proxy of a node :func:`init` starts."""


def init(**kwargs: Any) -> None:
    """``ray.init(**kwargs)``, started again when the new node times out at start-up.

    Ray 2.60 waits a fixed 30 s for its raylet to register with the GCS, then raises; on a
    2-core machine at load 10-15 that wait ran out in about one start in five (lesson 07 and
    the Ray tests failed so in CI), and the next start, with the machine as loaded, came up.
    A local start that timed out is shut down and tried again, up to :data:`INIT_ATTEMPTS`
    times; every other error, and a join of a running cluster (``address``), raise at once.
    """
    if not kwargs.get("address"):
        # A node this starts reads its environment now: Serve's controller kills a proxy not
        # ready within 5 s, and with both cores busy (two spinning processes beside the
        # suite) every proxy in CI was killed so before it ran ("cancelled before it started
        # running"), failing all 119 Ray tests. A user's own setting wins.
        for name, seconds in _SERVE_PROXY_WAITS.items():
            os.environ.setdefault(name, seconds)
    for attempt in range(1, INIT_ATTEMPTS + 1):
        ours = _children()
        try:
            ray.init(**kwargs)
            return
        except Exception as e:  # Ray raises a bare Exception for this one
            if kwargs.get("address") or "timed out during startup" not in str(e):
                raise
            # The failed node's processes (its GCS, dashboard, log monitor) are not Ray's
            # to stop any more (ray.shutdown() knows no node): end them first, while the
            # error still holds their Popen objects, or they outlive the program.
            _end(_children() - ours)
            ray.shutdown()
            if attempt == INIT_ATTEMPTS:
                raise
            _drop_failed_node(e)
        _log.warning("Ray's node timed out at start-up (attempt %d): starting again", attempt)


def _drop_failed_node(error: BaseException) -> None:
    """Free the failed node's objects now, held by ``error``'s frames: its Popen objects quiet.

    Its processes are ended, but a Popen freed while its process is still going (one slow
    to die on a loaded machine, or not this process's child) warns "subprocess ... is still
    running" wherever that falls: in CI, in the set-up of the test after a start that timed
    out twice at load 14-20, which pytest then failed.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        error.__traceback__ = None
        gc.collect()


def _children() -> set[int]:
    """The ids of this process's child processes, and theirs."""
    # Ray ships psutil (ray/thirdparty_files, on the path once ray is imported).
    import psutil  # type: ignore[import-untyped]

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _end(pids: set[int], wait_s: float = 5.0) -> None:
    """Terminate these processes (this one's children), then kill what is left after ``wait_s``."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=wait_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=wait_s)


def start(
    *,
    address: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    num_cpus: int | None = None,
    proxy: bool = True,
) -> bool:
    """Join the cluster at ``address``, or start a local one; with ``proxy``, Serve's too.

    Returns True when this call started Ray (then :func:`stop` with ``owned=True`` stops
    it all). On a cluster whose Serve already runs, its proxy's host and port stay.
    """
    owned = False
    if not ray.is_initialized():
        init(
            address=address,
            num_cpus=num_cpus if address is None else None,
            include_dashboard=False,
            log_to_driver=False,
        )
        owned = address is None
    if proxy:
        serve.start(http_options={"host": host, "port": port})
    return owned


def stop(*, owned: bool) -> None:
    """Stop Serve and Ray if this process started them; else only leave the cluster."""
    if owned:
        serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()
