"""Execute the lessons in place and drop the inline BokehJS from their saved outputs.

    .venv/bin/python scripts/run_notebooks.py [notebooks/02-*.ipynb ...]   (default: all)

Saved outputs are what strict nbval compares, so re-run this after a change that moves a
lesson's numbers. labserve's charts bring BokehJS in a hidden widget's state, which is not
saved at all; an output that holds BokehJS itself (inline Bokeh from other code) is saved with
a stub in place of its 2 MB of script, so the notebook stays small, and labserve's nbval
sanitizer makes any BokehJS compare equal to the stub.
"""

from __future__ import annotations

import pathlib
import sys
import time

import nbformat
from labserve.widgets.bokehjs import LOAD_MIME, STUB
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).parents[1] / "notebooks"


def run(path: pathlib.Path) -> None:
    """Execute one notebook in place; stub out inline BokehJS; drop execution timestamps."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        store_widget_state=False,  # the charts' data would churn in git; nbval ignores it
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    nb.metadata.pop("widgets", None)
    took = time.perf_counter() - start
    for cell in nb.cells:
        if cell.cell_type == "code":
            for output in cell.get("outputs", []):
                if LOAD_MIME in output.get("data", {}):
                    output["data"][LOAD_MIME] = STUB
            cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    print(f"{path.name}: {took:.1f} s, {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    paths = [pathlib.Path(p) for p in sys.argv[1:]] or sorted(NOTEBOOKS.glob("*.ipynb"))
    for p in paths:
        run(p)
