"""What labserve started in this process, by kind and name: a re-run replaces, one call stops all.

A notebook re-runs cells. Without this, ``Runner(..., name="m")`` run twice leaves the first
runner (and the server and load on it) going, reachable from no variable: a ghost that takes
the model's time while the new dashboard shows nothing. So each runner, server, load and
dashboard says here that it started; one of the same kind and name started later replaces
it (stops it, saying so in one line on stderr), and :func:`stop_all` stops everything.

A thing may depend on others (a server on its runners, a load on its target): stopping or
replacing one stops what depends on it first. Thread-safe: a lock guards the table; the
stops themselves run outside it (they may block on the background loop).
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from labserve.base.errors import LabServeError

__all__ = ["Key", "forget", "running", "stop_all", "track"]

Key = tuple[str, str]
"""(kind, name): ``("runner", "sleep")``, ``("server", "sleep")``, ``("dashboard", ...)``."""

_ORDER = ("load", "dashboard", "server", "runner")
"""Who stops first in :func:`stop_all`: the load before the dashboard watching it, the
server before the runners it serves. Other kinds stop first of all."""


@dataclass
class _Entry:
    key: Key
    obj: object
    stop: Callable[[], None]
    needs: frozenset[Key] = field(default_factory=frozenset)
    seq: int = 0


_lock = threading.Lock()
_entries: dict[Key, _Entry] = {}
_seq = itertools.count()


def _say(line: str) -> None:
    print(f"labserve: {line}", file=sys.stderr, flush=True)


def track(
    obj: object,
    kind: str,
    name: str,
    stop: Callable[[], None],
    *,
    needs: Iterable[Key] = (),
) -> Callable[[], None]:
    """Record that ``obj`` started; ``stop()`` ends it (idempotent, may block).

    A live one of the same kind and name is stopped first (with what depends on it), and
    one line on stderr says so. ``needs``: the keys this one depends
    on; it stops when any of them is replaced or stopped through here. Returns the call
    that forgets ``obj`` (when it stopped by itself).
    """
    key = (kind, name)
    with _lock:
        old = _entries.get(key)
    if old is not None and old.obj is not obj:
        stopped = _stop(old)
        also = f" (stopped with it: {', '.join(stopped)})" if stopped else ""
        _say(f"replaced {kind} {name!r}: the old one is stopped{also}")
    with _lock:
        _entries[key] = _Entry(key, obj, stop, frozenset(needs), next(_seq))
    return lambda: forget(obj)


def forget(obj: object) -> None:
    """``obj`` stopped by itself: drop it (what depends on it is left alone)."""
    with _lock:
        for key in [k for k, e in _entries.items() if e.obj is obj]:
            del _entries[key]


def running() -> list[Key]:
    """What is recorded as running, oldest first."""
    with _lock:
        return [e.key for e in sorted(_entries.values(), key=lambda e: e.seq)]


def _dependents(key: Key) -> list[_Entry]:
    with _lock:
        return [e for e in _entries.values() if key in e.needs]


def _stop(entry: _Entry) -> list[str]:
    """Stop what depends on ``entry``, then ``entry``; the names of the dependents stopped."""
    said = []
    for dep in sorted(_dependents(entry.key), key=lambda e: e.seq, reverse=True):
        said += _stop(dep)
        said.append(f"{dep.key[0]} {dep.key[1]!r}")
    with _lock:
        if _entries.get(entry.key) is entry:
            del _entries[entry.key]
    entry.stop()
    return said


def stop_all() -> list[str]:
    """Stop every load, dashboard, server and runner labserve started in this process.

    Returns what it stopped ("runner 'sleep'", ...), newest of each kind first. Safe to
    call any number of times; a runner's stop drains its queue (see ``Runner.stop``).

    >>> labserve.stop_all()  # doctest: +SKIP
    ["load 'sleep.predict'", "dashboard 'sleep.predict'", "server 'sleep'", "runner 'sleep'"]
    """

    def rank(e: _Entry) -> tuple[int, int]:
        kind = e.key[0]
        return (_ORDER.index(kind) if kind in _ORDER else -1, -e.seq)

    stopped: list[str] = []
    failures: list[LabServeError] = []
    while True:
        with _lock:
            if not _entries:
                break
            entry = min(_entries.values(), key=rank)
        try:
            stopped += _stop(entry)
        except LabServeError as exc:  # the rest still stop; the first failure is raised
            failures.append(exc)
        stopped.append(f"{entry.key[0]} {entry.key[1]!r}")
    if failures:
        raise failures[0]
    return stopped
