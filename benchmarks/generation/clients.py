"""guidellm and NVIDIA's aiperf against `labserve serve`, beside `labserve load` and its /stats.

Run from the repository root with labserve's venv, after `make -C benchmarks clients-venv`
(guidellm and aiperf in benchmarks/.venv-clients: not labserve's dependencies; this script
installs nothing):

    .venv/bin/python benchmarks/generation/clients.py --rates 4,12 --seconds 30

`labserve serve labserve.lab.demo:TinyLM` runs in its own process; a tokenizer folder
matching TinyLM's byte ids is built offline (byte_tokenizer.py). Per rate, each client runs
in a process of its own: constant arrivals (guidellm 0.8.1's Poisson is broken, below),
64-token prompts, 64 output tokens with ignore_eos (each client sends it), streamed. A
thread polls /stats every --poll-s; the server's output tokens/s is its output_tokens counter
over the span in which it had work (each end interpolated to half a poll). Its percentiles
cover a sliding 10 s window: read at polls a window apart, back from the one where the work
ended, the windows tile the run, and each figure is the tiles' quantiles weighted by the
sequences each served (an approximation of the run's quantile; the last window's alone is
kept too). Each run starts a window after the last one ended, so none holds another's.

What each client calls what: TPOT is vLLM's (e2e - TTFT) / (output tokens - 1) on the
server, in `labserve load` and as aiperf's "inter_token_latency"; aiperf's gap between chunks
("inter_chunk_latency") is the ITL. guidellm's "time_per_output_token" is e2e / output
tokens (TTFT included), and its "inter_token_latency" is vLLM's TPOT. The table shows each
figure under the server's name for it and says which of the client's it is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from tinylm_server import tinylm_server  # noqa: E402

CLIENTS_BIN = ROOT / "benchmarks" / ".venv-clients" / "bin"
MODEL = "tinylm"
TOKENS = 64  # prompt and output, tokens (= bytes for TinyLM)
TARGETS = {"tokens_s": 0.05, "itl_p50": 0.15, "tpot_p50": 0.15}
"""The largest relative difference from the server's figure (issue 36, item 9)."""
# HF_HUB_OFFLINE=1 keeps guidellm off the network. aiperf 0.13.0 must run without it: offline,
# it looks a local tokenizer folder up in the hub's cache (snapshot_download) and fails
# ("Repo id must be in the form 'repo_name'"); online it reads the folder from disk.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


class StatsPoller:
    """Reads the model's /stats entry every ``every_s`` on a thread until stopped."""

    def __init__(self, base: str, every_s: float) -> None:
        self.url = base + "/stats"
        self.every_s = every_s
        self.polls: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stats-poller", daemon=True)

    def __enter__(self) -> StatsPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(2 * self.every_s)  # an idle poll after the last completion
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            with urllib.request.urlopen(self.url, timeout=5) as reply:
                entry = json.load(reply)[MODEL]["generate"]
            entry.pop("recent_steps", None)
            self.polls.append(entry)
            self._stop.wait(self.every_s)


def _busy(polls: list[dict[str, Any]], i: int) -> bool:
    p = polls[i]
    moved = i > 0 and p["outcomes"]["served"] != polls[i - 1]["outcomes"]["served"]
    return bool(p["num_running"] or p["num_waiting"] or moved)


def server_figures(polls: list[dict[str, Any]], window_s: float) -> dict[str, float]:
    """Output tokens/s over the span the server had work; its percentiles over the run."""
    busy = [i for i in range(1, len(polls) - 1) if _busy(polls, i)]
    if not busy:
        return {"tokens_s": math.nan, "served": 0}
    first, last = busy[0], busy[-1]
    t = [p["time_s"] for p in polls]
    span = (t[last] + t[last + 1]) / 2 - (t[first - 1] + t[first]) / 2
    end = polls[last + 1]
    tokens = end["output_tokens"] - polls[first - 1]["output_tokens"]
    out = {"tokens_s": tokens / span, "span_s": span, "output_tokens": tokens}
    out["served"] = end["outcomes"]["served"] - polls[first - 1]["outcomes"]["served"]
    tiles = _tiles(polls, first - 1, last + 1, window_s)
    for metric in ("ttft", "itl", "tpot"):
        for q in ("p50", "p99"):
            value = end["percentiles_ms"][metric][q]
            out[f"{metric}_{q}_last_window"] = math.nan if value is None else value
            out[f"{metric}_{q}"] = _tiled(polls, tiles, metric, q)
    return out


def _tiles(polls: list[dict[str, Any]], start: int, end: int, window_s: float) -> list[int]:
    """Polls a window apart, back from ``end``: their windows tile the run, overlapping none."""
    t = [p["time_s"] for p in polls]
    tiles = [end]
    while t[tiles[-1]] - window_s > t[start]:
        due = t[tiles[-1]] - window_s
        tiles.append(min(range(start, tiles[-1]), key=lambda i: abs(t[i] - due)))
    return tiles


def _tiled(polls: list[dict[str, Any]], tiles: list[int], metric: str, q: str) -> float:
    """Each tile's quantile weighted by the sequences it served: the run's, approximately."""
    served = [p["outcomes"]["served"] for p in polls]
    pairs = []
    for i, j in zip(tiles, [*tiles[1:], None], strict=True):
        value = polls[i]["percentiles_ms"][metric][q]
        weight = served[i] - (served[j] if j is not None else served[0])
        if value is not None and weight > 0:
            pairs.append((value, weight))
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else math.nan


def run_labserve(base: str, rate: float, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    report = out / f"labserve_{rate:g}.json"
    argv = [sys.executable, "-m", "labserve.cli", "load", base + "/v1/completions"]
    argv += ["--rate", str(rate), "--arrivals", "constant", "--duration", str(args.seconds)]
    argv += ["--input-len", str(TOKENS), "--output-len", str(TOKENS), "--json", str(report)]
    _run(argv, out / f"labserve_{rate:g}.log", os.environ)
    s = json.loads(report.read_text())["summary"]
    return {
        "tokens_s": s["output_tokens_per_s"],
        "served": s["served"],
        "errors": s["requests"] - s["served"],
        "ttft_p50": s["ttft_p50_ms"],
        "ttft_p99": s["ttft_p99_ms"],
        "itl_p50": s["itl_p50_ms"],
        "tpot_p50": s["tpot_p50_ms"],
        "sends": "max_tokens 64, ignore_eos, stream, include_usage",
    }


def run_guidellm(base: str, rate: float, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    report = out / f"guidellm_{rate:g}.json"
    argv = [str(CLIENTS_BIN / "guidellm"), "run", "--disable-progress"]
    argv += ["--backend", f"kind=openai_http,target={base},model={MODEL}"]
    argv[-1] += ",request_format=/v1/completions"  # its start-up check (GET /health) stays on
    argv += ["--profile", f"kind=constant,rate={rate}"]
    argv += ["--constraint", f"kind=max_duration,seconds={args.seconds}"]
    argv += ["--tokenizer", f"kind=huggingface_auto,model={args.tokenizer}"]
    argv += ["--data", f"kind=synthetic_text,prompt_tokens={TOKENS},output_tokens={TOKENS}"]
    argv += ["--output", f"kind=json,path={report}"]
    _run(argv, out / f"guidellm_{rate:g}.log", {**os.environ, **OFFLINE})
    bench = json.loads(report.read_text())["benchmarks"][0]
    m = bench["metrics"]

    def ok(name: str, field: str = "median") -> float:
        stats = m[name]["successful"]
        return float(stats[field] if field in stats else stats["percentiles"][field])

    return {
        "tokens_s": ok("output_tokens_per_second", "mean"),
        "served": int(m["request_totals"]["successful"]),
        "errors": int(m["request_totals"]["errored"]),
        "ttft_p50": ok("time_to_first_token_ms", "p50"),
        "ttft_p99": ok("time_to_first_token_ms", "p99"),
        "itl_p50": math.nan,  # it has no gap-between-tokens distribution (see the docstring)
        "tpot_p50": ok("inter_token_latency_ms", "p50"),
        "its_tpot_p50": ok("time_per_output_token_ms", "p50"),
        "sends": "max_tokens 64, ignore_eos, stop null, stream, include_usage + continuous",
    }


def run_aiperf(base: str, rate: float, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    folder = out / f"aiperf_{rate:g}"
    argv = [str(CLIENTS_BIN / "aiperf"), "profile", "--model", MODEL, "--url", base]
    argv += ["--endpoint-type", "completions", "--streaming", "--ui", "none"]
    argv += ["--tokenizer", str(args.tokenizer), "--artifact-dir", str(folder)]
    argv += ["--request-rate", str(rate), "--arrival-pattern", "constant"]
    argv += ["--isl", str(TOKENS), "--isl-stddev", "0", "--osl", str(TOKENS), "--osl-stddev", "0"]
    argv += ["--extra-inputs", "ignore_eos:true", "--benchmark-duration", str(args.seconds)]
    argv += ["--benchmark-grace-period", "60"]
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE}
    _run(argv, out / f"aiperf_{rate:g}.log", env)
    r = json.loads((folder / "profile_export_aiperf.json").read_text())
    errors = r.get("error_request_count") or {}
    return {
        "tokens_s": r["output_token_throughput"]["avg"],
        "served": int(r["request_count"]["avg"]),
        "errors": int(errors.get("avg", 0)) if isinstance(errors, dict) else 0,
        "ttft_p50": r["time_to_first_token"]["p50"],
        "ttft_p99": r["time_to_first_token"]["p99"],
        "itl_p50": r["inter_chunk_latency"]["p50"],
        "tpot_p50": r["inter_token_latency"]["p50"],
        "sends": "max_tokens 64, ignore_eos, stream, include_usage",
    }


CLIENTS: dict[str, Callable[[str, float, argparse.Namespace, Path], dict[str, Any]]] = {
    "labserve load": run_labserve,
    "guidellm": run_guidellm,
    "aiperf": run_aiperf,
}


def _run(argv: list[str], log: Path, env: Any) -> None:
    with log.open("w") as f:
        done = subprocess.run(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        raise RuntimeError(f"{argv[0]} exited {done.returncode}: see {log}")


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def one_run(
    name: str, base: str, rate: float, args: argparse.Namespace, out: Path
) -> dict[str, Any]:
    """One client at one rate, with the server's figures over the same run."""
    load_before = _loadavg()
    with StatsPoller(base, args.poll_s) as poller:
        client = CLIENTS[name](base, rate, args, out)
    server = server_figures(poller.polls, args.window_s)
    row = {"client": name, "rate": rate, "load_before": load_before, "load_after": _loadavg()}
    sys.stderr.write(f"{name} at {rate:g} req/s: {client} / server {server}\n")
    return {**row, "client_figures": client, "server_figures": server}


def _ratio(row: dict[str, Any], key: str) -> float:
    c, s = row["client_figures"].get(key, math.nan), row["server_figures"].get(key, math.nan)
    return c / s if s else math.nan


def _cell(row: dict[str, Any], key: str) -> str:
    c, s = row["client_figures"].get(key, math.nan), row["server_figures"].get(key, math.nan)
    ratio = _ratio(row, key)
    verdict = ""
    if key in TARGETS and not math.isnan(ratio):
        verdict = " ok" if abs(ratio - 1) <= TARGETS[key] else " MISS"
    return f"{c:.2f} / {s:.2f} ({ratio:.3f}{verdict})"


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        "\nclient / server (client / server ratio; target: tokens/s within 5%, "
        "ITL and TPOT p50 within 15%); ms except tokens/s\n"
    )
    print(
        "| client | rate | served | errors | output tokens/s | TTFT p50 | TTFT p99 "
        "| ITL p50 | TPOT p50 | load avg |"
    )
    print("|---|---:|---:|---:|---|---|---|---|---|---|")
    for row in rows:
        c = row["client_figures"]
        cells = [_cell(row, k) for k in ("tokens_s", "ttft_p50", "ttft_p99", "itl_p50", "tpot_p50")]
        print(
            f"| {row['client']} | {row['rate']:g} | {c['served']} | {c['errors']} | "
            f"{' | '.join(cells)} | {row['load_before']} |"
        )
    for row in rows:
        if "its_tpot_p50" in row["client_figures"]:
            print(
                f"\n{row['client']} at {row['rate']:g} req/s: its own time_per_output_token p50 "
                f"(e2e / tokens) {row['client_figures']['its_tpot_p50']:.2f} ms"
            )


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="4,12", help="req/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=30.0, help="each client's run")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated")
    parser.add_argument("--poll-s", type=float, default=0.2, help="/stats every this")
    parser.add_argument("--window-s", type=float, default=10.0, help="the server's window")
    parser.add_argument("--out", help="logs and reports here (default: a temporary folder)")
    parser.add_argument("--json", help="write every run's figures here")
    return parser.parse_args()


def main() -> None:
    args = _parse()
    names = [n.strip() for n in args.clients.split(",")]
    missing = [n for n in ("guidellm", "aiperf") if n in names and not (CLIENTS_BIN / n).exists()]
    if missing:
        raise SystemExit(
            f"{', '.join(missing)} not in {CLIENTS_BIN}: make -C benchmarks clients-venv"
        )
    out = Path(args.out or tempfile.mkdtemp(prefix="labserve-clients-"))
    out.mkdir(parents=True, exist_ok=True)
    args.tokenizer = out / "tinylm-bytes-tokenizer"
    builder = [str(CLIENTS_BIN / "python"), str(HERE / "byte_tokenizer.py"), str(args.tokenizer)]
    _run(builder, out / "tokenizer.log", {**os.environ, **OFFLINE})
    rows = []
    with tinylm_server() as base:
        for rate in (float(r) for r in args.rates.split(",")):
            for name in names:
                time.sleep(args.window_s + 1)  # the server's window: this run's sequences alone
                rows.append(one_run(name, base, rate, args, out))
    print_table(rows)
    print(f"\nlogs and reports: {out}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "runs": rows}, indent=1, default=str)
        )


if __name__ == "__main__":
    main()
