"""The notebook UI layer, imported as ``labserve.widgets``: the live dashboard and charts.

It uses only labserve's public API; the core never imports it.

>>> from labserve.widgets import Dashboard                   # doctest: +SKIP
>>> Dashboard(runner, example=x)       # controls + live charts
>>> GenerationDashboard(lm)            # a generative method's (continuous batching)
>>> plot(labserve.simulate(...))       # the same charts for a finished run
>>> plot_search(labserve.search_generation(...))   # a search's Pareto plot
>>> labserve.sweep(..., progress=ProgressBar())   # a sweep's progress in the notebook
"""

from .bokehjs import load_bokehjs
from .charts import Charts, plot
from .chartwidget import ChartWidget
from .dashboard import Dashboard
from .generation.dashboard import GenerationDashboard
from .generation.plots import (
    fidelity_figure,
    generation_steps_figure,
    plot_fidelity,
    plot_generation_steps,
)
from .generation.search import plot_search, search_figure
from .plots import (
    compare_figure,
    compare_series,
    cost_curve_figure,
    plot_compare,
    plot_cost_curve,
    plot_sweep,
    sweep_figure,
)
from .progress import ProgressBar
from .pump import Pump

__all__ = [
    "ChartWidget",
    "Charts",
    "Dashboard",
    "GenerationDashboard",
    "ProgressBar",
    "Pump",
    "compare_figure",
    "compare_series",
    "cost_curve_figure",
    "fidelity_figure",
    "generation_steps_figure",
    "load_bokehjs",
    "plot",
    "plot_compare",
    "plot_cost_curve",
    "plot_fidelity",
    "plot_generation_steps",
    "plot_search",
    "plot_sweep",
    "search_figure",
    "sweep_figure",
]
