#!/usr/bin/env bash
# A/B of kernel variants on the GPU machine: builds test binaries at several git refs (each ref in its
# own worktree and build folder under AB_DIR) and ships them, stripped, as .carry/ab-bin.txz with
# scripts/lab/ab_device.sh's input. The refs' names become the binaries' suffixes.
#   scripts/lab/stage_ab.sh TARGET[,TARGET...] NAME=REF [NAME=REF...]        e.g.
#   scripts/lab/stage_ab.sh lora_expand_test,add_lora_linear_test main=HEAD bulk=exp/expand-bulk
# then on the GPU machine (carry [".carry"]):
#   scripts/lab/ab_device.sh OUTDIR TARGET 'GTEST_FILTER' REPS main bulk
# (a bench A/B of punica-bench binaries: scripts/lab/ab_bench_device.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGETS=${1:?usage: stage_ab.sh TARGET[,TARGET...] NAME=REF [NAME=REF...]}
shift
[ $# -ge 1 ] || { echo "stage_ab.sh: give at least one NAME=REF" >&2; exit 2; }
AB_DIR=${AB_DIR:-$(pwd)/../ab-worktrees}
mkdir -p "$AB_DIR"
rm -rf .carry/ab && mkdir -p .carry/ab/bin
for spec in "$@"; do
  name=${spec%%=*}; ref=${spec#*=}
  [[ "$name" =~ ^[A-Za-z0-9_-]+$ && "$name" != "$spec" ]] || { echo "stage_ab.sh: '$spec' is not NAME=REF" >&2; exit 2; }
  sha=$(git rev-parse --verify "$ref^{commit}") || { echo "stage_ab.sh: unknown ref '$ref'" >&2; exit 2; }
  wt=$AB_DIR/$name
  if [ -d "$wt/.git" ] || [ -f "$wt/.git" ]; then git -C "$wt" checkout -q --detach "$sha"
  else git worktree add -q --detach "$wt" "$sha"; fi
  cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPUNICA_BENCH_TESTS=ON > /dev/null
  for TARGET in ${TARGETS//,/ }; do
    cmake --build "$wt/build" --target "$TARGET" -j "$(nproc)"
    bin=$(find "$wt/build" -name "$TARGET" -type f -executable | head -1)
    [ -n "$bin" ] || { echo "stage_ab.sh: $TARGET not built at $ref" >&2; exit 1; }
    cp "$bin" ".carry/ab/bin/${TARGET}_$name"
  done
  echo "$name $sha" >> .carry/ab/refs.txt
done
strip .carry/ab/bin/* || true
XZ_OPT=${XZ_OPT:--9 -T0} tar -C .carry/ab -cJf .carry/ab-bin.txz bin refs.txt && rm -rf .carry/ab
du -sh .carry/ab-bin.txz
