"""labserve's batched HFDecoder against `transformers serve --continuous-batching` (issue 32).

One model folder per model (``hf_folder.build``: issue 32's GPT-2 and a Llama with
grouped-query attention, seeded, offline), served by both servers from the same folder
(both started once per model and thread setting; each idles while the other is loaded),
driven in turn by the same load generator (``labserve load URL/v1/completions``,
64-byte = 64-token prompts, 64 output tokens, streamed): closed loops of 1, 2, 4, 8, 16 and
32 concurrent streams, then Poisson arrivals at 50% and 80% of the peer's capacity (its
tokens/s at 32 streams over 64, from round 1, where the peer runs first; the same rates in
every round). The servers alternate: round 1 peer then labserve, round 2 labserve then
peer, ...

Two thread settings, both recorded (``--threads``): ``default`` starts each server as it
sets itself (labserve's ``HFDecoder`` sets torch to one thread; `transformers serve` leaves
torch's default, one thread per core) and ``one`` sets ``OMP_NUM_THREADS=1`` for both (the
fair fight). The peer runs on ``--device cpu`` with its default ``--cb-*`` settings but one,
``--cb-num-blocks 128`` (``PEER_CB_SETTINGS`` says why); its ``/v1/completions`` refuses
``ignore_eos`` (a 422 for an unknown field), so it is left out there: neither model has an
end token and each reply's ``usage.completion_tokens`` is checked to be 64. labserve serves
``hf_folder:FolderLM`` with ``max_num_seqs`` 32 (HFDecoder's default is 16: 32 streams would
queue half).

Per point: output tokens/s, TTFT and ITL percentiles (the load generator's), and the
server's CPU seconds per output token (from /proc, its process and its children: the peer
runs its model in a child process). The machine is shared: the load
average is kept per point. Needs the peer's venv: ``make -C benchmarks tfserve-venv``.

    .venv/bin/python benchmarks/generation/vs_transformers.py --models gpt2,llama \\
        --threads default,one --rounds 3 --json benchmarks/generation/vs_transformers.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PEER = ROOT / "benchmarks" / ".venv-tfserve" / "bin" / "transformers"
PYTHON = sys.executable
CONCURRENCY = (1, 2, 4, 8, 16, 32)
POISSON_SHARES = (0.5, 0.8)
WHICH = ("peer", "labserve")
PROMPT, OUTPUT = 64, 64
LABSERVE_SETTINGS = {"max_num_seqs": 32, "max_num_batched_tokens": 2048}
"""labserve's generation settings: ``max_num_seqs`` 32 so that 32 streams run together,
the token budget at labserve's default (2,048: a step takes every waiting 64-token prompt)."""
PEER_CB_SETTINGS = {"num_blocks": 128}
"""The peer's one ``--cb-*`` flag: 128 blocks of 256 tokens (32,768 tokens; 32 streams of
128 need 4,096). Its default sizes the cache from the memory left on the device, which on
CPU is 80-90% of the machine's free RAM: 13.8 GB resident for this 4-layer model on a 23 GB
machine shared by five engineers, until the kernel's OOM killer ended it (2026-12-04
15:44 UTC). Everything else at its default (``max_batch_tokens`` 8,192, page size 256)."""
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and of every process under it.

    `transformers serve` runs its model in a child process (its engine, spawned by
    multiprocessing): the server's own process alone shows a tenth of the work.
    """
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parents[int(entry.name)] = int(_stat(int(entry.name))[1])
    tree, total = [pid], 0.0
    while tree:
        p = tree.pop()
        with contextlib.suppress(OSError, IndexError):
            fields = _stat(p)
            total += (int(fields[11]) + int(fields[12])) / TICK
        tree += [child for child, parent in parents.items() if parent == p]
    return total


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 600.0) -> None:
    """Poll ``url`` until it answers 200 (or the server exits, or the time runs out)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before it was ready")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


def server_env(threads: str, folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env |= {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "LABSERVE_HF_FOLDER": str(folder)}
    if threads == "one":
        env["OMP_NUM_THREADS"] = "1"
    return env


@contextlib.contextmanager
def serving(which: str, folder: Path, threads: str, log: Path) -> Iterator[dict[str, Any]]:
    """Start ``which`` (labserve or peer) on ``folder``; yield its URL, model name and pid."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = server_env(threads, folder)
    if which == "labserve":
        config = Path(tempfile.mkdtemp()) / "labserve.yaml"
        lines = [f"      {k}: {v}" for k, v in LABSERVE_SETTINGS.items()]
        config.write_text("runners:\n  folderlm:\n    generation:\n" + "\n".join(lines) + "\n")
        argv = [PYTHON, "-m", "labserve.cli", "serve", "hf_folder:FolderLM"]
        argv += ["--port", str(port), "--config", str(config)]
        ready, model = f"{base}/v1/models", None
    else:
        argv = [str(PEER), "serve", str(folder), "--continuous-batching", "--device", "cpu"]
        argv += [f"--cb-{k.replace('_', '-')}={v}" for k, v in PEER_CB_SETTINGS.items()]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
        ready, model = f"{base}/health", str(folder)
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(ready, proc)
        yield {"url": f"{base}/v1/completions", "model": model, "pid": proc.pid, "which": which}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def load(server: dict[str, Any], how: list[str], duration_s: float) -> dict[str, Any]:
    """One ``labserve load`` run against ``server``; its summary, the server's CPU, the load."""
    out = Path(tempfile.mkdtemp()) / "load.json"
    argv = [PYTHON, "-m", "labserve.cli", "load", server["url"], *how]
    argv += ["--duration", str(duration_s), "--input-len", str(PROMPT)]
    argv += ["--output-len", str(OUTPUT), "--timeout", "120", "--json", str(out)]
    if server["model"]:
        argv += ["--model", server["model"]]
    if server["which"] == "peer":
        argv.append("--no-ignore-eos")  # the peer refuses the field (422); no end token anyway
    load_avg = os.getloadavg()[0]
    c0 = cpu_s(server["pid"])
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    used = cpu_s(server["pid"]) - c0
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"labserve load failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = json.loads(out.read_text())
    summary = summary.get("summary", summary)
    tokens = summary["output_tokens"]
    if summary["served"] and tokens != OUTPUT * summary["served"]:
        raise RuntimeError(f"{tokens} output tokens for {summary['served']} replies, not 64 each")
    keep = ("served", "requests", "span_s", "output_tokens", "output_tokens_per_s")
    keep += ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms")
    fig = {k: summary.get(k) for k in keep}
    fig["outcomes"] = summary.get("outcomes")
    fig["tokens_from_usage"] = summary.get("tokens_from_usage")
    fig["server_cpu_ms_per_token"] = 1000 * used / tokens if tokens else None
    fig["load_average"] = load_avg
    return fig


def session(
    server: dict[str, Any], threads: str, args: argparse.Namespace, rates: list[float] | None
) -> tuple[dict[str, Any], list[float]]:
    """One server's points in one round; the Poisson rates (from this run when none given)."""
    figs: dict[str, Any] = {}
    which = server["which"]
    load(server, ["--concurrency", "4"], 2.0)  # warm-up after the other server's turn
    for c in args.concurrency:
        figs[f"c{c}"] = load(server, ["--concurrency", str(c)], args.duration)
        print(which, threads, f"c{c}", _short(figs[f"c{c}"]), flush=True)
    if rates is None:
        capacity = figs["c32"]["output_tokens_per_s"] / OUTPUT
        rates = [share * capacity for share in POISSON_SHARES]
    for share, rate in zip(POISSON_SHARES, rates, strict=True):
        how = ["--rate", f"{rate:.3f}", "--arrivals", "poisson"]
        key = f"poisson{int(share * 100)}"
        figs[key] = load(server, how, args.poisson_duration) | {"rate": rate}
        print(which, threads, key, f"{rate:.2f} req/s", _short(figs[key]), flush=True)
    return figs, rates


def _short(fig: dict[str, Any]) -> str:
    return (
        f"{fig['output_tokens_per_s']:.0f} tok/s, TTFT p50/p99 {fig['ttft_p50_ms']:.1f}/"
        f"{fig['ttft_p99_ms']:.1f} ms, ITL p50 {fig['itl_p50_ms']:.2f} ms, "
        f"CPU {fig['server_cpu_ms_per_token']:.3f} ms/token, load {fig['load_average']:.1f}"
    )


def run_setting(model: str, threads: str, args: argparse.Namespace) -> dict[str, Any]:
    """Alternating rounds of both servers on ``model`` with ``threads``; rounds and medians.

    Both servers are started once and stay up (each idles at under 1% of a core while the
    other is loaded: measured on the peer); the load alternates between them.
    """
    from hf_folder import build

    folder = args.folders / model
    if not (folder / "config.json").exists():
        build(model, folder)
    rounds: list[dict[str, Any]] = []
    rates: list[float] | None = None
    with contextlib.ExitStack() as stack:
        servers = {w: stack.enter_context(serving(w, folder, threads, args.log)) for w in WHICH}
        for r in range(args.rounds):
            order = ("peer", "labserve") if r % 2 == 0 else ("labserve", "peer")
            this: dict[str, Any] = {"order": order, "load_average": os.getloadavg()[0]}
            for which in order:
                this[which], rates = session(servers[which], threads, args, rates)
            rounds.append(this)
    return {"rates": rates, "rounds": rounds, "medians": medians(rounds)}


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per point and figure, the median over rounds of each server and labserve / peer."""
    out: dict[str, Any] = {}
    figures = ("output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms")
    for point in rounds[0]["peer"]:
        row: dict[str, Any] = {}
        for fig in (*figures, "server_cpu_ms_per_token"):
            for which in ("labserve", "peer"):
                row[f"{which}_{fig}"] = statistics.median(rd[which][point][fig] for rd in rounds)
            row[f"ratio_{fig}"] = row[f"labserve_{fig}"] / row[f"peer_{fig}"]
        out[point] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--threads", default="default,one", help="default, one, or both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    parser.add_argument("--duration", type=float, default=8.0, help="s per closed-loop point")
    parser.add_argument("--poisson-duration", type=float, default=12.0, help="s per rate")
    parser.add_argument("--folders", type=Path, default=Path(tempfile.gettempdir()) / "vs_tf")
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "vs_tf.log")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if 32 not in args.concurrency:
        parser.error("--concurrency must include 32 (the peer's capacity is its 32-stream rate)")
    if not PEER.exists():
        parser.error(f"no {PEER}: make -C benchmarks tfserve-venv")
    sys.path.insert(0, str(HERE))
    record: dict[str, Any] = {"command": " ".join(sys.argv), "commit": _commit(), "runs": {}}
    record["labserve_settings"] = LABSERVE_SETTINGS
    record["peer_cb_settings"] = PEER_CB_SETTINGS
    for model in args.models.split(","):
        for threads in args.threads.split(","):
            print(f"== {model}, threads {threads}, load {os.getloadavg()}", flush=True)
            record["runs"][f"{model}/{threads}"] = run_setting(model, threads, args)
            if args.json:
                args.json.write_text(json.dumps(record, indent=1) + "\n")
            _print_table(record["runs"][f"{model}/{threads}"]["medians"])


def _print_table(meds: dict[str, Any]) -> None:
    print("| point | labserve tok/s | peer tok/s | ratio | TTFT p99 l / p | ITL p50 l / p |")
    for point, row in meds.items():
        print(
            f"| {point} | {row['labserve_output_tokens_per_s']:.0f} |"
            f" {row['peer_output_tokens_per_s']:.0f} | {row['ratio_output_tokens_per_s']:.2f}x |"
            f" {row['labserve_ttft_p99_ms']:.1f} / {row['peer_ttft_p99_ms']:.1f} |"
            f" {row['labserve_itl_p50_ms']:.2f} / {row['peer_itl_p50_ms']:.2f} |",
            flush=True,
        )


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip()


if __name__ == "__main__":
    main()
