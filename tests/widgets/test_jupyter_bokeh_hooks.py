"""ChartWidget leans on private hooks of jupyter_bokeh: fail loudly if an upgrade moves one."""

from __future__ import annotations

import inspect

import jupyter_bokeh
import pytest
from jupyter_bokeh import BokehModel
from labserve.widgets import ChartWidget
from labserve.widgets.chartwidget import HOOKS


def _params(fn: object) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_jupyter_bokeh_still_has_the_hook_chartwidget_overrides(name):
    expected = HOOKS[name]
    where = (
        f"jupyter_bokeh {jupyter_bokeh.__version__}: BokehModel.{name}, which ChartWidget "
        "(widgets/chartwidget.py) relies on"
    )
    assert hasattr(BokehModel, name), f"{where}, is gone. Re-check ChartWidget, then the pin."
    raw = inspect.getattr_static(BokehModel, name)  # a classmethod keeps its cls this way
    found = _params(raw.__func__ if isinstance(raw, classmethod) else raw)
    assert found == expected, (
        f"{where}, changed its parameters from {expected} to {found}. Re-check what "
        "ChartWidget does with it (and pyproject's jupyter-bokeh pin) before raising the pin."
    )


@pytest.mark.parametrize("name", ["_document_patched", "_sync_model"])
def test_chartwidget_overrides_keep_the_hooks_signatures(name):
    assert _params(getattr(ChartWidget, name)) == HOOKS[name]


def test_a_changed_hook_is_caught(monkeypatch):
    monkeypatch.setattr(BokehModel, "_sync_model", lambda self, content: None)
    with pytest.raises(AssertionError, match="changed its parameters"):
        test_jupyter_bokeh_still_has_the_hook_chartwidget_overrides("_sync_model")
    monkeypatch.delattr(BokehModel, "_sync_model")
    with pytest.raises(AssertionError, match="is gone"):
        test_jupyter_bokeh_still_has_the_hook_chartwidget_overrides("_sync_model")
