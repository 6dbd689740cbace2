"""Rewrites a kernels/<op>/*.cu for block_emu.h (a CPU stand-in for the CUDA execution model):
__shared__ -> function statics, extern __shared__ -> the emulator's buffer, <<<>>> launches ->
emu::launch, the runtime calls the kernels' launchers make -> host stand-ins.
Usage: emulate_kernel.py IN.cu OUT.cpp"""
import re
import sys


def rewrite(src):
    s = src.replace('#include <cub/block/block_scan.cuh>', '')
    s = re.sub(r'extern __shared__ float (\w+)\[\];', r'float* \1 = ::emu::dyn_smem<float>();', s)
    s = s.replace('__shared__', 'static')
    s = re.sub(r'__global__ void( __launch_bounds__\([^)]*\))?', 'void', s)
    s = s.replace('__device__ __forceinline__', 'inline')
    s = s.replace('cudaMemsetAsync(', '::emu::memset_async(').replace('cudaFuncSetAttribute(', '::emu::func_set_attr(')
    s = s.replace('PUNICA_CUDA_CHECK_LAUNCH();', '(void)0;')

    def launch(m):
        cfg = [a.strip() for a in m.group(2).split(',')][:3]
        return '::emu::launch(%s, %s, %s);' % (m.group(1), ', '.join(cfg), m.group(3))

    s = re.sub(r'(\w+(?:<[^;<>]*>)?)<<<([^;]*?)>>>\((\w+)\);', launch, s)
    return '#include "scripts/lab/probes/block_emu/block_emu.h"\n' + s


if __name__ == '__main__':
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        out = rewrite(f.read())
    if '<<<' in out:
        sys.exit('emulate_kernel.py: a launch was not rewritten in ' + sys.argv[1])
    with open(sys.argv[2], 'w') as f:
        f.write(out)
