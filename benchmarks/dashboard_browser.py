"""The dashboard in real Chromium: staleness of the newest data on screen, and renderer CPU.

    .venv/bin/python benchmarks/dashboard_browser.py [--rate 2500] [--seconds 20] [--hz 5]

Starts JupyterLab on a temporary notebook (the browser test's: a served sleep model, then a
Dashboard), Run All in Chromium (Playwright, /usr/bin/chromium), starts the load from the
page, then for each CPU throttle rate (DevTools Emulation.setCPUThrottlingRate; --throttles,
default 1 and 4) samples once a second how old the newest row on the page is (now minus its
clock_s), and reads the renderer's main-thread busy time (Performance.getMetrics
TaskDuration, with its script, style and layout parts) and the main thread's CPU time (/proc)
over the period. Prints one Markdown row per throttle rate. ``--profile S``: first, a CPU
profile of the renderer (DevTools Profiler) over S seconds at 1x, printed as the functions
with the most self time and the callers of the hottest.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import pathlib
import statistics
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "browser_test", HERE.parent / "tests" / "browser" / "test_dashboard_browser.py"
)
assert _spec is not None and _spec.loader is not None
bt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bt)


_METRICS = ("TaskDuration", "ScriptDuration", "RecalcStyleDuration", "LayoutDuration")


def busy_s(cdp) -> dict[str, float]:
    """The renderer main thread's busy seconds so far: all tasks, and script, style, layout."""
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    return {name: float(metrics[name]) for name in _METRICS}


def profile(cdp, seconds: float, top: int = 25, depth: int = 9) -> None:
    """Self time per function (name, script, line) over ``seconds``, most first."""
    cdp.send("Profiler.enable")
    cdp.send("Profiler.setSamplingInterval", {"interval": 200})
    cdp.send("Profiler.start")
    time.sleep(seconds)
    prof = cdp.send("Profiler.stop")["profile"]
    nodes = {n["id"]: n for n in prof["nodes"]}
    dt = collections.Counter()
    for node_id, delta in zip(prof["samples"], prof["timeDeltas"], strict=True):
        dt[node_id] += delta
    by_fn: collections.Counter[str] = collections.Counter()
    for node_id, us in dt.items():
        f = nodes[node_id]["callFrame"]
        url = f["url"].rsplit("/", 1)[-1][:30]
        by_fn[f"{f['functionName'] or '(anon)'} {url}:{f['lineNumber']}"] += us
    total = sum(by_fn.values())
    print(f"CPU profile, {seconds:g} s: {total / 1e6 / seconds:.0%} of a core sampled")
    for name, us in by_fn.most_common(top):
        print(f"{100 * us / total:5.1f}%  {name}")
    # Where the hottest native calls come from: their callers, `depth` frames up.
    parent = {c: n["id"] for n in prof["nodes"] for c in n.get("children", [])}

    def frame(node_id: int) -> str:
        f = nodes[node_id]["callFrame"]
        return f"{f['functionName'] or '(anon)'}:{f['lineNumber']}:{f['columnNumber']}"

    wanted = os.environ.get("PROFILE_CALLERS", "").split(",")
    for hot, _ in by_fn.most_common(top):
        if hot.startswith("(") or not (
            hot in dict(by_fn.most_common(4)) or hot.split(" ")[0] in wanted
        ):
            continue
        paths: collections.Counter[str] = collections.Counter()
        for node_id, us in dt.items():
            f = nodes[node_id]["callFrame"]
            url = f["url"].rsplit("/", 1)[-1][:30]
            if f"{f['functionName'] or '(anon)'} {url}:{f['lineNumber']}" != hot:
                continue
            chain, up = [], parent.get(node_id)
            while up is not None and len(chain) < depth:
                chain.append(frame(up))
                up = parent.get(up)
            paths[" < ".join(chain)] += us
        print(f"callers of {hot}:")
        for path, us in paths.most_common(8):
            print(f"   {100 * us / total:5.1f}%  {path}")


def renderer_cpu_s() -> dict[int, float]:
    """CPU seconds (user + system) of each Chromium renderer's main thread, by pid (Linux).

    Unlike TaskDuration (wall time of the main thread's tasks), this does not grow when the
    machine is busy and the renderer waits for a core.
    """
    out: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for proc in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            if b"--type=renderer" not in (proc / "cmdline").read_bytes():
                continue
            fields = (proc / "task" / proc.name / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(proc.name)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=2500)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--hz", type=float, default=5.0)
    parser.add_argument("--profile", type=float, default=0.0, metavar="S")
    parser.add_argument("--throttles", default="1,4", help="CPU throttle rates, comma-separated")
    args = parser.parse_args()
    cells = list(bt.NOTEBOOK_CELLS)
    cells[2] = f"dash = Dashboard(server, example=np.ones((1, 4)), hz={args.hz})\ndash"
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder, bt.run_lab(pathlib.Path(folder), cells) as lab:
        with sync_playwright() as pw:
            browser, page, _server, _console = bt.open_dashboard(pw, lab)
            try:
                bt.start_load(page, args.rate)
                page.locator("canvas").first.wait_for()
                time.sleep(5)  # rows streaming
                cdp = page.context.new_cdp_session(page)
                cdp.send("Performance.enable")
                if args.profile:
                    profile(cdp, args.profile)
                print(
                    f"rate {args.rate} req/s, {args.hz:g} Hz, {args.seconds:g} s per row, "
                    f"load average {os.getloadavg()[0]:.1f}"
                )
                print(
                    "| CPU throttle | staleness median (s) | p90 | last | renderer main "
                    "thread busy (TaskDuration, % of a core, unthrottled-equivalent) | "
                    "main thread CPU time (/proc) |"
                )
                print("|---:|---:|---:|---:|---:|---:|")
                for rate in (int(r) for r in args.throttles.split(",")):
                    cdp.send("Emulation.setCPUThrottlingRate", {"rate": rate})
                    time.sleep(3)  # settle
                    busy0, cpu0, t0 = busy_s(cdp), renderer_cpu_s(), time.monotonic()
                    samples = bt.measure_staleness(page, args.seconds)
                    busy1, cpu1, span = busy_s(cdp), renderer_cpu_s(), time.monotonic() - t0
                    # The page's renderer: the one whose main thread worked the most.
                    cpu = max((cpu1[p] - cpu0.get(p, 0.0) for p in cpu1), default=0.0) / span
                    share = {k: (busy1[k] - busy0[k]) / span for k in _METRICS}
                    busy = share["TaskDuration"]
                    if samples:
                        q = statistics.quantiles(samples, n=10) if len(samples) > 2 else samples
                        ages = f"{statistics.median(samples):.2f} | {q[-1]:.2f} | {samples[-1]:.2f}"
                    else:  # a version without clock_s in its rows
                        ages = "n/a | n/a | n/a"
                    parts = ", ".join(
                        f"{k.removesuffix('Duration').lower()} {100 * share[k]:.0f}%"
                        for k in _METRICS[1:]
                    )
                    print(
                        f"| {rate}x | {ages} | {100 * busy / rate:.0f}% "
                        f"({100 * busy:.0f}% throttled: {parts}) | {100 * cpu:.0f}% |"
                    )
            finally:
                browser.close()


if __name__ == "__main__":
    main()
