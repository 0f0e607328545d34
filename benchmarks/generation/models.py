"""Which generative model a benchmark runs: ``--model tinylm`` or ``--model module:Class``.

Shared by the benchmarks that take ``--model`` (``prefix_targets.py``, ``fidelity.py``), so
that a spec means the same model in each. ``hf_folder:FolderLM`` is the batched HF decoder of
issue 32 on the folder ``$LABSERVE_HF_FOLDER`` names (``hf_folder.py`` builds one offline);
run the benchmark from this folder, or with it on ``PYTHONPATH``, so that ``hf_folder``
imports.
"""

from __future__ import annotations

import importlib
from typing import Any

from labserve.lab.demo import TinyLM

MODEL_HELP = (
    "tinylm, or module:Class of another generative model (hf_folder:FolderLM: the batched HF"
    " decoder on the folder LABSERVE_HF_FOLDER names; run from this folder)"
)


def model_class(spec: str) -> Any:
    """TinyLM, or the class ``module:Class`` names."""
    if spec == "tinylm":
        return TinyLM
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"model must be 'tinylm' or 'module:Class', got {spec!r}")
    return getattr(importlib.import_module(module), name)
