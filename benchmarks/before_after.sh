#!/bin/sh
# Issue 10's regression check: batching_bench.py at 8000 req/s in two trees, alternating,
# REPEATS runs each, each tree's own harness importing its own labserve (PYTHONPATH), with one
# python (PYTHON, default this worktree's .venv). Prints one table row per run and system.
# SYSTEMS (default labserve-adaptive,labserve-greedy) and ARGS (default --overhead-waves 200;
# e.g. "--overhead-waves 0 --on-overload reject" for issue 24's refusals) pass to the harness;
# RATES (default 8000) the offered rates, e.g. 1000,2000,4000,6000 for the in-process table.
# Usage: benchmarks/before_after.sh /work/wt-base /work/wt-i10 [REPEATS]
set -eu
BEFORE=$1
AFTER=$2
REPEATS=${3:-3}
PYTHON=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
SYSTEMS=${SYSTEMS:-labserve-adaptive,labserve-greedy}
ARGS=${ARGS:---overhead-waves 200}
RATES=${RATES:-8000}
OUT=$(mktemp -d)
echo "| tree | run | load | system | served req/s | p99 ms | rejected % | refused callers p99 ms | shed after admission | refused at admission p99 ms | launch lag p99 ms |"
echo "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"
i=1
while [ "$i" -le "$REPEATS" ]; do
  for side in before after; do
    if [ "$side" = before ]; then tree=$BEFORE; else tree=$AFTER; fi
    load=$(cut -d' ' -f1 /proc/loadavg)
    # shellcheck disable=SC2086  # ARGS is a list of options
    (cd "$tree" && PYTHONPATH="$tree" "$PYTHON" benchmarks/batching_bench.py \
      --systems "$SYSTEMS" --rates "$RATES" $ARGS \
      --json "$OUT/$side-$i.json" >/dev/null 2>"$OUT/$side-$i.err")
    "$PYTHON" - "$OUT/$side-$i.json" "$side" "$i" "$load" <<'PY'
import json, sys
path, side, run, load = sys.argv[1:]
for result in json.load(open(path))["results"]:
    for row in result.get("rates", []):
        late = row.get("rejected_at_deadline")
        shed = (late or 0) + (row.get("refused_at_admission") or 0)
        share = f"{late} ({100 * late / shed:.1f}%)" if late is not None and shed else "-"
        print(f"| {side} | {run} | {load} | {result['system']} | {row.get('served_rps')} "
              f"| {row.get('p99_ms')} | {row.get('rejected_pct')} "
              f"| {row.get('refused_call_to_refusal_p99_ms')} | {share} "
              f"| {row.get('refused_at_admission_p99_ms')} | {row.get('launch_lag_p99_ms')} |")
    overhead = result.get("overhead")
    if overhead:
        print(f"| {side} | {run} | {load} | {result['system']} | overhead: "
              f"{overhead['us_per_request']} µs per request (no-op model) | | | | | | |")
PY
  done
  i=$((i + 1))
done
echo "JSON and stderr in $OUT"
