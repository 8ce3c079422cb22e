"""Where a short row's select time goes: the row select's parts, each in a kernel of its own.

Run on a GPU from the repository root::

    PYTHONPATH=python python3 benchmark/research/select_probe.py [--rows 1024] [--keys 4096]

On a key matrix of normal scores (``rows x keys``, every row full), one program per row,
``--warps`` warps, CUDA-graph replays:

* ``copy``: load the row, store its first ``topk`` keys (the memory traffic alone);
* ``kth``: load the row and search its k-th key in registers (:func:`row_topk.tile_kth`);
* ``kth+take``: and write the selected entries in position order (``take_mask`` + ``append``);
* ``sort``: load ``topk`` (key, position) composites per row, sort them best first (what
  :func:`select.finalize_row` does), store;
* ``sort32``: the same sort over the ``topk`` int32 keys alone (what a 64-bit composite costs);
* ``rows``: the whole row select (``legacy_select`` with ``KTH_SEARCH = "rows"``).
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl

from indexer_topk.backends import legacy as legacy_backend
from indexer_topk.bench.mix import graph_ms
from indexer_topk.contract import allocate_result, ordered_score_bits
from indexer_topk.kernels.common import COMP_MIN, LOW32, sort1d
from indexer_topk.kernels.row_topk import append, tile_kth
from indexer_topk.kernels.select import take_mask


@triton.jit
def probe_kernel(src, width, out_key, out_pos, TOPK: tl.constexpr, TILE: tl.constexpr, PART: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, TILE)
    valid = offs < width
    key = tl.load(src + row * width + offs, mask=valid, other=0)
    if PART == 0:  # copy
        tl.store(out_key + row * TOPK + offs, key, mask=offs < TOPK)
    elif PART == 1:  # kth
        t, shift, need, whole = tile_kth(key, valid, TOPK)
        tl.store(out_key + row * TOPK, t + shift + need + whole)
    elif PART == 2:  # kth + take
        t, shift, need, whole = tile_kth(key, valid, TOPK)
        take, _eq = take_mask(key, valid, t, shift, need, 0, whole)
        append(out_key + row * TOPK, out_pos + row * TOPK, 0, key, offs, take)
    elif PART == 4:  # sort TOPK int32 keys
        k = tl.arange(0, TOPK)
        kk = sort1d(tl.load(src + row * width + k), True)
        tl.store(out_key + row * TOPK + k, kk)
    else:  # sort TOPK composites
        k = tl.arange(0, TOPK)
        kk = tl.load(src + row * width + k)
        comp = (kk.to(tl.int64) << 32) | (k.to(tl.int64) ^ LOW32)
        comp = sort1d(tl.where(k < TOPK, comp, COMP_MIN), True)
        tl.store(out_key + row * TOPK + k, (comp >> 32).to(tl.int32))
        tl.store(out_pos + row * TOPK + k, ((comp & LOW32) ^ LOW32).to(tl.int32))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--keys", default="4096,2048")
    ap.add_argument("--topk", type=int, default=1024)
    ap.add_argument("--warps", default="8,4")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    lines = []
    for width in (int(x) for x in args.keys.split(",")):
        scores = torch.randn((args.rows, width), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        keys = ordered_score_bits(scores)
        out_key = torch.empty((args.rows, args.topk), dtype=torch.int32, device="cuda")
        out_pos = torch.empty_like(out_key)
        cells = []
        for warps in (int(w) for w in args.warps.split(",")):
            for part, name in ((0, "copy"), (1, "kth"), (2, "kth+take"), (3, "sort"), (4, "sort32")):
                def step():
                    probe_kernel[(args.rows,)](keys, width, out_key, out_pos, TOPK=args.topk, TILE=width, PART=part,
                                               num_warps=warps)
                cells.append(f"{name}/{warps}w={graph_ms(step, iters=args.iters, device='cuda'):.3f}")
        legacy_backend.KTH_SEARCH = "rows"
        seq = torch.full((args.rows,), width, dtype=torch.int32, device="cuda")
        table = torch.zeros((args.rows, width // 64), dtype=torch.int32, device="cuda")
        out = allocate_result(args.rows, args.topk, "cuda")
        cells.append("rows={:.3f}".format(graph_ms(
            lambda: legacy_backend.legacy_select(keys, seq, table, topk=args.topk, out=out), iters=args.iters, device="cuda")))
        lines.append(f"{args.rows} x {width}: " + "  ".join(cells))
        print(lines[-1], flush=True)
    print("\nms per call, CUDA-graph replays, one program per row (rows: the persistent row select)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
