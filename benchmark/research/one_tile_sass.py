#!/usr/bin/env python3
"""The row select's one-tile path in machine code, by source line: how many instructions each
line of the search and the write compiles to (no GPU needed).

    python3 benchmark/research/one_tile_sass.py [--bins 0,32] [--warps 8] [--top 25] [--kernel rows]

Compiles a kernel that runs only a one-tile row (``row_topk.tile_take`` then ``emit_row``, topk
1,024 of 4,096 keys, position order) for sm_90 with this Triton, disassembles it with line
information, and counts the instructions by source line and by opcode. ``--kernel rows``: the row
select's own kernel instead (``topk_rows_kernel`` with ``ONE_TILE``, as a matrix at most the tile
wide launches it: its persistent loop, and its row pointer of unknown alignment, which sets the
tile's layout). The counts are static:
the radix search's seven passes are all counted though a row stops after the pass that takes its
boundary bucket whole. Run it with the Triton the GPU machine has (its ``tl.histogram`` lowering
differs between releases; ``histogram_lowering.py``).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compile_report  # noqa: E402  (puts the checkout's python/ on the path where needed)

from indexer_topk.kernels.row_topk import emit_row, tile_take, topk_rows_kernel  # noqa: E402


@triton.jit
def one_tile_kernel(src, n, pt, out_bits, out_raw, out_phys, out_cnt, TOPK: tl.constexpr, TILE: tl.constexpr,
                    BINS: tl.constexpr, CAND: tl.constexpr):
    _key, pos, take = tile_take(src, n, out_bits, TOPK, TILE, BINS, CAND)
    emit_row(pos, take, tl.minimum(n, TOPK), src, pt, out_bits, out_raw, out_phys, out_cnt, TOPK)


def sass_counts(kernel):
    """:func:`count` of a compiled kernel's machine code, disassembled by the ``nvdisasm`` this
    Triton ships."""
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.cubin")
        Path(path).write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([nvdisasm, "-g", "-c", path], capture_output=True, text=True, check=True).stdout
    return count(sass)


def count(sass: str):
    """``(Counter by "file:line", Counter by opcode)`` of a ``nvdisasm -g -c`` listing."""
    where, lines, ops = "?", collections.Counter(), collections.Counter()
    for text in sass.splitlines():
        if text.lstrip().startswith("//##"):
            m = re.search(r'File "([^"]+)", line (\d+)', text)
            if m:
                where = f"{os.path.basename(m.group(1))}:{m.group(2)}"
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]+)", text)
        if m:
            lines[where] += 1
            ops[m.group(2)] += 1
    return lines, ops


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bins", default="0,32", help="ROWS_BINS values, comma-separated")
    p.add_argument("--cand", type=int, default=512)
    p.add_argument("--warps", type=int, default=8)
    p.add_argument("--maxnreg", type=int, default=128)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--kernel", choices=("one_tile", "rows"), default="one_tile")
    a = p.parse_args(argv)
    print(f"triton {triton.__version__}, sm_90, {a.warps} warps")
    for bins in (int(b) for b in a.bins.split(",")):
        const = dict(TOPK=1024, TILE=4096, BINS=bins, CAND=a.cand)
        fn, scalars = one_tile_kernel, dict(n="i32")
        if a.kernel == "rows":
            fn, scalars = topk_rows_kernel, dict(rows="i32")
            const.update(SAMPLE=2048, SORT_BITS=0, ONE_TILE=True)
        sig = dict(compile_report._signature(fn, {}, constexprs=const), **scalars)
        kernel = compile_report._compile(fn, sig, const, 90, a.warps, 1, a.maxnreg)
        lines, ops = sass_counts(kernel)
        print(f"\nbins {bins}: {sum(lines.values())} instructions  {compile_report._report(kernel)}")
        print("  by opcode: " + ", ".join(f"{o} {c}" for o, c in ops.most_common(14)))
        for where, c in lines.most_common(a.top):
            print(f"  {c:6d}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
