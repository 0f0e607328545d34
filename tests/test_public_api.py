"""The explicit public surface: ``labserve.__all__`` and an ``__all__`` in every public module."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import labserve

PUBLIC_MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(labserve.__path__, "labserve.")
    if not any(part.startswith("_") for part in m.name.split("."))
)


def _isort_key(name: str) -> tuple[int, str]:
    """ruff's RUF022 order: SCREAMING_CASE, then CamelCase, then everything else."""
    if name.isupper() and len(name) > 1:
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


def test_all_names_exist():
    missing = [name for name in labserve.__all__ if not hasattr(labserve, name)]
    assert missing == []


def test_all_is_sorted_without_duplicates():
    assert len(set(labserve.__all__)) == len(labserve.__all__)
    assert list(labserve.__all__) == sorted(labserve.__all__, key=_isort_key)


def test_the_issue_api_is_public():
    for name in ("Runnable", "method", "Runner", "TensorSpec", "Snapshot", "BackgroundLoop"):
        assert name in labserve.__all__


def test_every_error_is_public_and_derives_from_labserve_error():
    from labserve.base import errors

    # Not errors: a warning, and an interrupt that must stay a KeyboardInterrupt.
    not_errors = {"LoadWarning": UserWarning, "LoadInterrupted": KeyboardInterrupt}
    for name in errors.__all__:
        assert name in labserve.__all__
        base = not_errors.get(name, labserve.LabServeError)
        assert issubclass(getattr(labserve, name), base)


def test_there_are_public_modules_to_check():
    assert {"labserve.runtime.runner", "labserve.runtime.loop", "labserve.base.errors"} <= set(
        PUBLIC_MODULES
    )


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_every_public_module_defines_all(name):
    module = importlib.import_module(name)
    assert hasattr(module, "__all__"), f"{name} has no __all__"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names what it does not define"
    assert list(module.__all__) == sorted(module.__all__, key=_isort_key)
