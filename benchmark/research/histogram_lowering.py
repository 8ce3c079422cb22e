#!/usr/bin/env python3
"""How this Triton lowers ``tl.histogram``: ballots and popcounts per bin bit (a cost that grows
with the bins), or one shared-memory atomic per element (a cost that does not).

    python3 benchmark/research/histogram_lowering.py [--arch 90]

Compiles a one-tile histogram of 4,096 keys at 32, 256 and 2,048 bins for the target (no GPU
needed) and counts the PTX instructions that tell the two lowerings apart.
"""

from __future__ import annotations

import argparse
import re
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def _hist_kernel(src, dst, TILE: tl.constexpr, BINS: tl.constexpr):
    key = tl.load(src + tl.arange(0, TILE))
    tl.store(dst + tl.arange(0, BINS), tl.histogram(key & (BINS - 1), BINS))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90)
    a = p.parse_args(argv)
    print(f"triton {triton.__version__}, sm_{a.arch}")
    for bins in (32, 256, 2048):
        src = ASTSource(fn=_hist_kernel, signature={"src": "*i32", "dst": "*i32", "TILE": "constexpr", "BINS": "constexpr"},
                        constexprs={(2,): 4096, (3,): bins})
        ptx = triton.compile(src, target=GPUTarget("cuda", a.arch, 32), options=dict(num_warps=8)).asm["ptx"]
        counts = {op: len(re.findall(rf"\b{re.escape(op)}", ptx)) for op in ("atom.", "vote.", "popc.", "bar.sync")}
        lines = sum(1 for line in ptx.splitlines() if line.strip() and not line.strip().startswith(("//", ".", "$")))
        print(f"{bins:5d} bins: {lines:6d} PTX lines  " + "  ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
