"""``labserve serve``: a Runnable over HTTP in the foreground, here or on Ray Serve replicas.

Ctrl-C (SIGINT) and SIGTERM drain it: the runner stops first, then the server.
"""

from __future__ import annotations

import argparse
import errno
import math
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from labserve.base.errors import StopTimeoutError
from labserve.cli._common import UsageError, check_sections, import_from_cwd, loop_choice
from labserve.runtime.loop import LOOP_KINDS

if TYPE_CHECKING:
    from labserve.cli._common import Subcommands

__all__ = ["add_command", "run"]

_REPLIES_END_S = 5.0  # for replies whose runner has stopped: the last event, then the end


def add_command(sub: Subcommands) -> None:
    """The ``serve`` subcommand (a Runnable over HTTP, here or on Ray)."""
    srv = sub.add_parser("serve", help="serve a Runnable over HTTP in the foreground")
    srv.add_argument("target", help="module:Class (a labserve.Runnable)")
    srv.add_argument("--name", help="runner name (default: the class name, lowercased)")
    srv.add_argument("--config", help="a labserve/BentoML YAML config file")
    srv.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine)"
    )
    srv.add_argument("--port", type=int, default=3000, help="port to bind (default 3000)")
    srv.add_argument("--token", help="required for PATCH /config (and every route off loopback)")
    srv.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let pages of this origin call the server (repeatable; '*' for any)",
    )
    srv.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="accept this Host name besides loopback and the bound address (repeatable; '*')",
    )
    srv.add_argument(
        "--loop",
        choices=LOOP_KINDS,
        default="auto",
        help="the server's event loop (auto: uvloop if installed)",
    )
    srv.add_argument(
        "--drain-timeout",
        type=_nonnegative("seconds"),
        default=30.0,
        metavar="S",
        help="on SIGINT/SIGTERM, seconds for requests and generations in progress to finish;"
        " those still running then end with RunnerStoppedError (default 30)",
    )
    srv.add_argument("--ray", action="store_true", help="on Ray Serve replicas (labserve[ray])")
    srv.add_argument("--replicas", type=int, default=1, help="with --ray: replicas (default 1)")
    srv.add_argument(
        "--ray-address", help="with --ray: join this cluster (default: start a local Ray)"
    )
    srv.add_argument(
        "--router",
        help="with --ray: which replica takes each request: round_robin, power_of_two,"
        " least_kv, prefix or prefix_affinity (default: Ray Serve's own power of two)",
    )
    srv.add_argument(
        "--stream-interval-ms",
        type=_nonnegative("milliseconds"),
        default=0.0,
        metavar="MS",
        help="with --ray: a stream's text leaves its replica at most once per MS ms, the first"
        " piece at once (each item Serve carries costs CPU at every hop; default 0: each piece"
        " as soon as it is made)",
    )
    srv.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Serve ``args.target`` until SIGINT or SIGTERM, then drain and stop."""
    from labserve.runtime.runnable import Runnable

    module_name, _, cls_name = args.target.partition(":")
    if not (module_name and cls_name) or "." in cls_name:
        raise UsageError(f"serve needs module:Class, got {args.target!r}")
    try:
        cls = getattr(import_from_cwd(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load {args.target!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Runnable)):
        raise UsageError(f"{args.target!r} is not a labserve.Runnable class")
    if args.ray:
        _serve_on_ray(cls, args)
        return
    with loop_choice(args.loop):
        _serve_here(cls, args)


def _serve_here(cls: type[Any], args: argparse.Namespace) -> None:
    from labserve.runtime.runner import Runner
    from labserve.server import serve

    if args.config:
        check_sections(args.config, [args.name or cls.__name__.lower()])
    with _StopSignals() as signals:
        runner = Runner(cls, name=args.name, config=args.config)
        try:
            server = serve(
                runner,
                host=args.host,
                port=args.port,
                token=args.token,
                allow_origin=args.allow_origin,
                allow_hosts=args.allow_host,
            )
        except OSError as exc:  # the bind: a port in use, an address not this machine's
            runner.stop()
            raise UsageError(_cannot_listen(args.host, args.port, exc)) from None
        try:
            _say_routes(runner, server)
            signals.wait()
        finally:
            _stop_serving(runner, server, args.drain_timeout)


def _stop_serving(runner: Any, server: Any, drain_s: float) -> None:
    """Stop the runner, then the server: every open stream ends with its final event.

    The runner first (new requests get 503 meanwhile): its queued requests and live
    generations get ``drain_s`` to finish, then each caller still waiting gets
    RunnerStoppedError, which a stream sends as its last event. The server then lets those
    replies reach their clients before it closes the connections.
    """
    try:
        runner.stop(timeout=drain_s)
    except StopTimeoutError as exc:
        print(f"stopping: {exc}", file=sys.stderr, flush=True)
    finally:
        server.stop(drain_s=_REPLIES_END_S)


def _cannot_listen(host: str, port: int, exc: OSError) -> str:
    """One line for a failed bind, with what to do about the usual cause."""
    said = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    if exc.errno == errno.EADDRINUSE:
        return f"{said} (another server has it: give another --port, or --port 0 for a free one)"
    return said


def _nonnegative(unit: str) -> Callable[[str], float]:
    """An argparse type: a finite number of ``unit`` >= 0."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 <= value < math.inf:
            raise argparse.ArgumentTypeError(f"must be a number of {unit} >= 0, got {text!r}")
        return value

    return parse


def _say_routes(runner: Any, server: Any) -> None:
    """What is served, each kind as its clients call it: the lines a newcomer copies."""
    from labserve.server.describe import completion_curl, openai_client
    from labserve.server.exchange import generator_names
    from labserve.server.v2 import models

    loop = "uvloop" if server.bg.uvloop else "asyncio"
    lines = [
        f"serving {runner.name} at {server.url}  (token {server.token}, {loop} loop); Ctrl-C stops"
    ]
    lines += [f"  POST {server.url}/runners/{runner.name}/{m}" for m in runner.methods]
    token = server.token_everywhere
    for model in generator_names({runner.name: runner}):
        lines += [
            f"  POST {server.url}/v1/completions (and /v1/chat/completions), model {model!r}:"
            " generation, continuous batching",
            f"    {completion_curl(server.url, model, token=token)}",
            f"    {openai_client(server.url, token=token)}",
        ]
    v2 = sorted(models({runner.name: runner}))
    also = f"/v2/models/{v2[0]}/infer (Open Inference Protocol), " if v2 else ""
    lines.append(
        f"  also: {also}/stats, /metrics, /config, /healthz; GET {server.url}/ describes them all,"
        " /openapi.json for tools"
    )
    print("\n".join(lines), flush=True)


class _StopSignals:
    """While entered, Ctrl-C (SIGINT) and SIGTERM stop the serve loop; main thread only.

    Both are handled here rather than left to Python: SIGTERM (what a process manager or
    ``docker stop`` sends) would end the process at once, with nothing drained, and a shell
    starts a background job (``labserve serve ... &``) with SIGINT ignored. Entered before
    the server starts, so that a signal during start-up is not lost either.
    """

    def __enter__(self) -> _StopSignals:
        self._stop = threading.Event()
        self._got: list[str] = []
        self._previous = {
            s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)
        }
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._got.append(signal.Signals(signum).name)
        self._stop.set()

    def wait(self) -> None:
        """Block until a signal came (or had come), then say which."""
        while not self._stop.wait(0.5):
            pass
        print(f"stopping ({self._got[0]})", flush=True)


def _check_router(name: str) -> None:
    """A usage error for an unknown --router, before Ray starts (seconds of start-up)."""
    from labserve.base.errors import ConfigError
    from labserve.generation.routing import make_router

    try:
        make_router(name)
    except ConfigError as exc:
        raise UsageError(f"--router: {exc}") from None


def _interval_note(interval_ms: float) -> str:
    return f"; streams batched every {interval_ms:g} ms" if interval_ms else ""


def _serve_on_ray(cls: type[Any], args: argparse.Namespace) -> None:
    if args.router is not None:
        _check_router(args.router)
    try:
        # Optional: the `ray` extra. Imported only when asked for (--ray).
        import labserve.ray
        from labserve.ray import cluster
    except ImportError as exc:
        raise UsageError(f"--ray needs the ray extra: pip install 'labserve[ray]' ({exc})") from exc
    if args.host not in ("127.0.0.1", "localhost", "::1") and args.token is None:
        raise UsageError(f"binding {args.host!r} (not loopback) needs --token")
    with _StopSignals() as signals:
        owned = cluster.start(address=args.ray_address, host=args.host, port=args.port)
        app = None
        try:
            app = labserve.ray.deploy(
                cls,
                name=args.name,
                config=args.config,
                num_replicas=args.replicas,
                token=args.token,
                token_everywhere=args.host not in ("127.0.0.1", "localhost", "::1"),
                router=args.router,
                stream_interval_ms=args.stream_interval_ms,
            )
            print(
                f"serving {app.runner} on Ray Serve ({args.replicas} replicas) at "
                f"{app.url(args.host, args.port)}  (token {app.token}, router "
                f"{app.router or 'Serve default'}"
                f"{'; /v1 through an ingress, so it sees prompts' if app.ingress else ''}"
                f"{_interval_note(args.stream_interval_ms)}); "
                "Ctrl-C stops",
                flush=True,
            )
            signals.wait()
        finally:
            if app is not None:
                app.stop()
            cluster.stop(owned=owned)
