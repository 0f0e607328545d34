"""The one-way layering rule: the core never loads the notebook UI stack."""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import labserve

UI_PACKAGES = ("ipywidgets", "bokeh", "IPython", "traitlets")
CORE = pathlib.Path(labserve.__file__).parent


def _ui_modules_loaded_by(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; return the UI modules it left in sys.modules."""
    probe = (
        f"{code}\n"
        "import json, sys\n"
        f"ui = {UI_PACKAGES!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ui)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_labserve_loads_no_ui_package():
    assert _ui_modules_loaded_by("import labserve") == []


def test_importing_every_core_module_loads_no_ui_package():
    code = (
        "import importlib, pkgutil, labserve\n"
        "for m in pkgutil.walk_packages(labserve.__path__, 'labserve.'):\n"
        "    importlib.import_module(m.name)\n"
    )
    assert _ui_modules_loaded_by(code) == []


def test_the_probe_sees_a_ui_import():
    # The probe itself must be able to fail: an import of traitlets is seen.
    assert "traitlets" in _ui_modules_loaded_by("import traitlets")


def _absolute_imports(root: pathlib.Path) -> list[tuple[pathlib.Path, ast.stmt, list[str]]]:
    """Every absolute import statement under ``root``: (file, node, the modules it names)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.append((path, node, [alias.name for alias in node.names]))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append((path, node, [node.module]))
    return found


def test_no_core_source_imports_a_ui_package_even_lazily():
    offenders = [
        f"{path.relative_to(CORE.parent)}:{node.lineno} imports {name}"
        for path, node, names in _absolute_imports(CORE)
        for name in names
        if name.split(".")[0] in UI_PACKAGES
    ]
    assert offenders == []


def test_the_ui_uses_only_labserves_public_api():
    offenders = []
    for path, node, names in _absolute_imports(pathlib.Path(__file__).parents[1] / "widgets"):
        offenders += [
            f"{path.name}:{node.lineno} imports {name}"
            for name in names
            if name.startswith("labserve.") and not name.startswith("labserve.widgets")
        ]
        if isinstance(node, ast.ImportFrom) and node.module == "labserve":
            offenders += [
                f"{path.name}:{node.lineno} imports {a.name}"
                for a in node.names
                if a.name not in labserve.__all__
            ]
    assert offenders == []
