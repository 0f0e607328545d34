"""Start or join a Ray cluster with Serve's proxy where labserve's routes are expected.

For the ``labserve serve --ray`` command and scripts; a notebook may call ``ray.init()``
and ``serve.start()`` itself. Not thread-safe: call from the driver's main thread.
"""

from __future__ import annotations

import ray
from ray import serve

__all__ = ["start", "stop"]


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
        ray.init(
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
