#!/usr/bin/env bash
# Builds here and stages stripped binaries (+ libbenchmark) for the GPU machine, which has no CLI11,
# as one xz tarball .carry/punica-bin.txz (git-ignored; the device tool carries 64 MiB at most
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
# heuristics_test runs in CI (CPU only): not carried
find "$BUILD_DIR"/kernels -maxdepth 1 -type f -name '*_test' ! -name heuristics_test -executable -exec cp {} .carry/bin/ \;
strip .carry/bin/* || true
# the CUPTI timeline library (scripts/lab/probes/kernel_trace.cpp; built where the toolkit has CUPTI): there,
# CUDA_INJECTION64_PATH=$PWD/.carry/lib/kernel_trace.so LD_LIBRARY_PATH=$PWD/.carry/lib
[ -f "$BUILD_DIR"/kernel_trace.so ] && cp "$BUILD_DIR"/kernel_trace.so .carry/lib/
# the shared libraries the GPU machine may lack: libbenchmark (the microbench), libcupti (the tracer)
for l in $(ldd .carry/bin/* .carry/lib/*.so 2>/dev/null | awk '/libbenchmark|libcupti/{print $3}' | sort -u); do
  cp -L "$l" .carry/lib/
done
# xz -9: its 64 MiB window spans the binaries, which share most of their kernel code: 5.5 MB at
# c1d5940, against 23 MB with -6 (8 MiB window) and 31 MB with gzip (NOTES v35); the tracked working
# tree (~40 MB) travels too, 64 MiB in all. The xz takes ~1.5 min on 2 cores (one 177 MB block)
XZ_OPT=${XZ_OPT:--9 -T0} tar -C .carry -cJf .carry/punica-bin.txz bin lib && rm -rf .carry/bin .carry/lib
du -sh .carry
