#!/usr/bin/env bash
# The README's two set-up commands. On a fresh Debian 12 machine, as root:
#   bash tools/quickstart.sh demo   install what is missing, build, run the default experiment
#   bash tools/quickstart.sh test   install what is missing, build, run the whole test suite
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
case "$mode" in
  demo|test) ;;
  *) echo "usage: bash tools/quickstart.sh demo|test" >&2; exit 2 ;;
esac

# Debian packages moesim builds with (and gnuplot, which it runs for figures). The CUDA toolkit and NCCL are optional (hw/ builds its CUDA
# parts when /usr/local/cuda has them).
packages=(g++ cmake make pkg-config libsimgrid-dev libprotobuf-dev protobuf-compiler libboost-dev
          catch2 libcli11-dev libfmt-dev nlohmann-json3-dev libsqlite3-dev libmimalloc-dev
          gnuplot-nox fonts-liberation)   # figures: `moesim plot`, the demo's PNGs, the report
# The Python recorder's test trains a small model with PyTorch (Debian's, in /usr/bin/python3).
[ "$mode" = test ] && packages+=(python3-torch python3-protobuf)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "quickstart: installing ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "quickstart: run as root (or install sudo) to install ${missing[*]}" >&2; exit 2; }
    sudo=sudo
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

jobs=$(nproc)
# A unity build (each library's files compiled as a few units): a one-off build in about half the
# time; a developer's own build (without it) recompiles only the files an edit touches.
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESIM_WERROR=ON -DCMAKE_UNITY_BUILD=ON >/dev/null
cmake --build build -j"$jobs"

if [ "$mode" = demo ]; then
  ./build/moesim run --out moesim-out
else
  (cd build && ctest --output-on-failure -j"$jobs")
  # CI (and MOESIM_SANITIZE=1) runs the suite once more built with AddressSanitizer and
  # UndefinedBehaviorSanitizer (host code: the CUDA parts need nvcc, which takes no sanitizer).
  if [ "${CI:-}" = true ] || [ "${MOESIM_SANITIZE:-}" = 1 ]; then
    # -O0 without debug info: the sanitizers' checks are the same, the build half as long. UBSan
    # without its null, alignment and vptr checks, a third of the build: AddressSanitizer reports a
    # null dereference itself, x86 forgives misalignment, and moesim casts no polymorphic pointers.
    # gcc's -Wmaybe-uninitialized misfires on libstdc++ under the sanitizers; the main build keeps it.
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO= -DMOESIM_WERROR=OFF -DMOESIM_WITH_CUDA=OFF -DMOESIM_WITH_MPI=OFF -DMOESIM_MIMALLOC=OFF -DCMAKE_UNITY_BUILD=ON \
      -DCMAKE_CXX_FLAGS="-O0 -fsanitize=address,undefined -fno-sanitize=vptr,alignment,null,nonnull-attribute,returns-nonnull-attribute -fno-omit-frame-pointer -fno-sanitize-recover=undefined -Wno-maybe-uninitialized" \
      -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
    cmake --build build-asan -j"$jobs" --target moesim_tests  # and moesim, which it runs; not the bench
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j"$jobs")
  fi
fi
