#!/bin/sh
# Issue 10's regression check: batching_bench.py at 8000 req/s in two trees, alternating,
# REPEATS runs each, each tree's own harness importing its own labserve (PYTHONPATH), with one
# python (PYTHON, default this worktree's .venv). Prints served req/s and p99 per run.
# Usage: benchmarks/before_after.sh /work/wt-base /work/wt-i10 [REPEATS]
set -eu
BEFORE=$1
AFTER=$2
REPEATS=${3:-3}
PYTHON=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
OUT=$(mktemp -d)
i=1
while [ "$i" -le "$REPEATS" ]; do
  for side in before after; do
    if [ "$side" = before ]; then tree=$BEFORE; else tree=$AFTER; fi
    load=$(cut -d' ' -f1 /proc/loadavg)
    (cd "$tree" && PYTHONPATH="$tree" "$PYTHON" benchmarks/batching_bench.py \
      --systems labserve-adaptive,labserve-greedy --rates 8000 --overhead-waves 200 \
      --json "$OUT/$side-$i.json" >/dev/null 2>"$OUT/$side-$i.err")
    "$PYTHON" - "$OUT/$side-$i.json" "$side" "$i" "$load" <<'PY'
import json, sys
path, side, run, load = sys.argv[1:]
for result in json.load(open(path))["results"]:
    for row in result.get("rates", []):
        print(f"| {side} | {run} | {load} | {result['system']} | {row.get('served_rps')} "
              f"| {row.get('p99_ms')} | {row.get('rejected_pct')} |")
PY
  done
  i=$((i + 1))
done
echo "JSON and stderr in $OUT"
