"""``labserve profile``: the cost curve of a model against batch size."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from labserve.cli._common import UsageError, import_from_cwd, numbers

if TYPE_CHECKING:
    from labserve.cli._common import Subcommands

__all__ = ["add_command", "run"]


def add_command(sub: Subcommands) -> None:
    """The ``profile`` subcommand (a model's cost curve)."""
    prof = sub.add_parser("profile", help="the cost curve of a model against batch size")
    prof.add_argument("--model", default="memory", help="memory, sleep or module:Class.method")
    prof.add_argument(
        "--sizes",
        type=numbers(int, "sizes"),
        default=[1, 2, 4, 8, 16, 32, 64],
        help="batch sizes to time, comma-separated (default 1,2,4,8,16,32,64)",
    )
    prof.add_argument("--repeats", type=int, default=5, help="calls per size (default 5)")
    prof.add_argument("--width", type=int, help="input row width, for a model without example()")
    prof.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Time ``args.model`` at each batch size; print the curve's table."""
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


def _load_target(spec: str) -> tuple[Callable[..., Any], Any]:
    """``module:Class.method`` -> (bound method of a fresh instance, example or None)."""
    module_name, _, path = spec.partition(":")
    cls_name, _, method_name = path.partition(".")
    if not (module_name and cls_name and method_name):
        raise UsageError(f"a model must be 'memory', 'sleep' or module:Class.method, got {spec!r}")
    try:
        cls = getattr(import_from_cwd(module_name), cls_name)
        instance = cls()
        return getattr(instance, method_name), getattr(instance, "example", None)
    except (ImportError, AttributeError, TypeError) as exc:
        raise UsageError(f"cannot load {spec!r}: {exc}") from exc
