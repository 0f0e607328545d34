"""A driver's arrivals: requests from any thread, admitted together once per loop iteration.

:class:`Arrivals` gathers the requests that arrive for one method until its driver's next
pump admits them all at once (one lock, one clock read, one decision per loop iteration, not
per request). Requests from other threads wait in an inbox that costs the loop one wake-up
for all that came together; requests from the loop thread join the pending list directly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from labserve.batching.requests import Request
from labserve.runtime.scheduling import Host

__all__ = ["Arrivals"]


class Arrivals:
    """Arrivals not yet admitted, and whether a pump is scheduled to admit them.

    Thread-safe: :meth:`put_threadsafe`. Loop-only: :meth:`put`, :meth:`take` and
    :attr:`pump_scheduled` (the driver's pump clears it when it runs).
    """

    def __init__(
        self,
        host: Host,
        pump: Callable[[], None],
        refuse: Callable[[list[Request]], None],
    ) -> None:
        self._host = host
        self._pump = pump
        self._refuse = refuse  # for what arrives once the loop is closed
        self._inbox: deque[Request] = deque()
        self._inbox_scheduled = False
        # Loop-only: the next pump admits them all at once, as arrived when the first of
        # them did (never later than any of them came).
        self._pending: list[Request] = []
        self._arrived_s = 0.0
        self.pump_scheduled = False

    def put_threadsafe(self, request: Request) -> None:
        """Queue ``request`` from any thread for the next pump.

        The flag is cleared before the inbox is emptied, so an arrival racing with the
        drain either is drained or schedules a new one: none is left behind. If the loop
        is closed, what waits in the inbox is refused at once (nobody will admit it).
        """
        self._inbox.append(request)
        if not self._inbox_scheduled:
            self._inbox_scheduled = True
            try:
                self._host.call_soon_threadsafe(self._drain_inbox)
            except RuntimeError:  # the loop is closed: nobody will ever admit them
                self._inbox_scheduled = False
                taken = []
                while self._inbox:
                    taken.append(self._inbox.popleft())
                self._refuse(taken)

    def _drain_inbox(self) -> None:
        self._inbox_scheduled = False
        inbox = self._inbox
        pending = self._pending
        if inbox and not pending:
            self._arrived_s = self._host.now()
        while inbox:
            pending.append(inbox.popleft())
        if not self.pump_scheduled:
            self._pump()  # no need to wait another loop iteration

    def put(self, request: Request) -> None:
        """Queue ``request`` for a pump at the next loop iteration. Loop-only."""
        pending = self._pending
        if not pending:
            self._arrived_s = self._host.now()
        pending.append(request)
        if not self.pump_scheduled:
            self.pump_scheduled = True
            self._host.call_soon(self._pump)

    def take(self) -> tuple[list[Request], float]:
        """The pending arrivals and when the first of them came; none are left. Loop-only."""
        pending = self._pending
        if pending:
            self._pending = []
        return pending, self._arrived_s
