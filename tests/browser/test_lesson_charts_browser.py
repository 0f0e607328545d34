"""A lesson's static charts on any page that shows them: Run All, reload, Run All again.

Lesson 09's code cells (four ``plot_generation_steps``/``plot_sweep`` charts) run in
JupyterLab and in Notebook 7, driven by Chromium as ``test_dashboard_browser.py`` drives it
(its helpers are loaded from that file). Every chart must draw after the first Run All, in
a page reloaded with the kernel alive, after a Run All in that reloaded page (the kernel
has sent BokehJS to a page before, not to this one), and in a second tab; the notebook as
JupyterLab saves it must stay small (no BokehJS in it).
"""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Any

import nbformat
import pytest

_HERE = pathlib.Path(__file__).parent
_spec = importlib.util.spec_from_file_location(
    "_dashboard_browser", _HERE / "test_dashboard_browser.py"
)
assert _spec is not None and _spec.loader is not None
lab_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab_helpers)

pytestmark = lab_helpers.pytestmark
ARTIFACTS = lab_helpers.ARTIFACTS
KERNEL_READY = lab_helpers.KERNEL_READY
_wait = lab_helpers._wait

LESSON = _HERE.parents[1] / "notebooks" / "09-continuous-batching.ipynb"
SAVED_LIMIT_BYTES = 200_000
FAILED = ("Failed to create view", "Could not create a view", "Error displaying widget")

# The execution count of the notebook's last cell (null before it ran in this kernel).
LAST_RUN = """() => {
  const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
  return cells.get(cells.length - 1).executionCount;
}"""


def _lesson_cells() -> list[str]:
    nb = nbformat.read(LESSON, as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    return [*cells, 'print("ready")']


def _charts(lesson_cells: list[str]) -> int:
    """The cells that show a chart: a line that starts with a ``plot_*`` call."""
    return sum(any(line.startswith("plot_") for line in src.splitlines()) for src in lesson_cells)


def _run_all(page: Any) -> None:
    """Run All and wait until its last cell has run (a count it did not have before)."""
    before = page.evaluate(LAST_RUN)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    _wait(lambda: page.evaluate(LAST_RUN) not in (None, before), "Run All", timeout=240)


def _all_drawn(page: Any, charts: int, console: list[str], what: str) -> None:
    """``charts`` figures drawn, no view failed, no error in the console."""
    figures = page.locator(".bk-Figure, .bk-figure")
    try:
        _wait(lambda: figures.count() >= charts, f"{what}: {charts} charts", timeout=60)
        for text in FAILED:
            assert page.get_by_text(text).count() == 0, (what, text)
    except AssertionError:
        page.screenshot(path=str(ARTIFACTS / f"lesson-charts-{what}.png"), full_page=True)
        print("\n".join(console[-40:]))
        raise
    assert figures.count() == charts, (what, figures.count())
    errors = [m for m in console if m.startswith("error") and "Comm not found" not in m]
    assert not errors, (what, errors)


def _save(page: Any) -> None:
    dirty = "() => window.jupyterapp.shell.currentWidget.context.model.dirty"
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    _wait(lambda: not page.evaluate(dirty), "the save")


@pytest.mark.parametrize("app", ["lab", "notebook"])
def test_lesson_09s_charts_draw_after_reload_and_run_all_and_it_saves_small(tmp_path, app):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    cells = _lesson_cells()
    charts = _charts(cells)
    assert charts >= 4
    with lab_helpers.run_lab(tmp_path, cells, app=app) as lab, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=lab_helpers.CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            console: list[str] = []
            page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
            url = f"{lab['base']}{lab['path']}dashboard.ipynb?token={lab['token']}"
            page.goto(url + "&reset")
            page.wait_for_function(KERNEL_READY, timeout=90_000)
            _run_all(page)
            _all_drawn(page, charts, console, f"{app}-run-all")

            _save(page)  # what a learner's autosave writes
            saved = (tmp_path / "dashboard.ipynb").stat().st_size
            assert saved < SAVED_LIMIT_BYTES, saved
            print(f"{app}: saved after Run All, {saved:,} bytes")

            # Reloaded with the kernel alive: the charts come back without a re-run.
            page.reload()
            page.wait_for_function(KERNEL_READY, timeout=90_000)
            _all_drawn(page, charts, console, f"{app}-reloaded")
            # Run All again in the reloaded page, the same kernel.
            _run_all(page)
            _all_drawn(page, charts, console, f"{app}-reloaded-run-all")
            page.screenshot(path=str(ARTIFACTS / f"lesson-09-{app}.png"), full_page=True)

            # A second tab on the same notebook: its Run All draws every chart too.
            _save(page)
            second = browser.new_page(viewport={"width": 1300, "height": 1000})
            console2: list[str] = []
            second.on("console", lambda msg: console2.append(f"{msg.type}: {msg.text}"))
            second.goto(url)
            second.wait_for_function(KERNEL_READY, timeout=90_000)
            _all_drawn(second, charts, console2, f"{app}-second-tab")
            _run_all(second)
            _all_drawn(second, charts, console2, f"{app}-second-tab-run-all")
            _save(second)
            saved = (tmp_path / "dashboard.ipynb").stat().st_size
            assert saved < SAVED_LIMIT_BYTES, saved
        finally:
            browser.close()
