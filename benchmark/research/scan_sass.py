#!/usr/bin/env python3
"""Position-order slots for a 4,096-flag tile in sm_90 machine code, three ways (no GPU needed).

    python3 benchmark/research/scan_sass.py [--warps 8] [--aligned]

Compiles a kernel that loads a tile of keys, flags those at or above a threshold and scatters
their positions to slots from an exclusive prefix sum of the flags, with each of:
``exclusive_sum`` (position order, rows of four), ``exclusive_sum_strided`` (strided order: slots,
not position order) and a ballot sketch (position order: each warp's register slot counts the
lanes below it with ``vote.ballot`` and ``popc``, and the 32-key blocks' totals are scanned through
a scratch row; the layout it assumes, each register slot of a warp one 32-key block in lane order,
is checked at run time with ``match.any``, falling back to ``exclusive_sum``; ``ballot-unchecked``
drops the check). Prints the instruction count of each kernel. The row pointer's alignment is
unknown, as in the row select (which sets the tile's layout, one key a thread); ``--aligned``
gives the compiler an aligned row instead (vectorised loads, four keys a thread).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compile_report  # noqa: E402  (puts the checkout's python/ on the path where needed)
from one_tile_sass import sass_counts  # noqa: E402

from indexer_topk.kernels.common import exclusive_sum, exclusive_sum_strided  # noqa: E402


@triton.jit
def _warp_prefix(flag, pos):
    """(flagged lanes below this one in its warp's register slot, the slot's flagged lanes, 1
    where the slot holds one 32-key block of positions in lane order)."""
    return tl.inline_asm_elementwise(
        asm="""{ .reg .pred p, q; .reg .b32 m, lt, ln, blk, same;
        setp.ne.b32 p, $3, 0; vote.sync.ballot.b32 m, p, -1;
        mov.u32 lt, %lanemask_lt; and.b32 lt, lt, m; popc.b32 $0, lt; popc.b32 $1, m;
        mov.u32 ln, %laneid; and.b32 blk, $4, 31; setp.eq.u32 q, ln, blk;
        shr.u32 blk, $4, 5; match.any.sync.b32 same, blk, -1; setp.eq.and.u32 q, same, -1, q;
        selp.u32 $2, 1, 0, q; }""",
        constraints="=r,=r,=r,r,r", args=[flag, pos], dtype=(tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def _ballot_sum(flag, pos, scratch, CHECKED: tl.constexpr):
    N: tl.constexpr = flag.shape[0]
    below, total, ok = _warp_prefix(flag, pos)
    if not CHECKED or tl.min(ok, axis=0) == 1:
        tl.store(scratch + (pos >> 5), total, mask=(pos & 31) == 0)
        tl.debug_barrier()
        b = tl.arange(0, N // 32)
        t = tl.load(scratch + b)
        tl.debug_barrier()
        tl.store(scratch + b, tl.cumsum(t, axis=0) - t)
        tl.debug_barrier()
        out = tl.load(scratch + (pos >> 5)) + below
    else:
        out = exclusive_sum(flag)
    return out


@triton.jit
def _slots_kernel(src, n, out, scratch, t, stride, MODE: tl.constexpr, TILE: tl.constexpr):
    src += tl.program_id(0) * stride
    pos = tl.arange(0, TILE)
    key = tl.load(src + pos, mask=pos < n, other=0)
    take = (key >= t) & (pos < n)
    f = take.to(tl.int32)
    if MODE == 0:
        slot = exclusive_sum(f)
    elif MODE == 1:
        slot = exclusive_sum_strided(f)
    else:
        slot = _ballot_sum(f, pos, scratch, MODE == 2)
    tl.store(out + slot, pos, mask=take)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--warps", type=int, default=8)
    p.add_argument("--aligned", action="store_true")
    a = p.parse_args(argv)
    print(f"triton {triton.__version__}, sm_90, {a.warps} warps, {'aligned' if a.aligned else 'unaligned'} rows")
    for mode, name in ((0, "exclusive_sum"), (1, "strided"), (2, "ballot"), (3, "ballot-unchecked")):
        const = dict(MODE=mode, TILE=4096)
        sig = dict(compile_report._signature(_slots_kernel, {}, constexprs=const), src="*i32", out="*i32",
                   scratch="*i32", n="i32", t="i32", stride="constexpr" if a.aligned else "i32")
        if a.aligned:
            const["stride"] = 4096
        kernel = compile_report._compile(_slots_kernel, sig, const, 90, a.warps, 1, 128)
        lines, ops = sass_counts(kernel)
        print(f"{name:17s} {sum(lines.values()):5d} instructions  {compile_report._report(kernel)}")
        print("    by opcode: " + ", ".join(f"{o} {c}" for o, c in ops.most_common(10)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
