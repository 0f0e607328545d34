"""Run Debian's wrk with one of this folder's Lua scripts and read its report.

One thread (``-t1``), ``--latency`` always on. The Lua scripts (``post.lua``: one JSON row to
the simple route; ``post_v2.lua``: one v2 JSON tensor) set the method, headers and body.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
_SCALE_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _ms(out: str, percent: int) -> float | None:
    found = re.search(rf"\b{percent}%\s+([\d.]+)(us|ms|s)\b", out)
    return float(found.group(1)) * _SCALE_MS[found.group(2)] if found else None


def run(
    url: str, *, seconds: float, connections: int = 64, script: str = "post.lua"
) -> dict[str, Any]:
    """wrk against ``url``: req/s, requests, non-2xx replies, latency p50 and p99 (ms)."""
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds:g}s",
            "--latency",
            "-s",
            str(HERE / script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    if rps is None or total is None:
        raise RuntimeError(f"wrk printed no totals:\n{out}")
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "rps": float(rps.group(1)),
        "requests": int(total.group(1)),
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "p50_ms": _ms(out, 50),
        "p99_ms": _ms(out, 99),
    }


def replies(result: dict[str, Any]) -> str:
    """``all 2xx`` or ``N non-2xx``, for a table."""
    return f"{result['non_2xx']} non-2xx" if result["non_2xx"] else "all 2xx"
