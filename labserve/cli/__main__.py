"""``python -m labserve.cli``: the ``labserve`` command, where no console script is installed."""

from __future__ import annotations

import sys

from labserve.cli import main

if __name__ == "__main__":
    sys.exit(main())
