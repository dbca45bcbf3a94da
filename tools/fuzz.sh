#!/usr/bin/env bash
# Builds moesim's libFuzzer targets (clang, ASan + UBSan) and runs each on a seed corpus made from the
# repository's own files: specs, platforms, CSV traces, a SmartMoE log, a results database and
# binary traces.
#
#   bash tools/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]     (default 300 s, every target)
#
# Targets: spec platform csv logs results_db trace_reader. Findings (a crash, a leak, a timeout, an
# internal error on bad input) stop that target and leave its input as build-fuzz/crash-*. Each
# target's last line (runs, coverage) and a summary go to stdout. Needs clang; the corpora for the
# results database and the binary traces are made with build/moesim when it is built.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(spec platform csv logs results_db trace_reader)

cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESIM_FUZZ=ON \
  -DMOESIM_WITH_CUDA=OFF -DMOESIM_WITH_MPI=OFF >/dev/null  # the instrumented build is host code only
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/%/_fuzz}" >/dev/null

seeds=build-fuzz/seeds
rm -rf "$seeds" && mkdir -p "$seeds"/{spec,platform,csv,logs,results_db,trace_reader}
grep -rl 'proto-message: moesim.spec.ExperimentSpec' experiments --include='*.textproto' | xargs -I{} cp {} "$seeds/spec/"
cp platforms/*.textproto "$seeds/platform/"
find experiments tests -name '*.csv' -size -64k -exec cp {} "$seeds/csv/" \; 2>/dev/null || true
printf '# moe-gating-trace v1\n# model: top_k=2, num_experts=4\niter,layer,src,e0,e1,e2,e3\n0,0,0,1,2,0,1\n1,0,0,2,1,1,0\n' >"$seeds/csv/small.csv"
printf '0:[[1,2,0,1],[0,1,2,1]]\n1:[[2,2,0,0],[1,1,1,1]]\n' >"$seeds/logs/table_iter0_rank0.log"
if [ -x build/moesim ]; then
  work=$(mktemp -d)
  printf 'name: "seed"\nbase: "%s/experiments/gpt-moe-s.textproto"\nset: "cluster.nodes=2" set: "model.layers=1" set: "model.experts=16" set: "iterations=1"\naxis { field: "seed" values: ["1", "2"] }\n' "$PWD" >"$work/s.textproto"
  build/moesim sweep "$work/s.textproto" -q --jobs 1 --db "$seeds/results_db/seed.db" >/dev/null
  rm -f "$seeds"/results_db/*-wal "$seeds"/results_db/*-shm
  build/moesim trace gen -q --out "$seeds/trace_reader/seed.trace" --experts 8 --sources 3 --layers 2 --iterations 3 --tokens 64 >/dev/null
  rm -rf "$work"
fi

status=0
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t"
  log="build-fuzz/$t.log"
  if (cd build-fuzz && "./${t}_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 \
        "corpus/$t" "seeds/$t") >"$log" 2>&1; then
    verdict=ok
  else
    verdict="FINDING (see $log)"
    status=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  printf '%-14s %5s s  %10s runs  %s\n' "$t" "$seconds" "$runs" "$verdict"
done
exit $status
