"""The ``labserve`` command: demo, sweep and profile from a shell, with progress shown.

Bad arguments get a one-line message and exit status 2, never a traceback. Each subcommand
lives in its own module (``demo``, ``sweep``, ``search``, ``profile``, ``serve``, ``load``,
``export``, ``sanitizer``), which adds its parser with ``add_command`` and runs it with
``run``; what they share is in ``_common``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from labserve.base.errors import LabServeError
from labserve.cli import demo, export, load, profile, sanitizer, search, serve, sweep
from labserve.cli._common import FailedRun, UsageError

__all__ = ["build_parser", "main"]

# In the order `labserve --help` lists them.
_COMMANDS = (demo, sweep, search, profile, serve, load, export, sanitizer)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``labserve`` command."""
    from labserve._version import __version__

    parser = argparse.ArgumentParser(prog="labserve", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"labserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in _COMMANDS:
        command.add_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (0; 1 for a failed load; 2 for a usage error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "duration", 1.0) <= 0 or getattr(args, "step_s", 1.0) <= 0:
            raise UsageError("durations must be > 0")
        args.run(args)
    except (UsageError, LabServeError, ValueError, TypeError) as exc:
        parser.exit(2, f"labserve: error: {exc}\n")
    except FailedRun as exc:
        parser.exit(1, f"labserve: the run failed: {exc}\n")
    except KeyboardInterrupt:
        parser.exit(130, "labserve: interrupted\n")
    return 0
