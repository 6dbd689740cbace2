#!/usr/bin/env bash
# Builds here and stages stripped binaries (+ libbenchmark) into .carry/ (git-ignored) for the GPU
# machine, which has no CLI11: pass carry [".carry"] to the device tool and run
# scripts/device_check.sh there. The git sha is stamped into the binaries at build time.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
scripts/setup.sh >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
rm -rf .carry && mkdir -p .carry/bin .carry/lib
cp "$BUILD_DIR"/apps/punica-bench/punica-bench .carry/bin/
[ -x "$BUILD_DIR"/apps/punica-microbench/punica-microbench ] && cp "$BUILD_DIR"/apps/punica-microbench/punica-microbench .carry/bin/
find "$BUILD_DIR"/kernels -maxdepth 1 -type f -name '*_test' -executable -exec cp {} .carry/bin/ \;
strip .carry/bin/* || true
for l in $(ldd .carry/bin/* 2>/dev/null | awk '/libbenchmark/{print $3}' | sort -u); do cp -L "$l" .carry/lib/; done
du -sh .carry
