"""The wheel holds every package: pyproject lists them one by one, so each folder must be there.

An editable install finds a folder missing from the list anyway; a built wheel (Binder, a user's
``pip install .``) would not ship it. tests/test_binder.py installs a real wheel; this test says
which folder is missing, at once.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _listed() -> set[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return set(tomllib.load(f)["tool"]["setuptools"]["packages"])


def _on_disk() -> set[str]:
    found = set()
    for init in (ROOT / "labserve").rglob("__init__.py"):
        found.add(".".join(init.parent.relative_to(ROOT).parts))
    for init in (ROOT / "widgets").rglob("__init__.py"):  # installed as labserve.widgets
        found.add(".".join(("labserve", *init.parent.relative_to(ROOT).parts)))
    return found


def test_every_package_folder_is_listed_in_pyproject():
    assert _on_disk() - _listed() == set()


def test_every_listed_package_exists():
    assert _listed() - _on_disk() == set()


def test_tinylm_weights_are_package_data():
    # TinyLM() loads them by default: a wheel without them could not serve the demo model.
    with open(ROOT / "pyproject.toml", "rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]["labserve"]
    assert "lab/tinylm_weights.npz" in data
    assert (ROOT / "labserve" / "lab" / "tinylm_weights.npz").stat().st_size < 2_000_000
