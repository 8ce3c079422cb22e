"""The finish's sort alone: ``topk`` (key, position) composites a row sorted best first, rows
taken in turn by a persistent grid, one row or several per step.

Run on a GPU from the repository root::

    PYTHONPATH=python python3 benchmark/research/sort_probe.py [--rows 8192] [--topk 1024]

The row select's finish sorts each row's selection with ``tl.sort`` over 64-bit composites
(:func:`.select.finalize_row`); under Nsight Compute that network is about two fifths of the
row select at 4,096-key rows, and its warps stall on the partner exchanges with little else to
run (two programs of 8 warps an SM). This probe times the same sort with ``R`` rows sorted
together as one ``[R, topk]`` tensor (``tl.sort`` along the last axis: the same network, ``R``
independent exchanges in flight per step), several warps and programs per SM, and over int32
keys for scale. CUDA-graph replays; every output checked against ``torch.sort``.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from indexer_topk.bench.mix import graph_ms
from indexer_topk.kernels.common import LOW32


@triton.jit
def sort_rows_kernel(src, out, rows, TOPK: tl.constexpr, R: tl.constexpr, WIDE: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    k = tl.arange(0, TOPK)[None, :]
    r = tl.arange(0, R)[:, None]
    for g in range(pid, tl.cdiv(rows, R), programs):
        row = (g * R + r).to(tl.int64)
        m = (row < rows) & (k < TOPK)
        key = tl.load(src + row * TOPK + k, mask=m, other=0)
        if WIDE:
            comp = (key.to(tl.int64) << 32) | (k.to(tl.int64) ^ LOW32)
            comp = tl.sort(comp, dim=1, descending=True)
            tl.store(out + row * TOPK + k, comp, mask=m)
        else:
            tl.store(out + row * TOPK + k, tl.sort(key, dim=1, descending=True).to(tl.int64), mask=m)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--topk", type=int, default=1024)
    ap.add_argument("--rs", default="1,2,4")
    ap.add_argument("--warps", default="8,4,16")
    ap.add_argument("--per-sm", default="2,4")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    g = torch.Generator(device=dev).manual_seed(0)
    key = torch.randint(-(2**31), 2**31 - 1, (args.rows, args.topk), device=dev, generator=g, dtype=torch.int32)
    key[:, ::7] = key[:, :1]  # ties, so the positions decide part of the order
    pos = torch.arange(args.topk, device=dev, dtype=torch.int64)
    ref_wide = torch.sort((key.to(torch.int64) << 32) | (pos ^ 0xFFFFFFFF), dim=1, descending=True).values
    ref_narrow = torch.sort(key, dim=1, descending=True).values.to(torch.int64)
    out = torch.empty((args.rows, args.topk), dtype=torch.int64, device=dev)
    print(f"{torch.cuda.get_device_name(dev)}, {sms} SMs; {args.rows} rows x topk {args.topk}; ms per sort of all rows")
    print(f"{'R':>3} {'warps':>5} {'per SM':>6} {'int64 ms':>9} {'int32 ms':>9}  exact")
    for rr in (int(x) for x in args.rs.split(",")):
        for warps in (int(x) for x in args.warps.split(",")):
            for per_sm in (int(x) for x in args.per_sm.split(",")):
                cells = []
                ok = True
                for wide, ref in ((True, ref_wide), (False, ref_narrow)):
                    grid = (min(per_sm * sms, triton.cdiv(args.rows, rr)),)

                    def step(wide=wide, grid=grid):
                        sort_rows_kernel[grid](key, out, args.rows, TOPK=args.topk, R=rr, WIDE=wide, num_warps=warps)

                    try:
                        out.fill_(-1)
                        step()
                        torch.cuda.synchronize()
                        ok = ok and bool(torch.equal(out, ref))
                        cells.append(f"{graph_ms(step, iters=args.iters, device=dev):9.4f}")
                    except Exception as exc:  # a config that does not compile (registers, shared memory)
                        cells.append(f"{'fail':>9}")
                        print(f"    R={rr} warps={warps} wide={wide}: {type(exc).__name__}: {str(exc)[:200]}")
                print(f"{rr:>3} {warps:>5} {per_sm:>6} {cells[0]} {cells[1]}  {ok}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
