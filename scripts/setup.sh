#!/usr/bin/env bash
# Installs every package punica-bench needs (idempotent, non-interactive; only what is missing),
# then configures and builds into ./build (Release, CUDA arch 90a, Ninja). Safe to run again:
# a configured build directory is reused and only rebuilt where sources changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(cmake g++ ninja-build libopenmpi-dev openmpi-bin libcli11-dev nlohmann-json3-dev libeigen3-dev
      libbenchmark-dev libgtest-dev python3 python3-matplotlib)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: the CUDA toolkit (nvcc, cuBLAS, NCCL) is required under /usr/local/cuda or on PATH" >&2
  exit 4
fi
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${PUNICA_CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
