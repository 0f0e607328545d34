"""Helpers for a team's own CI: SLO assertions, the nbval sanitizer, and a pytest plugin.

``import labserve`` never imports this package, and importing it does not import pytest:
only :mod:`labserve.testing.plugin` (loaded by pytest itself) does.

>>> from labserve.testing import assert_slo
>>> assert_slo(result, p99_ms=20, mean_batch=4, rejected_pct=0)  # doctest: +SKIP

In a shell: ``pytest --nbval --nbval-sanitize-with "$(labserve sanitizer-path)" notebooks/``.
"""

from labserve.testing.sanitizer import nbval_sanitizer_path
from labserve.testing.slo import SLOS, assert_slo

__all__ = ["SLOS", "assert_slo", "nbval_sanitizer_path"]
