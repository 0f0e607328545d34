"""The dashboard in real Chromium: staleness of the newest data on screen, and renderer CPU.

    .venv/bin/python benchmarks/dashboard_browser.py [--rate 2500] [--seconds 20] [--hz 5]
    .venv/bin/python benchmarks/dashboard_browser.py --alternate DIR [--rounds 3]

Starts JupyterLab on a temporary notebook (the browser test's: a served sleep model, then a
Dashboard), Run All in Chromium (Playwright, /usr/bin/chromium), starts the load from the
page, then for each CPU throttle rate (DevTools Emulation.setCPUThrottlingRate; --throttles,
default 1 and 4) samples once a second how old the newest row on the page is (now minus its
clock_s), and reads the renderer's main-thread busy time (Performance.getMetrics
TaskDuration, with its script, style and layout parts) and the main thread's CPU time (/proc)
over the period, and how many chart updates per second the page applied: streams into the
ticks source that brought a newer row (a hook on the source in the page; merged updates count
once). Prints one Markdown row per throttle rate. ``--profile S``: first, a CPU
profile of the renderer (DevTools Profiler) over S seconds at 1x, printed as the functions
with the most self time and the callers of the hottest.

``--tree DIR``: the kernel imports ``labserve`` and ``labserve.widgets`` from the checkout
DIR instead of this one (same venv: a ``sitecustomize`` on ``PYTHONPATH`` re-points the
editable install). ``--alternate DIR``: ``--rounds`` times, DIR ("before") then this checkout
("after"), each with its own JupyterLab, in one invocation.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import math
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


def profile(cdp, seconds: float, top: int = 25) -> None:
    """Self time per function (name, script, line) over ``seconds``, most first.

    Then the same with what each calls, and the callers of the hottest (and of the functions
    named in ``PROFILE_CALLERS``, comma-separated).
    """
    cdp.send("Profiler.enable")
    cdp.send("Profiler.setSamplingInterval", {"interval": 200})
    cdp.send("Profiler.start")
    time.sleep(seconds)
    prof = cdp.send("Profiler.stop")["profile"]
    nodes = {n["id"]: n for n in prof["nodes"]}
    dt: collections.Counter[int] = collections.Counter()
    for node_id, delta in zip(prof["samples"], prof["timeDeltas"], strict=True):
        dt[node_id] += delta
    by_fn: collections.Counter[str] = collections.Counter()
    for node_id, us in dt.items():
        by_fn[_fn(nodes[node_id])] += us
    total = sum(by_fn.values())
    print(f"CPU profile, {seconds:g} s: {total / 1e6 / seconds:.0%} of a core sampled")
    for name, us in by_fn.most_common(top):
        print(f"{100 * us / total:5.1f}%  {name}")
    parent = {c: n["id"] for n in prof["nodes"] for c in n.get("children", [])}
    print("inclusive (the function and what it calls):")
    for name, us in _inclusive(nodes, parent, dt).most_common(top + 10):
        if not name.startswith("("):
            print(f"{100 * us / total:5.1f}%  {name}")
    wanted = os.environ.get("PROFILE_CALLERS", "").split(",")
    hottest = dict(by_fn.most_common(4))
    for hot, _ in by_fn.most_common(top):
        if not hot.startswith("(") and (hot in hottest or hot.split(" ")[0] in wanted):
            _print_callers(hot, nodes, parent, dt, total)


def _fn(node: dict) -> str:
    f = node["callFrame"]
    return f"{f['functionName'] or '(anon)'} {f['url'].rsplit('/', 1)[-1][:30]}:{f['lineNumber']}"


def _print_callers(
    hot: str,
    nodes: dict[int, dict],
    parent: dict[int, int],
    dt: collections.Counter[int],
    total: float,
    depth: int = 9,
) -> None:
    """Where ``hot``'s samples come from: its callers, ``depth`` frames up."""

    def frame(node_id: int) -> str:
        f = nodes[node_id]["callFrame"]
        return f"{f['functionName'] or '(anon)'}:{f['lineNumber']}:{f['columnNumber']}"

    paths: collections.Counter[str] = collections.Counter()
    for node_id, us in dt.items():
        if _fn(nodes[node_id]) != hot:
            continue
        chain, up = [], parent.get(node_id)
        while up is not None and len(chain) < depth:
            chain.append(frame(up))
            up = parent.get(up)
        paths[" < ".join(chain)] += us
    print(f"callers of {hot}:")
    for path, us in paths.most_common(8):
        print(f"   {100 * us / total:5.1f}%  {path}")


_TRACE_CATEGORIES = (
    "toplevel,blink,cc,devtools.timeline,disabled-by-default-devtools.timeline,v8,"
    "renderer.scheduler,gpu,viz,benchmark"
)


def trace(cdp, page, seconds: float, top: int = 30) -> None:
    """Self time per trace event on the renderer's main thread over ``seconds``, most first.

    Where the profile says "(program)" (native work no script called: painting, compositing,
    layout, message handling), the trace names the task.
    """
    events = _trace_events(cdp, page, seconds)
    spans = _main_thread_spans(events)
    if not spans:
        print("trace: no renderer main thread events")
        return
    busy, self_us = _self_times(spans)
    print(f"trace, {seconds:g} s: main thread in top-level events {busy / 1e6 / seconds:.0%}")
    for name, us in self_us.most_common(top):
        print(f"{100 * us / 1e6 / seconds:5.1f}%  {name}")
    # What the page loads while it should only be drawing.
    urls = collections.Counter(
        str(e.get("args", {}).get("url", "?"))[:100]
        for e in events
        if e.get("name") == "ResourceFetcher::requestResource"
    )
    for url, n in urls.most_common(5):
        print(f"requested {n / seconds:.1f}/s: {url}")


def _trace_events(cdp, page, seconds: float) -> list[dict]:
    events: list[dict] = []
    done: list[bool] = []
    cdp.on("Tracing.dataCollected", lambda e: events.extend(e["value"]))
    cdp.on("Tracing.tracingComplete", lambda _e: done.append(True))
    cdp.send("Tracing.start", {"categories": _TRACE_CATEGORIES, "transferMode": "ReportEvents"})
    time.sleep(seconds)
    cdp.send("Tracing.end")
    end = time.monotonic() + 60
    while not done and time.monotonic() < end:
        page.wait_for_timeout(200)  # Playwright delivers the session's events while it waits
    return events


def _main_thread_spans(events: list[dict]) -> list[tuple[float, float, str]]:
    """(start, end, name) of the busiest renderer main thread's events, in start order."""
    mains = {
        (e["pid"], e["tid"])
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
        and e.get("args", {}).get("name") == "CrRendererMain"
    }  # fmt: skip
    by_thread: dict[tuple[int, int], list[dict]] = collections.defaultdict(list)
    for e in events:
        if (e.get("pid"), e.get("tid")) in mains and e.get("ph") in ("X", "B", "E"):
            by_thread[(e["pid"], e["tid"])].append(e)
    if not by_thread:
        return []
    thread = max(by_thread.values(), key=lambda evs: sum(e.get("dur", 0) for e in evs))
    spans: list[tuple[float, float, str]] = []
    began: dict[str, list[float]] = collections.defaultdict(list)
    for e in sorted(thread, key=lambda e: e["ts"]):
        if e["ph"] == "X":
            spans.append((e["ts"], e["ts"] + e.get("dur", 0), e["name"]))
        elif e["ph"] == "B":
            began[e["name"]].append(e["ts"])
        elif began[e["name"]]:
            spans.append((began[e["name"]].pop(), e["ts"], e["name"]))
    return sorted(spans, key=lambda s: (s[0], -s[1]))


def _self_times(spans: list[tuple[float, float, str]]) -> tuple[float, collections.Counter[str]]:
    """Time in top-level events, and each name's self time (its time minus its children's)."""
    self_us: collections.Counter[str] = collections.Counter()
    busy = 0.0
    stack: list[list] = []  # [end, name, children's time, start]
    for start, stop, name in [*spans, (math.inf, math.inf, "")]:
        while stack and stack[-1][0] <= start:
            end, done, children, begin = stack.pop()
            self_us[done] += (end - begin) - children
            if stack:
                stack[-1][2] += end - begin
            else:
                busy += end - begin
        if name:
            stack.append([stop, name, 0.0, start])
    return busy, self_us


def _inclusive(
    nodes: dict[int, dict], parent: dict[int, int], dt: collections.Counter[int]
) -> collections.Counter[str]:
    """Each function's time with what it calls: counted once per sample it is on the stack."""
    inclusive: collections.Counter[str] = collections.Counter()
    for node_id, us in dt.items():
        seen: set[str] = set()
        up: int | None = node_id
        while up is not None:
            seen.add(_fn(nodes[up]))
            up = parent.get(up)
        for name in seen:
            inclusive[name] += us
    return inclusive


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


# Counts, in the page, the chart updates applied: each stream into a source with a clock_s
# column (the dashboard's ticks) whose newest row is newer than the last one counted. Hooked
# on the newest such source (a re-run leaves stopped ones behind); returns the count so far.
COUNT_UPDATES = """() => {
  const column = (m) => {
    const data = m.data;
    if (!data) return undefined;
    return typeof data.get === "function" ? data.get("clock_s") : data["clock_s"];
  };
  let ticks = null;
  for (const doc of (window.Bokeh && window.Bokeh.documents) || []) {
    for (const m of doc.all_models) {
      if (column(m) !== undefined) ticks = m;
    }
  }
  if (ticks !== null && !ticks._labserve_counted) {
    ticks._labserve_counted = true;
    let newest = -Infinity;
    ticks.streaming.connect(() => {
      const col = column(ticks);
      const last = col.length ? col[col.length - 1] : -Infinity;
      if (last > newest) {
        newest = last;
        window._labserve_updates = (window._labserve_updates || 0) + 1;
      }
    });
  }
  return window._labserve_updates || 0;
}"""

_SHIM = """\
# Written by benchmarks/dashboard_browser.py: labserve from LABSERVE_TREE in this venv.
import os
import sys

_tree = os.environ.get("LABSERVE_TREE")
for _name, _mod in list(sys.modules.items()):
    if _tree and _name.startswith("__editable___labserve") and hasattr(_mod, "MAPPING"):
        _mod.MAPPING.update(
            {"labserve": os.path.join(_tree, "labserve"),
             "labserve.widgets": os.path.join(_tree, "widgets")}
        )
"""


def run(args: argparse.Namespace, label: str, tree: pathlib.Path | None) -> None:
    """One JupyterLab and browser: the dashboard measured at each throttle rate."""
    cells = list(bt.NOTEBOOK_CELLS)
    cells[2] = f"dash = Dashboard(server, example=np.ones((1, 4)), hz={args.hz})\ndash"
    from playwright.sync_api import sync_playwright

    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as folder:
        if tree is not None:
            shim = pathlib.Path(folder) / "shim"
            shim.mkdir()
            (shim / "sitecustomize.py").write_text(_SHIM)
            os.environ["PYTHONPATH"] = os.pathsep.join(
                [str(shim), *filter(None, [env.get("PYTHONPATH")])]
            )
            os.environ["LABSERVE_TREE"] = str(tree)
        try:
            with bt.run_lab(pathlib.Path(folder), cells) as lab, sync_playwright() as pw:
                _measure(args, label, pw, lab)
        finally:
            os.environ.clear()
            os.environ.update(env)


def _measure(args: argparse.Namespace, label: str, pw, lab) -> None:
    browser, page, _server, _console = bt.open_dashboard(pw, lab)
    try:
        bt.start_load(page, args.rate)
        page.locator("canvas").first.wait_for()
        time.sleep(5)  # rows streaming
        bt._wait(lambda: page.evaluate(COUNT_UPDATES) > 0, "a chart update counted")
        cdp = page.context.new_cdp_session(page)
        cdp.send("Performance.enable")
        if args.profile:
            profile(cdp, args.profile)
        if args.trace:
            trace(cdp, page, args.trace)
        for rate in (int(r) for r in args.throttles.split(",")):
            cdp.send("Emulation.setCPUThrottlingRate", {"rate": rate})
            time.sleep(3)  # settle
            load = os.getloadavg()[0]
            busy0, cpu0, t0 = busy_s(cdp), renderer_cpu_s(), time.monotonic()
            updates0 = page.evaluate(COUNT_UPDATES)
            samples = bt.measure_staleness(page, args.seconds)
            updates1 = page.evaluate(COUNT_UPDATES)
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
                f"{k.removesuffix('Duration').lower()} {100 * share[k]:.0f}%" for k in _METRICS[1:]
            )
            print(
                f"| {label} | {rate}x | {load:.1f} | {(updates1 - updates0) / span:.2f} | {ages} "
                f"| {100 * busy / rate:.0f}% ({100 * busy:.0f}% throttled: {parts}) "
                f"| {100 * cpu:.0f}% |",
                flush=True,
            )
    finally:
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=2500)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--hz", type=float, default=5.0)
    parser.add_argument("--profile", type=float, default=0.0, metavar="S")
    parser.add_argument("--trace", type=float, default=0.0, metavar="S")
    parser.add_argument("--throttles", default="1,4", help="CPU throttle rates, comma-separated")
    parser.add_argument(
        "--tree", type=pathlib.Path, help="the kernel's labserve from this checkout"
    )
    parser.add_argument("--alternate", type=pathlib.Path, metavar="DIR",
                        help="before (DIR) and after (this checkout), alternating")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(
        f"rate {args.rate} req/s, {args.hz:g} Hz, {args.seconds:g} s per row; "
        "TaskDuration in % of a core, unthrottled-equivalent"
    )
    print(
        "| run | CPU throttle | load average | chart updates applied / s | staleness median (s) "
        "| p90 | last | renderer main thread busy (TaskDuration) | main thread CPU time (/proc) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    if args.alternate is None:
        run(args, "this" if args.tree is None else str(args.tree), args.tree)
        return
    for i in range(1, args.rounds + 1):
        run(args, f"before {i}", args.alternate.resolve())
        run(args, f"after {i}", None)


if __name__ == "__main__":
    main()
