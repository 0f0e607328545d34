"""The one-way layering rule: the core never loads the notebook UI stack."""

from __future__ import annotations

import ast
import json
import pathlib
import re
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


def _parse(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


# Parsed once, when the test module is imported: CPython 3.11's parser can be left in a broken
# state ("AST constructor recursion depth mismatch") by a RecursionError elsewhere in the same
# process, and the reliability tests provoke those on purpose.
_TREES: dict[pathlib.Path, ast.Module] = {
    path: _parse(path)
    for root in (CORE, pathlib.Path(__file__).parents[1] / "widgets")
    for path in root.rglob("*.py")
}


def _absolute_imports(root: pathlib.Path) -> list[tuple[pathlib.Path, ast.stmt, list[str]]]:
    """Every absolute import statement under ``root``: (file, node, the modules it names)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = _TREES.get(path) or _parse(path)
        for node in ast.walk(tree):
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


# -- the layer order inside the core ---------------------------------------------------

LAYERS: tuple[tuple[str, ...], ...] = (
    ("labserve._version", "labserve.base"),  # words, errors, clocks
    ("labserve.config", "labserve.wire"),  # settings; what travels on the wire
    ("labserve.metrics",),  # recorder, snapshots, RunResult
    ("labserve.batching", "labserve.generation"),  # the sans-IO queue and schedulers
    ("labserve.runtime", "labserve.sim"),  # the two drivers: asyncio, virtual time
    ("labserve.load", "labserve.server"),  # what drives a runner, what serves one
    ("labserve.lab",),  # the lab's tools: demo models, profile, sweep, export, sources
    ("labserve.ray",),  # the way out to Ray Serve (an extra): uses the lab's tools
    ("labserve.testing",),  # the pytest plugin and SLO asserts
    ("labserve.cli", "labserve"),  # the fronts: the command and the API (labserve/__init__)
)
"""Lowest first. A unit imports only from lower layers and from inside itself; two units of
one layer do not import each other."""


def _unit(module: str) -> str:
    """The layer unit a module belongs to: its package under labserve, or itself."""
    for layer in LAYERS:
        for unit in layer:
            if module == unit or (unit != "labserve" and module.startswith(unit + ".")):
                return unit
    return "labserve"


def _rank(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(CORE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _core_imports() -> dict[str, set[str]]:
    """Every labserve module and the labserve modules it imports (lazily or not).

    ``from package import module`` counts as importing the module.
    """
    modules = {_module_name(p) for p in CORE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for path, node, names in _absolute_imports(CORE):
        deps = graph[_module_name(path)]
        deps.update(n for n in names if n == "labserve" or n.startswith("labserve."))
        if isinstance(node, ast.ImportFrom):
            deps.update(m for a in node.names if (m := f"{node.module}.{a.name}") in modules)
    return graph


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that go up a layer or sideways between two units of one layer."""
    bad = []
    for module, deps in graph.items():
        unit = _unit(module)
        for dep in deps:
            dep_unit = _unit(dep)
            if dep_unit == unit:
                continue
            if _rank(dep_unit) >= _rank(unit):
                bad.append(f"{module} ({unit}) imports {dep} ({dep_unit})")
    return sorted(bad)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles among modules (package __init__ re-exports are not followed)."""
    packages = {m for m in graph if (CORE.parent / m.replace(".", "/") / "__init__.py").exists()}
    edges = {m: {d for d in ds if d in graph and d not in packages} for m, ds in graph.items()}
    cycles, state = [], {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                cycles.append([*stack[stack.index(d) :], d])
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in packages and m not in state:
            visit(m, [])
    return cycles


def test_every_core_module_sits_in_a_layer():
    units = {_unit(m) for m in _core_imports()}
    assert units <= {u for layer in LAYERS for u in layer}
    assert len(units) > 10


def test_imports_only_go_down_the_layers():
    assert layer_violations(_core_imports()) == []


def test_the_layer_check_can_fail():
    upward = {"labserve.base.errors": {"labserve.runtime.runner"}}
    sideways = {"labserve.load.generator": {"labserve.server.app"}}
    assert layer_violations(upward) == [
        "labserve.base.errors (labserve.base) imports labserve.runtime.runner (labserve.runtime)"
    ]
    assert len(layer_violations(sideways)) == 1
    assert layer_violations({"labserve.server.app": {"labserve.runtime.runner"}}) == []


def test_the_command_package_is_the_top_floor():
    # labserve/cli/ is a package: each subcommand's module sits on the command's floor.
    graph = _core_imports()
    assert {"labserve.cli.serve", "labserve.cli.load"} <= set(graph)
    assert _unit("labserve.cli.load") == "labserve.cli"
    assert layer_violations({"labserve.cli.load": {"labserve.load.generation"}}) == []
    assert layer_violations({"labserve.load.generation": {"labserve.cli.load"}}) == [
        "labserve.load.generation (labserve.load) imports labserve.cli.load (labserve.cli)"
    ]


def test_no_import_cycles():
    assert import_cycles(_core_imports()) == []
    assert import_cycles({"labserve.x.a": {"labserve.x.b"}, "labserve.x.b": {"labserve.x.a"}})


def private_imports(trees: dict[pathlib.Path, ast.Module]) -> list[str]:
    """``from module import _name`` of another module's private name, in any of ``trees``."""
    bad = []
    for path, tree in sorted(trees.items()):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        bad.append(f"{path.name}:{node.lineno} imports {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    private = [p for p in alias.name.split(".")[1:] if p.startswith("_")]
                    if private and not alias.name.startswith("labserve._version"):
                        bad.append(f"{path.name}:{node.lineno} imports {alias.name}")
    return bad


_REACH_IN = ast.parse("from labserve.server.app import _Base\n")  # parsed at import, as above


def test_no_module_imports_another_modules_private_name():
    assert private_imports(_TREES) == []
    assert private_imports({pathlib.Path("reach.py"): _REACH_IN}) == ["reach.py:1 imports _Base"]


# -- the naming rule ---------------------------------------------------------------------

UI = CORE.parent / "widgets"
# gen* but not generation.py (the allowed module) nor generator.py (the request load generator)
GENERATION_WORDS = re.compile(r"^(gen(?!era)|generation_|generative|token_streams)")
"""File names that say "generation" by a prefix or an infix instead of by their place."""


def _misplaced(root: pathlib.Path) -> list[str]:
    """Modules named for generation outside a ``generation`` package or module."""
    out = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if "generation" in parts[:-1]:
            continue
        if GENERATION_WORDS.match(path.stem):
            out.append(str(path.relative_to(root.parent)))
    return out


def test_generation_only_code_lives_under_a_generation_segment():
    # The rule (README, Architecture): what serves generation only lives in a package named
    # generation/ on its floor (labserve/generation/, runtime/generation/, load/generation/,
    # lab/generation/, widgets/generation/) or in a module generation.py; no gen*, gen_*,
    # generation_* or generative* names beside it.
    assert _misplaced(CORE) + _misplaced(UI) == []


def test_the_naming_rule_can_fail(tmp_path):
    (tmp_path / "pkg" / "generation").mkdir(parents=True)
    names = ["gencharts.py", "generation.py", "generator.py", "generative.py"]
    names.append("generation/charts.py")
    for name in names:
        (tmp_path / "pkg" / name).write_text("")
    assert _misplaced(tmp_path / "pkg") == ["pkg/gencharts.py", "pkg/generative.py"]
