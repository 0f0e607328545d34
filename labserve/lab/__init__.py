"""The lab's tools, built on the layers below: demo models, profiling, sweeps, config export.

``labserve.lab.demo`` holds the demo models the lessons use (``SleepModel``,
``MemoryBoundModel``); ``labserve.lab.sweep.format_table`` prints a sweep's rows.
"""

__all__: list[str] = []
