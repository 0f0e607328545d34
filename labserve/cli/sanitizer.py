"""``labserve sanitizer-path``: where nbval's sanitizer file is, for ``--nbval-sanitize-with``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from labserve.cli._common import Subcommands

__all__ = ["add_command", "run"]


def add_command(sub: Subcommands) -> None:
    """The ``sanitizer-path`` subcommand (nbval's sanitizer file)."""
    sanitizer = sub.add_parser(
        "sanitizer-path",
        help='the nbval sanitizer file: pytest --nbval --nbval-sanitize-with "$(labserve '
        'sanitizer-path)"',
    )
    sanitizer.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Print the sanitizer file's path."""
    from labserve.testing.sanitizer import nbval_sanitizer_path

    print(nbval_sanitizer_path())
