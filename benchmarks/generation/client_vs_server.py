"""The load generator's TTFT and TPOT against the server's own, for the same runs.

Run from the repository root: `.venv/bin/python benchmarks/generation/client_vs_server.py`.
`labserve serve labserve.lab.demo:TinyLM` in its own process; per repeat and per load, a
client process of its own runs `labserve load`'s generation load against it for --seconds
(after waiting out the server's 10 s window, so that its percentiles hold this run's
sequences alone), and prints the client's p50 beside the server's `/stats` p50. Then the same
loads against the stand-in server (benchmarks/generation/standin_server.py: the same HTTP
route and SSE framing, a token every --standin-itl-ms, the first at once): its TTFT is
what the HTTP path and the client add to a server's own TTFT, with no model in the way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
LOADS = {
    "1 stream": {"concurrency": 1},
    "8 streams": {"concurrency": 8},
    "Poisson 4 req/s": {"rate": 4.0},
}


def client(args: argparse.Namespace) -> None:
    """One run in this process; prints the client's and the server's p50s as JSON."""
    import warnings

    from labserve.load.arrivals import PoissonArrivals
    from labserve.load.generation import generation_load_test
    from labserve.load.generation.server_view import server_percentile_ms

    warnings.simplefilter("ignore")
    load = LOADS[args.load]
    r = generation_load_test(
        args.url,
        duration_s=args.seconds,
        arrivals=PoissonArrivals(load["rate"]) if "rate" in load else None,
        concurrency=int(load["concurrency"]) if "concurrency" in load else None,
        input_len=32,
        output_len=args.output_len,
    )
    out = {"requests": len(r), "served": int(r.served.sum())}
    for metric in ("ttft", "tpot", "itl", "e2e"):
        out[f"{metric}_client"] = r.percentiles_ms(metric)["p50"]
        out[f"{metric}_server"] = server_percentile_ms(r.server, metric, "p50")
    print(json.dumps(out))


def _serve(argv: list[str], url: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=1):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{argv} did not come up")


def _run(args: argparse.Namespace, url: str, load: str) -> dict[str, float]:
    argv = [sys.executable, __file__, "--client", "--url", url, "--load", load]
    argv += ["--seconds", str(args.seconds), "--output-len", str(args.output_len)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    sys.stderr.write(f"{url} {load}: {figures}\n")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=18792)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--standin-itl-ms", type=float, default=1.0)
    parser.add_argument("--window-s", type=float, default=10.0, help="the server's window")
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--load", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client(args)
        return
    base = f"http://127.0.0.1:{args.port}"
    servers = {
        "TinyLM": [sys.executable, "-m", "labserve.cli", "serve", "labserve.lab.demo:TinyLM"],
        "stand-in": [sys.executable, str(HERE / "standin_server.py")],
    }
    extra = {
        "TinyLM": ["--port", str(args.port)],
        "stand-in": ["--port", str(args.port), "--itl-ms", str(args.standin_itl_ms)],
    }
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    for name, argv in servers.items():
        proc = _serve(argv + extra[name], base)
        try:
            for _ in range(args.repeats):
                for load in LOADS:
                    if name == "TinyLM":  # the server's window must hold this run alone
                        time.sleep(args.window_s + 1.0)
                    figures = _run(args, f"{base}/v1/completions", load)
                    runs.setdefault(name, {}).setdefault(load, []).append(figures)
        finally:
            proc.terminate()
            proc.wait(10)
    _print(runs)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))


def _print(runs: dict[str, dict[str, list[dict[str, float]]]]) -> None:
    print("| server | load | TTFT p50 client | server | TPOT p50 client | server |")
    print("|---|---|---:|---:|---:|---:|")
    for name, loads in runs.items():
        for load, figures in loads.items():
            cells = [
                " / ".join(f"{f[key]:.2f}" for f in figures)
                for key in ("ttft_client", "ttft_server", "tpot_client", "tpot_server")
            ]
            print(f"| {name} | {load} | {' | '.join(cells)} |")
    print("\nmedians of the differences (client - server), ms:")
    for name, loads in runs.items():
        for load, figures in loads.items():
            d_ttft = statistics.median(f["ttft_client"] - f["ttft_server"] for f in figures)
            d_tpot = statistics.median(f["tpot_client"] - f["tpot_server"] for f in figures)
            print(f"  {name}, {load}: TTFT {d_ttft:+.2f}, TPOT {d_tpot:+.3f}")


if __name__ == "__main__":
    main()
