"""Committed notebooks stay small: outputs for nbval to compare, no inline BokehJS blobs."""

from __future__ import annotations

import pathlib

import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
LIMIT_BYTES = 200_000


def oversized(paths, limit_bytes=LIMIT_BYTES):
    """The paths over ``limit_bytes``, each with its size, largest first."""
    sizes = [(path, path.stat().st_size) for path in paths]
    return sorted(((p, s) for p, s in sizes if s > limit_bytes), key=lambda ps: -ps[1])


def test_there_are_notebooks_to_check():
    assert sorted(NOTEBOOKS.glob("*.ipynb"))


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_is_under_200_kb(path):
    assert oversized([path]) == [], (
        f"{path.name} is {path.stat().st_size:,} bytes (limit {LIMIT_BYTES:,}): "
        "is inline BokehJS saved in an output? labserve's charts bring it in a widget's state;"
        " clear that cell's output before committing."
    )


def test_the_check_catches_a_big_notebook(tmp_path):
    big = tmp_path / "big.ipynb"
    big.write_bytes(b"x" * (LIMIT_BYTES + 1))
    small = tmp_path / "small.ipynb"
    small.write_bytes(b"x" * LIMIT_BYTES)
    assert oversized([small, big]) == [(big, LIMIT_BYTES + 1)]
