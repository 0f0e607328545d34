"""The notebook UI layer: imported as ``labserve.widgets``."""
