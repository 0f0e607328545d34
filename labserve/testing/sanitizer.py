"""Where the nbval sanitizer file shipped with labserve lives."""

from __future__ import annotations

from pathlib import Path

__all__ = ["nbval_sanitizer_path"]


def nbval_sanitizer_path() -> Path:
    """The path of labserve's nbval sanitizer (ports, tokens, addresses, Bokeh ids).

    Use it from a shell: ``pytest --nbval --nbval-sanitize-with "$(labserve sanitizer-path)"``.

    Raises:
        FileNotFoundError: the installed package lacks the file (a broken install).
    """
    path = Path(__file__).resolve().parent.parent / "nbval_sanitize.cfg"
    if not path.is_file():
        raise FileNotFoundError(f"labserve's nbval sanitizer is missing at {path}: reinstall")
    return path
