"""Rewrites every kernel<<<grid, block, smem, stream>>>(args...) launch of a .cu into
::emu::launch([&](int) { kernel(args...); }, grid, block, smem, 0) for block_emu.h (kernels with
several parameters; emulate_kernel.py rewrites the one-struct launches). Usage: IN OUT"""
import re
import sys


def split_top(s):
    parts, depth, cur = [], 0, ''
    for ch in s:
        if ch in '(<[{':
            depth += 1
        elif ch in ')>]}':
            depth -= 1
        if ch == ',' and depth == 0:
            parts.append(cur.strip())
            cur = ''
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def rewrite(s):
    def launch(m):
        cfg = split_top(m.group(2))
        while len(cfg) < 3:
            cfg.append('0')
        return '::emu::launch([&](int) { %s(%s); }, %s, %s, %s, 0);' % (m.group(1), m.group(3), cfg[0], cfg[1], cfg[2])
    return re.sub(r'(\w+(?:<[^;<>]*>)?)<<<(.*?)>>>\((.*?)\);', launch, s, flags=re.S)


if __name__ == '__main__':
    with open(sys.argv[1]) as f:
        out = rewrite(f.read())
    with open(sys.argv[2], 'w') as f:
        f.write(out)
