#!/usr/bin/env bash
# Launch-bound and routing-skew runs on one GPU (docs/hardware.md, "Launch-bound runs" and "Routing
# skew"): three `moesim calibrate` profiles (GEMMs, HBM, the host's launch and host sync), then
# models of a few-µs kernels and the demo under three routing presets, each run twice on the GPU.
# Simulate each run with the middle profile by launch_us (`--set cluster.gpu_profile=...`) and
# compare; tests/test_hw_cli.cpp does that for the files in experiments/hw/*/launch and h200/skew.
#   bash tools/gpu-launch-validate.sh [MOESIM] [OUT]     (default: build/moesim, gpu-launch-out)
# On a machine without moesim's libraries, run it from the bundle of shared/tools/device-bundle.sh
# (MOESIM=/tmp/moesim-device/bin/moesim, LD_LIBRARY_PATH set as device-check.sh sets it).
set -uo pipefail
M=${1:-build/moesim}
out=${2:-gpu-launch-out}
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
      --set model.heads=16 --set model.name=fine-grained)
lm=(--set model.layers=4 --set model.vocab=32000 --set model.name=lm-4-layers)
{ date -u; nvidia-smi; } > "$out/device.txt" 2>&1
for rep in 1 2 3; do
  step "calibrate-$rep" 60 "$M" calibrate "${S[@]}" --backend hw --out "$out/profile-demo-$rep.textproto"
done
run() {  # NAME SETS...: the GPU's run, twice
  local name=$1; shift
  for rep in 1 2; do step "gpu-$name-$rep" 90 "$M" run "${S[@]}" "$@" --backend hw -q --out "$out/$name-$rep"; done
}
# Launch-bound (kernels of a few µs)
run demo-128 --set model.tokens_per_gpu=128 --set model.seq_len=128
run lm-256 "${lm[@]}" --set model.tokens_per_gpu=256 --set model.seq_len=256
run fine-512 "${fine[@]}" --set model.tokens_per_gpu=512 --set model.seq_len=512
run fine-2048 "${fine[@]}" --set model.tokens_per_gpu=2048 --set model.seq_len=1024
# Routing skew (presets of less skew than naive; one GPU holds every expert)
run demo-naive
run demo-pro-prophet --set gating.generator.preset=pro-prophet
run demo-aux --set gating.generator.preset=aux
run fine-naive "${fine[@]}" --set model.tokens_per_gpu=8192
run fine-aux "${fine[@]}" --set model.tokens_per_gpu=8192 --set gating.generator.preset=aux
grep -h "host:" "$out"/profile-demo-*.textproto
