"""The event loop HTTP loads run on: its own thread (``labserve-load``), never a server's.

A server in the same kernel must not share its loop with the load that measures it. Both
load generators (requests: :mod:`labserve.load.generator`; generation:
:mod:`labserve.load.generation`) run on this one loop, started lazily and stopped at exit.
"""

from __future__ import annotations

import atexit
import threading

from labserve.runtime.loop import BackgroundLoop

__all__ = ["load_loop"]

_load_loop: BackgroundLoop | None = None
_load_loop_lock = threading.Lock()


def load_loop() -> BackgroundLoop:
    """The event loop HTTP loads run on (its own thread, not labserve's). Thread-safe."""
    global _load_loop
    with _load_loop_lock:
        if _load_loop is None:
            _load_loop = BackgroundLoop("labserve-load")
            atexit.register(_load_loop.stop)
    _load_loop.start()
    return _load_loop
