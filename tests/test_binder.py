"""Binder's environment, built from binder/ alone, runs the quickstart under strict nbval.

mybinder installs binder/requirements.txt into a fresh Python, then runs binder/postBuild
from the repository root. This test does the same in a new virtual environment (no system
site-packages, so nothing leaks in from the test environment), adds only the test runner
(pytest, nbval, ipykernel), and runs notebooks/01-quickstart.ipynb with the sanitizer shipped
in the installed package. A requirement missing from binder/ fails here, not on mybinder.
It uses the package registry; pip's cache makes re-runs faster.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK = "notebooks/01-quickstart.ipynb"
# What mybinder would not see in a clone, or what this machine built locally.
NOT_IN_A_CLONE = (
    ".git",
    ".venv*",
    "build",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".ipynb_checkpoints",
    "test-artifacts",
)


def _venv_available() -> bool:
    try:
        import ensurepip  # noqa: F401
        import venv  # noqa: F401
    except ImportError:
        return False
    return True


def _run(cmd: list[str], *, cwd: pathlib.Path, env: dict[str, str]) -> str:
    out = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1200, check=False
    )
    if out.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, cmd))} exited {out.returncode}\n"
            f"--- stdout (end) ---\n{out.stdout[-6000:]}\n"
            f"--- stderr (end) ---\n{out.stderr[-6000:]}"
        )
    return out.stdout


@pytest.mark.skipif(not _venv_available(), reason="this Python has no venv/ensurepip module")
def test_binder_environment_runs_the_quickstart_under_nbval(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(*NOT_IN_A_CLONE))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    bin_dir = venv / "bin"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP") and not k.startswith("PYTEST_")
    }
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    python = str(bin_dir / "python")

    _run([python, "-m", "pip", "install", "-q", "-r", "binder/requirements.txt"], cwd=repo, env=env)
    # As mybinder does: executed from the repository root, `python` being the environment's.
    _run([str(repo / "binder" / "postBuild")], cwd=repo, env=env)

    # JupyterLab loads these prebuilt extensions: without them the dashboard is blank on Binder.
    labextensions = venv / "share" / "jupyter" / "labextensions"
    for name in ("@jupyter-widgets/jupyterlab-manager", "@bokeh/jupyter_bokeh"):
        assert (labextensions / name / "package.json").is_file(), f"{name} is not installed"

    # Only the test runner is added; everything the notebook imports came from binder/.
    _run([python, "-m", "pip", "install", "-q", "pytest", "nbval", "ipykernel"], cwd=repo, env=env)
    sanitizer = _run([str(bin_dir / "labserve"), "sanitizer-path"], cwd=tmp_path, env=env).strip()
    assert pathlib.Path(sanitizer).is_relative_to(venv), sanitizer

    out = _run(
        [
            python,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--nbval",
            "--nbval-current-env",  # the kernel runs in this venv, whatever kernelspecs exist
            "--nbval-sanitize-with",
            sanitizer,
            NOTEBOOK,
        ],
        cwd=repo,
        env=env,
    )
    assert " passed" in out and "failed" not in out, out
