#!/usr/bin/env bash
# Trace benchmarks: importing the real 21 MB SmartMoE CSV, computing its statistics, and the
# generator's streaming rate at 1024 sources × 1024 experts × 12 layers.
#   bash bench/trace_bench.sh [BUILD_DIR]      (needs ../shared/traces next to the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/moesim
csv=../shared/traces/smartmoe-gpt-e32-k2-r16/trace.csv
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
seconds() { /usr/bin/time -f %e "$@" 2>&1 >/dev/null | tail -n 1; }
if [ -f "$csv" ]; then
  echo "import  $(du -m "$csv" | cut -f1) MB CSV: $(seconds "$bin" trace import "$csv" -o "$tmp/t.trace") s"
  echo "stats   (all records):   $(seconds "$bin" trace stats "$tmp/t.trace" --gpus 16) s"
else
  echo "skipped import/stats: $csv is absent"
fi
"$bin" trace gen -q --preset naive --experts 1024 --top-k 2 --layers 12 --sources 1024 --tokens 4096 \
  --iterations ${GEN_ITERATIONS:-10} --seed 1 -o "$tmp/gen.trace"
