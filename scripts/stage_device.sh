#!/usr/bin/env bash
# Builds here and stages stripped binaries (+ libbenchmark) for the GPU machine, which has no CLI11,
# as one gzipped tarball .carry/punica-bin.tgz (git-ignored; the device tool carries 64 MiB at most
# and the stripped binaries alone are larger): pass carry [".carry"] to the device tool and run
# scripts/device_check.sh there, which unpacks it. The git sha is stamped at build time.
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
tar -C .carry -czf .carry/punica-bin.tgz bin lib && rm -rf .carry/bin .carry/lib
du -sh .carry
