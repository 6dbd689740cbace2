# Sourced by the block-emulator checks (moe_emu_check.sh, delta_emu_check.sh): the repository root as
# the working directory, a scratch folder $W removed on exit, $CUDA, $INC, and $SAN (ASAN=1 adds
# AddressSanitizer: the kernels' out-of-bounds reads and writes, memcheck's job).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
CUDA=${CUDA_HOME:-/usr/local/cuda}
SAN=""
[ "${ASAN:-0}" = 1 ] && SAN="-fsanitize=address -g"
INC="-I. -I$CUDA/include -I/usr/include/eigen3"
