"""How many sockets one side of labserve may hold: the server's and the load generator's share.

A kernel may run both the in-kernel server and a load generator against it, in one process
with one ``ulimit -n``: each gets half of what is left once some descriptors are kept for
the runtime, the model, its files and pipes.
"""

from __future__ import annotations

__all__ = ["FD_RESERVE", "socket_budget"]

FD_RESERVE = 64
"""Descriptors left to the runtime, the model, its files and pipes."""


def socket_budget() -> int:
    """``min(512, (soft RLIMIT_NOFILE - 64) // 2)``, at least 8 (512 where unknown or unlimited).

    With ``ulimit -n 1024`` it is 480; with 256, 96.
    """
    try:
        import resource  # POSIX only
    except ImportError:
        return 512
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 512
    return max(8, min(512, (soft - FD_RESERVE) // 2))
