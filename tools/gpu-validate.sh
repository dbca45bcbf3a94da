#!/usr/bin/env bash
# The simulator against one real GPU (docs/hardware.md): calibrate a profile from the expert GEMMs,
# run five one-GPU models (and the demo in BF16) on the GPU and in simulation with that profile,
# compare op class by op class, time PyTorch's yardsticks (tools/gpu_yardsticks.py) beside them and a
# copy kernel beside a GEMM (bench/overlap); then the launch-bound and routing-skew runs
# (OUT/launch). Every step has a time limit and writes its log under OUT; a failed step is reported
# and the rest still run.
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
fine_at=(--set model.d_model=2048 --set model.d_ffn=1408 --set model.experts=64 --set model.top_k=6
         --set model.heads=16 --set model.name=fine-grained)  # the fine-grained layer, tokens to set
fine=("${fine_at[@]}" --set model.tokens_per_gpu=8192)
lm=(--set model.layers=4 --set model.vocab=32000 --set model.name=lm-4-layers)
# Held out (docs/hardware.md): layers of DeepSeek-V3's and Mixtral's sizes, and the demo in BF16.
deepseek=(--set model.d_model=7168 --set model.d_ffn=2048 --set model.experts=64 --set model.top_k=8
          --set model.tokens_per_gpu=8192 --set model.heads=56 --set model.name=deepseek-v3-layer-64-experts)
mixtral=(--set model.d_model=4096 --set model.d_ffn=14336 --set model.experts=8 --set model.top_k=2
         --set model.tokens_per_gpu=8192 --set model.heads=32 --set model.name=mixtral-layer)
{ date -u; nvidia-smi; } > "$out/device.txt" 2>&1
step calibrate 150 "$M" calibrate "${S[@]}" --backend hw --out "$out/profile-demo.textproto"
step calibrate-fine 150 "$M" calibrate "${S[@]}" "${fine[@]}" --backend hw --out "$out/profile-fine.textproto"
step calibrate-bf16 150 "$M" calibrate "${S[@]}" --set model.dtype=BF16 --backend hw --out "$out/profile-demo-bf16.textproto"
for model in demo fine lm deepseek mixtral demo-bf16; do
  case $model in
    demo) sets=() ;; fine) sets=("${fine[@]}") ;; lm) sets=("${lm[@]}") ;;
    deepseek) sets=("${deepseek[@]}") ;; mixtral) sets=("${mixtral[@]}") ;; demo-bf16) sets=(--set model.dtype=BF16) ;;
  esac
  profile=$out/profile-demo.textproto
  [[ $model == demo-bf16 ]] && profile=$out/profile-demo-bf16.textproto
  step "gpu-$model" 120 "$M" run "${S[@]}" "${sets[@]}" --backend hw -q --out "$out/$model"
  step "sim-$model" 60 "$M" run "${S[@]}" "${sets[@]}" --set cluster.gpu_profile="$profile" -q \
    --out "$out/sim-$model"
  step "compare-$model" 30 "$M" compare "$out/sim-$model" "$out/$model"
done
command -v python3 > /dev/null && step yardsticks 120 python3 tools/gpu_yardsticks.py
# A copy kernel of k blocks beside a GEMM chain (bench/overlap/overlap_bench.cu): what a
# communication kernel that holds SMs takes from compute, and what compute takes from it.
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
step overlap-build 180 "$nvcc" -O2 -std=c++17 -arch=native bench/overlap/overlap_bench.cu -lcublas -o "$out/overlap_bench"
[[ -x $out/overlap_bench ]] && step overlap 120 "$out/overlap_bench"
# Launch-bound and routing-skew runs (docs/hardware.md, "Launch-bound runs" and "Routing skew"),
# into OUT/launch: three calibrations (the host's launch and host sync among them), then models of
# a few-µs kernels and the demo under three routing presets, each run twice on the GPU. Simulate
# each with the middle profile by launch_us; tests/test_hw_cli.cpp does that for
# experiments/hw/*/launch and h200/skew.
mkdir -p "$out/launch"
for rep in 1 2 3; do
  step "launch/calibrate-$rep" 60 "$M" calibrate "${S[@]}" --backend hw --out "$out/launch/profile-demo-$rep.textproto"
done
twice() {  # NAME SETS...
  local name=$1; shift
  for rep in 1 2; do step "launch/gpu-$name-$rep" 90 "$M" run "${S[@]}" "$@" --backend hw -q --out "$out/launch/$name-$rep"; done
}
twice demo-128 --set model.tokens_per_gpu=128 --set model.seq_len=128
twice lm-256 "${lm[@]}" --set model.tokens_per_gpu=256 --set model.seq_len=256
twice fine-512 "${fine_at[@]}" --set model.tokens_per_gpu=512 --set model.seq_len=512
twice fine-2048 "${fine_at[@]}" --set model.tokens_per_gpu=2048 --set model.seq_len=1024
twice demo-naive
twice demo-pro-prophet --set gating.generator.preset=pro-prophet
twice demo-aux --set gating.generator.preset=aux
twice fine-naive "${fine[@]}"
twice fine-aux "${fine[@]}" --set gating.generator.preset=aux
grep -h "host:\|GPU:" "$out"/launch/profile-demo-*.textproto
tail -n +1 "$out"/compare-*.log | grep -E '^==>|iteration|compute|moe  |experts|attention|optimizer|output'
