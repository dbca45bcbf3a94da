#!/usr/bin/env bash
# The simulator against one real GPU (docs/hardware.md): calibrate a profile from the expert GEMMs,
# run three one-GPU models on the GPU and in simulation with that profile, compare op class by op
# class, and time PyTorch's yardsticks (tools/gpu_yardsticks.py) beside them. Every step has a time
# limit and writes its log under OUT; a failed step is reported and the rest still run.
#   bash tools/gpu-validate.sh [MOESIM] [OUT]     (default: build/moesim, gpu-validate-out)
# On a machine without moesim's libraries, run it from the bundle of shared/tools/device-bundle.sh
# (MOESIM=/tmp/moesim-device/bin/moesim, LD_LIBRARY_PATH set as device-check.sh sets it).
set -uo pipefail
M=${1:-build/moesim}
out=${2:-gpu-validate-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
step() {  # NAME LIMIT_S COMMAND...
  local name=$1 t=$2; shift 2
  echo "== $name: $*"
  local s=$SECONDS
  timeout "$t" "$@" > "$out/$name.log" 2>&1
  echo "   rc=$? in $((SECONDS - s)) s (log: $out/$name.log)"
}
S=(experiments/hw/demo-layer-1gpu.textproto --set sim.timeline_iterations=5)
fine=(--set model.d_model=2048 --set model.d_ffn=1408 --set model.experts=64 --set model.top_k=6
      --set model.tokens_per_gpu=8192 --set model.heads=16 --set model.name=fine-grained)
lm=(--set model.layers=4 --set model.vocab=32000 --set model.name=lm-4-layers)
{ date -u; nvidia-smi; } > "$out/device.txt" 2>&1
step calibrate 150 "$M" calibrate "${S[@]}" --backend hw --out "$out/profile-demo.textproto"
step calibrate-fine 150 "$M" calibrate "${S[@]}" "${fine[@]}" --backend hw --out "$out/profile-fine.textproto"
for model in demo fine lm; do
  case $model in demo) sets=() ;; fine) sets=("${fine[@]}") ;; lm) sets=("${lm[@]}") ;; esac
  step "gpu-$model" 120 "$M" run "${S[@]}" "${sets[@]}" --backend hw -q --out "$out/$model"
  step "sim-$model" 60 "$M" run "${S[@]}" "${sets[@]}" --set cluster.gpu_profile="$out/profile-demo.textproto" -q \
    --out "$out/sim-$model"
  step "compare-$model" 30 "$M" compare "$out/sim-$model" "$out/$model"
done
command -v python3 > /dev/null && step yardsticks 120 python3 tools/gpu_yardsticks.py
tail -n +1 "$out"/compare-*.log | grep -E '^==>|iteration|compute|moe  |experts|attention|optimizer|output'
