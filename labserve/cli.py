"""The ``labserve`` command: demo, sweep and profile from a shell, with progress shown.

Bad arguments get a one-line message and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import functools
import importlib
import json
import math
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
from tqdm import tqdm

from labserve.base.errors import LabServeError, StopTimeoutError
from labserve.base.vocabulary import STRATEGIES
from labserve.generation.config import GENERATION_STRATEGIES, SCHEDULING_POLICIES
from labserve.lab.engines import ENGINE_FORMATS
from labserve.runtime.loop import LOOP_KINDS, BackgroundLoop, loop_kind

__all__ = ["main"]


if TYPE_CHECKING:  # generic in typeshed only
    # What build_parser hands each subcommand's function, to add its parser to.
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


class UsageError(Exception):
    """A bad argument, said in one line."""


def _numbers(kind: Callable[[str], Any], what: str) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{what} must be comma-separated numbers, got {text!r}"
            ) from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"{what} must be numbers > 0, got {text!r}")
        return values

    return parse


def _cost(text: str) -> tuple[float, float]:
    """``a_ms,b_ms``: the model's cost per call and per item, both >= 0, a_ms > 0."""
    parts = [v.strip() for v in text.split(",")]
    try:
        a_ms, b_ms = (float(v) for v in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"cost must be two numbers a_ms,b_ms (ms per call, ms per item), e.g. 2,0.1; "
            f"got {text!r}"
        ) from None
    if not (a_ms > 0 and b_ms >= 0) or not all(map(np.isfinite, (a_ms, b_ms))):
        raise argparse.ArgumentTypeError(
            f"cost needs a_ms > 0 and b_ms >= 0 (finite), got {text!r}"
        )
    return a_ms, b_ms


def _strategies(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [n for n in names if n not in STRATEGIES]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"strategies must be among {', '.join(STRATEGIES)}, got {text!r}"
        )
    return names


def _demo(args: argparse.Namespace) -> None:
    from labserve.base.errors import LoadWarning
    from labserve.lab.demo import SleepModel
    from labserve.load.arrivals import PoissonArrivals
    from labserve.load.generator import load_test
    from labserve.runtime.runner import Runner

    runner = Runner(
        SleepModel(a_ms=2.0, b_ms=0.1), name="demo", max_batch_size=64, max_latency_ms=20
    )
    x = np.ones((1, 16), np.float32)
    # A progress line only on a terminal: piped or redirected output gets the table alone.
    progress = sys.stderr.isatty() and sys.stdout.isatty()
    print("embedded sleep model: 2 ms + 0.1 ms x items per call; adaptive, cap 64, wait cap 20 ms")
    print(f"{'offered':>10} {'served':>10} {'mean batch':>11} {'p50 ms':>8} {'p99 ms':>8} note")
    try:
        for step, rate in enumerate(args.rates, start=1):
            if progress:
                sys.stderr.write(f"\rstep {step}/{len(args.rates)}: {rate:g} req/s ...")
                sys.stderr.flush()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", LoadWarning)
                result = load_test(
                    runner.predict,
                    example=x,
                    duration_s=args.step_s,
                    arrivals=PoissonArrivals(rate),
                    seed=step,
                )
            s = result.summary()
            note = "generator fell behind" if caught else ""
            if progress:
                sys.stderr.write("\r" + " " * 40 + "\r")
            print(
                f"{s['offered_rps']:>10,.0f} {s['served_rps']:>10,.0f} {s['mean_batch']:>11.1f} "
                f"{s['latency_p50_ms']:>8.2f} {s['latency_p99_ms']:>8.2f} {note}",
                flush=True,
            )
    finally:
        runner.stop()


def _sweep(args: argparse.Namespace) -> None:
    from labserve.lab.sweep import COLUMNS, format_table, sweep

    with contextlib.ExitStack() as stack:
        executor = _sweep_executor(args, stack)
        # A real progress bar on a terminal (tqdm); none when stderr is not one.
        bar = stack.enter_context(tqdm(desc="simulating", unit="point", disable=None))

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        rows = sweep(
            rates=args.rates,
            strategies=args.strategies,
            max_batch_size=[int(v) for v in args.max_batch_size],
            max_latency_ms=args.max_latency_ms,
            duration_s=args.duration,
            cost=args.cost,
            seed=args.seed,
            progress=progress,
            executor=executor,
        )
    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        print(
            f"wrote {len(rows)} rows ({len(COLUMNS)} columns: {', '.join(COLUMNS)}) "
            f"to {os.path.abspath(args.csv)}"
        )
    else:
        print(format_table(rows))


def _sweep_executor(
    args: argparse.Namespace, stack: contextlib.ExitStack
) -> concurrent.futures.Executor | None:
    """Where the points run: here (None), in ``--workers`` processes, or as Ray tasks."""
    if args.ray:
        try:
            # Optional: the `ray` extra. Imported only when asked for (--ray).
            from labserve.ray import cluster
            from labserve.ray.executor import RayExecutor
        except ImportError as exc:
            raise UsageError(
                f"--ray needs the ray extra: pip install 'labserve[ray]' ({exc})"
            ) from exc
        owned = cluster.start(address=args.ray_address, proxy=False)
        stack.callback(cluster.stop, owned=owned)
        return stack.enter_context(RayExecutor())
    if args.workers > 1:
        return stack.enter_context(concurrent.futures.ProcessPoolExecutor(args.workers))
    return None


def _import_from_cwd(module_name: str) -> Any:
    """Import a module, the current folder first on the path (as uvicorn and gunicorn do)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return importlib.import_module(module_name)


def _load_target(spec: str) -> tuple[Callable[..., Any], Any]:
    """``module:Class.method`` -> (bound method of a fresh instance, example or None)."""
    module_name, _, path = spec.partition(":")
    cls_name, _, method_name = path.partition(".")
    if not (module_name and cls_name and method_name):
        raise UsageError(f"a model must be 'memory', 'sleep' or module:Class.method, got {spec!r}")
    try:
        cls = getattr(_import_from_cwd(module_name), cls_name)
        instance = cls()
        return getattr(instance, method_name), getattr(instance, "example", None)
    except (ImportError, AttributeError, TypeError) as exc:
        raise UsageError(f"cannot load {spec!r}: {exc}") from exc


def _profile(args: argparse.Namespace) -> None:
    from labserve.lab.demo import MemoryBoundModel, SleepModel
    from labserve.lab.profiling import profile

    if args.model == "memory":
        model = MemoryBoundModel()
        fn: Callable[..., Any] = model.predict
        example = model.example()
    elif args.model == "sleep":
        fn, example = SleepModel().predict, np.ones((1, 16), np.float32)
    else:
        fn, make_example = _load_target(args.model)
        if args.width is not None:
            example = np.ones((1, args.width), np.float32)
        elif callable(make_example):
            example = make_example()
        else:
            raise UsageError("give --width N (input row width) for a model without example()")
    sizes = [int(v) for v in args.sizes]
    sys.stderr.write(f"profiling {args.model} at batch sizes {sizes} ...\n")
    curve = profile(fn, example=example, sizes=sizes, repeats=args.repeats)
    print(curve.table())


def _serve(args: argparse.Namespace) -> None:
    from labserve.runtime.runnable import Runnable

    module_name, _, cls_name = args.target.partition(":")
    if not (module_name and cls_name) or "." in cls_name:
        raise UsageError(f"serve needs module:Class, got {args.target!r}")
    try:
        cls = getattr(_import_from_cwd(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load {args.target!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Runnable)):
        raise UsageError(f"{args.target!r} is not a labserve.Runnable class")
    if args.ray:
        _serve_on_ray(cls, args)
        return
    with _loop_choice(args.loop):
        _serve_here(cls, args)


def _serve_here(cls: type[Any], args: argparse.Namespace) -> None:
    from labserve.runtime.runner import Runner
    from labserve.server import serve

    if args.config:
        _check_sections(args.config, [args.name or cls.__name__.lower()])
    with _StopSignals() as signals:
        runner = Runner(cls, name=args.name, config=args.config)
        server = serve(
            runner,
            host=args.host,
            port=args.port,
            token=args.token,
            allow_origin=args.allow_origin,
            allow_hosts=args.allow_host,
        )
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


_REPLIES_END_S = 5.0  # for replies whose runner has stopped: the last event, then the end


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


def _say_routes(runner: Any, server: Any) -> None:
    loop = "uvloop" if server.bg.uvloop else "asyncio"
    print(
        f"serving {runner.name} at {server.url}  (token {server.token}, {loop} loop); Ctrl-C stops",
        flush=True,
    )
    for method in runner.methods.values():
        print(f"  POST {server.url}/runners/{runner.name}/{method.name}", flush=True)
    print(
        f"  also: /v2/models/{runner.name}/infer (Open Inference Protocol), /stats, /metrics,"
        f" /config, /healthz; GET {server.url}/ describes them all, /openapi.json for tools",
        flush=True,
    )


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


def _serve_on_ray(cls: type[Any], args: argparse.Namespace) -> None:
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
            )
            print(
                f"serving {app.runner} on Ray Serve ({args.replicas} replicas) at "
                f"{app.url(args.host, args.port)}  (token {app.token}); Ctrl-C stops",
                flush=True,
            )
            signals.wait()
        finally:
            if app is not None:
                app.stop()
            cluster.stop(owned=owned)


def _load(args: argparse.Namespace) -> None:
    from labserve.base.errors import LoadInterrupted, LoadTargetError, LoadWarning
    from labserve.load.arrivals import ConstantArrivals, PoissonArrivals
    from labserve.load.generator import load_loop, load_test
    from labserve.load.http import NO_INPUTS

    if not args.url.startswith(("http://", "https://")):
        raise UsageError(f"URL must start with http:// or https://, got {args.url!r}")
    for name in ("rate", "timeout", "width", "connections", "concurrency"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name} must be > 0, got {value:g}")
    if args.input_len is not None:
        from labserve.base.lengths import parse_length

        try:
            args.input_len = parse_length(args.input_len, name="--input-len")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    from labserve.load.generation import is_generation_url

    if is_generation_url(args.url):  # streamed completions: TTFT, ITL, TPOT, goodput
        from labserve.load import gen_cli

        with _loop_choice(args.loop):
            gen_cli.run(args)
        return
    rows = np.ones((1, args.width or 4), np.float32)
    # A v2 model's metadata gives its inputs; float32 rows stand in when it declares none.
    example = rows if (args.width or "/v2/models/" not in args.url) else None
    if args.concurrency:
        mode = f"{args.concurrency} clients (closed loop)"
    else:
        mode = f"{args.arrivals} {args.rate:g} req/s (open loop)"
    sys.stderr.write(f"loading {args.url} for {args.duration:g} s, {mode} ...\n")
    process = PoissonArrivals if args.arrivals == "poisson" else ConstantArrivals
    with warnings.catch_warnings(record=True) as caught, _loop_choice(args.loop):
        warnings.simplefilter("always", LoadWarning)
        run = functools.partial(
            load_test,
            args.url,
            duration_s=args.duration,
            arrivals=None if args.concurrency else process(args.rate),
            concurrency=args.concurrency,
            label=f"{args.url}, {mode}",
            binary=args.binary,
            token=args.token,
            connections=args.connections,
            timeout_s=args.timeout,
            input_len=args.input_len,
        )
        try:
            try:
                result = run(example=example)
            except LoadTargetError as exc:
                if example is not None or not exc.problem.startswith(NO_INPUTS):
                    raise
                sys.stderr.write("the model's metadata declares no inputs: float32 rows of 4\n")
                result = run(example=rows)
        except LoadInterrupted as exc:
            print(exc.result.table())
            print(f"interrupted: the load stopped after {exc.sent} requests")
            raise
    print(result.table())
    print(_verdict(result, caught, load_loop(), None if args.concurrency else args.rate))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"summary": result.summary(), "server": result.server}, f, indent=1)


@contextlib.contextmanager
def _loop_choice(kind: str) -> Iterator[None]:
    """Run labserve's loops (the server's, the load generator's) on the loop asked for.

    ``auto`` is uvloop when installed. uvloop costs the generator about a third less CPU
    per request (benchmarks/http/client_cost.py) and the server less per request too
    (benchmarks/RESULTS.md). Chosen through ``$LABSERVE_LOOP``, put back afterwards
    (``main()`` may run inside another program); a loop, once started, keeps its kind.
    """
    try:
        loop_kind(kind)
    except ValueError as exc:
        raise UsageError(f"--loop {kind}: {exc}") from None
    before = os.environ.get("LABSERVE_LOOP")
    os.environ["LABSERVE_LOOP"] = kind
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LABSERVE_LOOP", None)
        else:
            os.environ["LABSERVE_LOOP"] = before


def _verdict(
    result: Any,
    caught: list[warnings.WarningMessage],
    bg: BackgroundLoop,
    asked_rps: float | None = None,
) -> str:
    """One honest line: did the generator keep the schedule, and whose batching is shown."""
    s = result.summary()
    lines = []
    if "send_lag_p99_ms" in s:
        kept = "kept" if not caught else "could NOT keep"
        lines.append(
            f"schedule: {kept} {asked_rps or s['offered_rps']:,.0f} req/s (send lag p99 "
            f"{s['send_lag_p99_ms']:.2f} ms, max {s['send_lag_max_ms']:.2f} ms)"
        )
        lines += [f"  {w.message}" for w in caught]
        if result.sent_until_s > result.duration_s * 1.01:
            lines.append(
                f"  the sends took {result.sent_until_s:.1f} s, not {result.duration_s:.1f} s: "
                f"served_rps ({s['served_rps']:,.0f}) is over the time they took"
            )
    lines.append(f"generator: its own event loop ({'uvloop' if bg.uvloop else 'asyncio'})")
    if result.server is not None:
        lines.append(
            "batching: the server's own /stats over the run "
            f"({result.server['runner']}.{result.server['method']})"
        )
    else:
        lines.append("batching: not seen (the target is not a labserve server)")
    return "\n".join(lines)


def _check_sections(path: str, served: list[str], *, runner: str | None = None) -> None:
    """A config file's runner sections must name runners there are (a typo is an error).

    ``served``: the runners being served (each section must be one of them); ``runner``: a
    runner the file must have a section for.
    """
    from labserve.config.file import load_config_file

    file = load_config_file(path)
    sections = list(file.runners)
    have = ", ".join(repr(n) for n in sections) or "none (only the global runners.batching)"
    if runner is not None and runner not in sections:
        raise UsageError(
            f"{path} has no section for runner {runner!r}; its runner sections: {have}"
        )
    if served:
        file.check_runners(served)  # before the model loads (serve() checks it again)


_GENERATION_FLAGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "long_prefill_token_threshold",
    "scheduling_policy",
    "num_kv_blocks",
    "block_size",
)


def _export_engine(args: argparse.Namespace) -> None:
    """A generative method's knobs, from the flags, as an engine's flags."""
    from labserve.base.errors import ConfigError
    from labserve.config.file import load_config_file
    from labserve.generation.config import GenerationConfig
    from labserve.lab.export import export_config

    if args.max_batch_size is not None or args.max_latency_ms is not None:
        raise UsageError(
            f"{args.format} exports a generative method's settings: give them as"
            " --max-num-seqs, --max-num-batched-tokens, ... (not --max-batch-size"
            " or --max-latency-ms)"
        )
    cfg = GenerationConfig()
    if args.config:
        if not args.runner:
            raise UsageError("--config with a generation format needs --runner (whose section)")
        file = load_config_file(args.config)
        try:
            cfg = cfg.replace(**file.generation_for(args.runner))
        except ConfigError as exc:
            key = f"runners.{args.runner}.generation.{exc.key}"
            raise ConfigError(key, exc.value, exc.rule, source=file.source) from None
    changes = {k: getattr(args, k) for k in _GENERATION_FLAGS if getattr(args, k) is not None}
    if args.strategy is not None:
        changes["strategy"] = args.strategy
    print(export_config(cfg.replace(**changes), args.format), end="")


def _export(args: argparse.Namespace) -> None:
    from labserve.config.batching import BatchingConfig, BatchingLayer
    from labserve.config.file import load_config_file
    from labserve.lab.export import export_config

    if args.format in ENGINE_FORMATS:
        _export_engine(args)
        return
    given = [k for k in _GENERATION_FLAGS if getattr(args, k) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise UsageError(
            f"{flag} is a generation setting: export it with vllm, sglang, tgi or tensorrt-llm"
        )
    file = load_config_file(args.config) if args.config else None
    if file is not None and args.runner:
        _check_sections(args.config, [], runner=args.runner)
    flags = {
        key: value
        for key, value in (
            ("strategy", args.strategy),
            ("max_batch_size", args.max_batch_size),
            ("max_latency_ms", args.max_latency_ms),
        )
        if value is not None
    }
    layers = [file.global_batching, file.for_runner(args.runner or "")] if file else []
    cfg = BatchingConfig.from_layers(*layers, BatchingLayer.from_mapping(flags))
    print(export_config(cfg, args.format, runner=args.runner, method=args.method), end="")


def _sanitizer_path(args: argparse.Namespace) -> None:
    from labserve.testing.sanitizer import nbval_sanitizer_path

    print(nbval_sanitizer_path())


def _demo_command(sub: Subcommands) -> None:
    """The ``demo`` subcommand (the embedded model under a rising load)."""
    demo = sub.add_parser("demo", help="ramp a load through an embedded model, live table")
    demo.add_argument(
        "--rates",
        type=_numbers(float, "rates"),
        default=[250, 1000, 2000, 4000],
        help="offered req/s, one step each, comma-separated (default 250,1000,2000,4000)",
    )
    demo.add_argument("--step-s", type=float, default=4.0, help="seconds per rate (default 4)")
    demo.set_defaults(run=_demo)


def _sweep_command(sub: Subcommands) -> None:
    """The ``sweep`` subcommand (a simulated grid of settings)."""
    sweep = sub.add_parser("sweep", help="a simulated grid of caps, strategies and rates")
    sweep.add_argument(
        "--rates",
        type=_numbers(float, "rates"),
        required=True,
        help="offered req/s to try, comma-separated, e.g. 500,1000,2000",
    )
    sweep.add_argument(
        "--strategies",
        type=_strategies,
        default=["adaptive"],
        help=f"comma-separated, among {','.join(STRATEGIES)} (default adaptive)",
    )
    sweep.add_argument(
        "--max-batch-size",
        type=_numbers(int, "max-batch-size"),
        default=[32],
        help="caps to try, items per batch, comma-separated (default 32)",
    )
    sweep.add_argument(
        "--max-latency-ms",
        type=_numbers(float, "max-latency-ms"),
        default=[10.0],
        help="wait caps to try, ms, comma-separated (default 10)",
    )
    sweep.add_argument(
        "--duration", type=float, default=10.0, help="seconds of load per point (default 10)"
    )
    sweep.add_argument("--workers", type=int, default=1, help="run points in N processes")
    sweep.add_argument("--ray", action="store_true", help="run points as Ray tasks (labserve[ray])")
    sweep.add_argument("--ray-address", help="with --ray: join this cluster (default: start one)")
    sweep.add_argument(
        "--cost",
        type=_cost,
        default=(2.0, 0.1),
        help="the simulated model's cost: a_ms,b_ms for a_ms + b_ms x items per call "
        "(default 2,0.1)",
    )
    sweep.add_argument("--seed", type=int, default=0, help="the arrivals' random seed (default 0)")
    sweep.add_argument("--csv", help="write the table to this CSV file")
    sweep.set_defaults(run=_sweep)


def _profile_command(sub: Subcommands) -> None:
    """The ``profile`` subcommand (a model's cost curve)."""
    prof = sub.add_parser("profile", help="the cost curve of a model against batch size")
    prof.add_argument("--model", default="memory", help="memory, sleep or module:Class.method")
    prof.add_argument(
        "--sizes",
        type=_numbers(int, "sizes"),
        default=[1, 2, 4, 8, 16, 32, 64],
        help="batch sizes to time, comma-separated (default 1,2,4,8,16,32,64)",
    )
    prof.add_argument("--repeats", type=int, default=5, help="calls per size (default 5)")
    prof.add_argument("--width", type=int, help="input row width, for a model without example()")
    prof.set_defaults(run=_profile)


def _serve_command(sub: Subcommands) -> None:
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
        type=_seconds,
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
    srv.set_defaults(run=_serve)


def _load_command(sub: Subcommands) -> None:
    """The ``load`` subcommand (open- or closed-loop load on an HTTP endpoint)."""
    load = sub.add_parser("load", help="open- or closed-loop load on an HTTP endpoint")
    load.add_argument(
        "url",
        help=".../runners/{name}/{method}, .../v2/models/{name}/infer, or .../v1/completions"
        " (or chat) of any OpenAI-compatible server",
    )
    load.add_argument("--rate", type=float, default=100.0, help="open loop req/s (default 100)")
    load.add_argument(
        "--arrivals", choices=("poisson", "constant"), default="poisson", help="open loop process"
    )
    load.add_argument("--concurrency", type=int, help="closed loop with N clients instead")
    load.add_argument("--duration", type=float, default=5.0, help="seconds (default 5)")
    load.add_argument(
        "--width", type=int, help="float32 values per row (default 4; v2: from the metadata)"
    )
    load.add_argument(
        "--binary", action="store_true", help="v2 binary tensors (.npy on the simple route)"
    )
    load.add_argument(
        "--input-len",
        help="a length mix for a method with a ragged axis: each row its own length, e.g."
        " 64, uniform:1:512, lognormal:16:128, list:8,16,32 (simple route)",
    )
    load.add_argument("--token", help="sent as Authorization: Bearer (servers off loopback)")
    load.add_argument(
        "--connections",
        type=int,
        help="most connections open at once (default: N clients; open loop: 64 opened "
        "ahead, more as needed up to half of ulimit -n, at most 512)",
    )
    load.add_argument("--timeout", type=float, default=10.0, help="per request, s (default 10)")
    load.add_argument("--json", help="also write the summary and the server's view to this file")
    load.add_argument(
        "--loop",
        choices=LOOP_KINDS,
        default="auto",
        help="the generator's event loop (auto: uvloop if installed)",
    )
    from labserve.load import gen_cli

    gen_cli.add_arguments(load)
    load.set_defaults(run=_load)


def _export_command(sub: Subcommands) -> None:
    """The ``export`` subcommand (batching settings for another server)."""
    export = sub.add_parser(
        "export",
        help="batching settings as a labserve/BentoML YAML, Ray Serve or Triton config;"
        " generation settings as vLLM, SGLang, TGI or TensorRT-LLM flags",
    )
    export.add_argument(
        "format",
        choices=("labserve", "ray", "triton", "tfserving", *ENGINE_FORMATS),
        help="labserve/BentoML YAML, a Ray Serve @serve.batch, a Triton config.pbtxt fragment, "
        "a TF Serving batching_parameters file; or a generation engine's flags",
    )
    export.add_argument("--config", help="read the settings from this labserve/BentoML YAML")
    export.add_argument("--runner", help="the runner's section (and the name written)")
    export.add_argument("--method", help="the method name in the snippet")
    export.add_argument(
        "--strategy",
        choices=STRATEGIES + GENERATION_STRATEGIES,
        help="override the strategy (continuous or static for a generation format)",
    )
    export.add_argument("--max-batch-size", type=int, help="override max_batch_size")
    export.add_argument("--max-latency-ms", type=float, help="override max_latency_ms")
    gen = export.add_argument_group("generation settings (vllm, sglang, tgi, tensorrt-llm)")
    gen.add_argument("--max-num-seqs", type=int, help="most sequences running at once")
    gen.add_argument("--max-num-batched-tokens", type=int, help="most tokens in one step")
    gen.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="split prompts that do not fit a step",
    )
    gen.add_argument("--long-prefill-token-threshold", type=int, help="one prompt's chunk cap")
    gen.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, help="queue order")
    gen.add_argument("--num-kv-blocks", type=int, help="KV-cache blocks in all (0: no limit)")
    gen.add_argument("--block-size", type=int, help="tokens per KV-cache block")
    export.set_defaults(run=_export)


def _sanitizer_command(sub: Subcommands) -> None:
    """The ``sanitizer-path`` subcommand (nbval's sanitizer file)."""
    sanitizer = sub.add_parser(
        "sanitizer-path",
        help='the nbval sanitizer file: pytest --nbval --nbval-sanitize-with "$(labserve '
        'sanitizer-path)"',
    )
    sanitizer.set_defaults(run=_sanitizer_path)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``labserve`` command."""
    from labserve._version import __version__

    parser = argparse.ArgumentParser(prog="labserve", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"labserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _demo_command(sub)
    _sweep_command(sub)
    _profile_command(sub)
    _serve_command(sub)
    _load_command(sub)
    _export_command(sub)
    _sanitizer_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (0, or 2 for a usage error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "duration", 1.0) <= 0 or getattr(args, "step_s", 1.0) <= 0:
            raise UsageError("durations must be > 0")
        args.run(args)
    except (UsageError, LabServeError, ValueError, TypeError) as exc:
        parser.exit(2, f"labserve: error: {exc}\n")
    except KeyboardInterrupt:
        parser.exit(130, "labserve: interrupted\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
