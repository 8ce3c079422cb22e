#!/usr/bin/env python3
"""Score-tile structures for the FP8 indexer, timed alone (no selection) on a GPU.

    PYTHONPATH=python python3 benchmark/research/tile_sweep.py [--rows 1024] [--context 786432] [--only NAME ...]

Each variant computes every score of ``rows`` query rows against a ``context / 4``-position
paged FP8 cache (one request, pages in order) and keeps only an elementwise running maximum per
program, so nothing is selected and almost nothing is written; the time is the score tile's.
The variants differ in how a program reads keys (pointer gathers through the page table, or
one bulk tensor copy per 64-key page), how many query rows share a key tile (2 or 4), whether
those rows share one MMA along N (``joint``) or take one N=64 MMA each, warps, pipeline depth
and Triton's automatic warp specialisation. The table reports ms and effective TFLOP/s
(2 * rows * positions * 64 * 128 / time). ``--compile-only`` compiles every variant for sm_90
without a device (with ``--dump DIR``: PTX, SASS and TTGIR per variant).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton without host tensor descriptors
    TensorDescriptor = None

PAGE_BYTES = 8448  # 64 keys x 128 e4m3 bytes, then 64 fp32 key scales
SCALE_OFFSET = 8192
PAGE_WORDS = tl.constexpr(PAGE_BYTES // 4)
SCALE_WORD = tl.constexpr(SCALE_OFFSET // 4)
PAGE_STRIDE = tl.constexpr(PAGE_BYTES)


@dataclass(frozen=True)
class Variant:
    name: str
    rows: int  # query rows sharing one key tile
    block_n: int  # keys per step
    joint: bool  # one MMA with N = rows * 64 (else one N=64 MMA per row)
    tma: bool  # one bulk tensor copy per page (block_n 64) instead of pointer gathers
    warps: int
    stages: int
    ws: bool = False  # tl.range(warp_specialize=True)


VARIANTS = [
    Variant("gather-r2-split-bn128-w4-s2", 2, 128, False, False, 4, 2),
    Variant("gather-r2-joint-bn128-w4-s2", 2, 128, True, False, 4, 2),
    Variant("gather-r2-joint-bn128-w8-s3", 2, 128, True, False, 8, 3),
    Variant("gather-r4-joint-bn128-w8-s2", 4, 128, True, False, 8, 2),
    Variant("gather-r4-joint-bn64-w4-s3", 4, 64, True, False, 4, 3),
    Variant("tma-r2-split-bn64-w4-s3", 2, 64, False, True, 4, 3),
    Variant("tma-r2-joint-bn64-w4-s3", 2, 64, True, True, 4, 3),
    Variant("tma-r2-joint-bn64-w4-s4", 2, 64, True, True, 4, 4),
    Variant("tma-r4-joint-bn64-w4-s3", 4, 64, True, True, 4, 3),
    Variant("tma-r4-joint-bn64-w8-s3", 4, 64, True, True, 8, 3),
    Variant("tma-r4-split-bn64-w4-s3", 4, 64, False, True, 4, 3),
    # tl.range(warp_specialize=True) does not compile for this loop on sm_90 with Triton 3.6
    # (NVGPUWarpSpecialization fails), so no such variant is listed.
]


@triton.jit
def _query_t(q_ptr, r, H: tl.constexpr):
    """Rows ``r .. r + H / 64`` of the e4m3 query as the MMA's B operand ``[128, H]``."""
    d = tl.arange(0, 128)[:, None]
    h = tl.arange(0, H)[None, :]
    return tl.load(q_ptr + r.to(tl.int64) * 8192 + h * 128 + d).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _head_sum(acc, w, R: tl.constexpr, BLOCK_N: tl.constexpr):
    """``[BLOCK_N, R]``: per row, sum over its 64 heads of w * relu(acc) (NaN kept)."""
    acc = tl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL)
    return tl.sum(tl.reshape(acc * w[None, :], [BLOCK_N, R, 64]), axis=2)


@triton.jit
def _one_row(k, qt, w):
    acc = tl.dot(k, qt, out_dtype=tl.float32)
    acc = tl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL)
    return tl.sum(acc * w[None, :], axis=1)


@triton.jit
def tile_kernel(
    q_ptr, w_ptr, kc_ptr, kf_ptr, kdesc, pt_ptr, stride_pt, n_pos, out_ptr,
    R: tl.constexpr, BLOCK_N: tl.constexpr, JOINT: tl.constexpr, TMA: tl.constexpr,
    STAGES: tl.constexpr, WS: tl.constexpr,
):
    pid = tl.program_id(0)
    r0 = pid * R
    pt = pt_ptr + r0.to(tl.int64) * stride_pt
    best = tl.full([BLOCK_N, R], float("-inf"), tl.float32)
    if JOINT:
        qt = _query_t(q_ptr, r0, R * 64)
        w = tl.load(w_ptr + r0 * 64 + tl.arange(0, R * 64))
    else:
        qt0 = _query_t(q_ptr, r0, 64)
        qt1 = _query_t(q_ptr, r0 + 1, 64)
        w0 = tl.load(w_ptr + r0 * 64 + tl.arange(0, 64))
        w1 = tl.load(w_ptr + (r0 + 1) * 64 + tl.arange(0, 64))
        if R == 4:
            qt2 = _query_t(q_ptr, r0 + 2, 64)
            qt3 = _query_t(q_ptr, r0 + 3, 64)
            w2 = tl.load(w_ptr + (r0 + 2) * 64 + tl.arange(0, 64))
            w3 = tl.load(w_ptr + (r0 + 3) * 64 + tl.arange(0, 64))
    for b in tl.range(0, n_pos, BLOCK_N, num_stages=STAGES, warp_specialize=WS):
        off = tl.arange(0, BLOCK_N)
        if TMA:
            page = tl.load(pt + b // 64)
            k = tl.reshape(kdesc.load([page, 0, 0]), [BLOCK_N, 128])
            ks = tl.load(kf_ptr + page.to(tl.int64) * PAGE_WORDS + SCALE_WORD + off)
        else:
            pos = b + off
            page = tl.load(pt + pos // 64).to(tl.int64)
            d = tl.arange(0, 128)[None, :]
            k = tl.load(kc_ptr + page[:, None] * PAGE_STRIDE + (pos % 64)[:, None] * 128 + d)
            k = k.to(tl.float8e4nv, bitcast=True)
            ks = tl.load(kf_ptr + page * PAGE_WORDS + SCALE_WORD + pos % 64)
        if JOINT:
            acc = tl.dot(k, qt, out_dtype=tl.float32)
            s = _head_sum(acc, w, R, BLOCK_N)
        else:
            s0 = _one_row(k, qt0, w0)
            s1 = _one_row(k, qt1, w1)
            if R == 4:
                s2 = _one_row(k, qt2, w2)
                s3 = _one_row(k, qt3, w3)
                s = tl.join(tl.join(s0, s2), tl.join(s1, s3))
                s = tl.reshape(s, [BLOCK_N, R])
            else:
                s = tl.join(s0, s1)
        best = tl.maximum(best, s * ks[:, None])
    rows = r0 + tl.arange(0, R)
    tl.store(out_ptr + rows, tl.max(best, axis=0))



def make_inputs(rows: int, positions: int, device, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    pages = -(-positions // 64)
    q = torch.randint(0, 256, (rows, 64, 128), dtype=torch.uint8, generator=g)
    q[(q & 0x7F) == 0x7F] = 0x38  # no NaN codes
    cache = torch.randint(0, 256, (pages, PAGE_BYTES), dtype=torch.uint8, generator=g)
    keys = cache[:, :SCALE_OFFSET]
    keys[(keys & 0x7F) == 0x7F] = 0x38
    cache[:, SCALE_OFFSET:] = (torch.rand(pages, 64, generator=g) + 0.5).view(torch.uint8).view(pages, 256)
    w = torch.randn(rows, 64, generator=g)
    perm = torch.randperm(pages, generator=g).int()  # scattered pages, one request
    pt = perm.expand(rows, -1).contiguous()
    return [t.to(device) for t in (q, w, cache, pt)]


def descriptor(cache: torch.Tensor):
    pages = cache.shape[0]
    view = cache.as_strided((pages, 64, 128), (PAGE_BYTES, 128, 1)).view(torch.float8_e4m3fn)
    return TensorDescriptor(view, [pages, 64, 128], [PAGE_BYTES, 128, 1], [1, 64, 128])


def launch(v: Variant, q, w, cache, pt, positions, out):
    kdesc = descriptor(cache) if v.tma else None
    grid = (q.shape[0] // v.rows,)
    tile_kernel[grid](
        q, w, cache, cache.view(torch.float32), kdesc, pt, pt.stride(0), positions, out,
        R=v.rows, BLOCK_N=v.block_n, JOINT=v.joint, TMA=v.tma, STAGES=v.stages, WS=v.ws,
        num_warps=v.warps, num_stages=v.stages,
    )


def reference_max(q, w, cache, pt, positions, rows_check=4):
    """fp64 row maxima of the first rows (scattered pages resolved on the host)."""
    pages = pt[0, : -(-positions // 64)].long()
    keys = cache[pages, :SCALE_OFFSET].reshape(-1, 128)[:positions].view(torch.float8_e4m3fn).double()
    ks = cache[pages, SCALE_OFFSET:].contiguous().view(torch.float32).reshape(-1)[:positions].double()
    qq = q[:rows_check].view(torch.float8_e4m3fn).double()
    dots = torch.einsum("jd,rhd->rjh", keys, qq).clamp_min(0)
    s = (dots * w[:rows_check, None, :].double()).sum(-1) * ks[None, :]
    return s.max(dim=1).values


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--context", type=int, default=786432, help="raw tokens; positions = context // 4")
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    positions = a.context // 4
    dev = torch.device("cuda")
    q, w, cache, pt = make_inputs(a.rows, positions, dev)
    flop = 2.0 * a.rows * positions * 64 * 128
    ref = reference_max(q, w, cache, pt, positions)
    results = []
    for v in VARIANTS:
        if a.only and v.name not in a.only:
            continue
        out = torch.full((a.rows,), float("nan"), device=dev)
        rec = asdict(v)
        try:
            t0 = time.time()
            launch(v, q, w, cache, pt, positions, out)
            torch.cuda.synchronize()
            rec["compile_s"] = round(time.time() - t0, 1)
            err = ((out[: len(ref)].double() - ref).abs() / ref.abs()).max().item()
            rec["max_rel_err"] = err
            ms = triton.testing.do_bench(lambda: launch(v, q, w, cache, pt, positions, out),
                                         warmup=25, rep=max(50, a.iters * 10), return_mode="median")
            rec["ms"] = ms
            rec["tflops"] = flop / ms / 1e9
        except Exception as e:  # a variant that does not compile or run is reported, not fatal
            rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        results.append(rec)
        print(json.dumps(rec), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(rows=a.rows, positions=positions, device=torch.cuda.get_device_name(),
                           triton=triton.__version__, torch=torch.__version__, results=results), f, indent=1)
    print(f"\nscore tile alone, {a.rows} rows x {positions} positions, {torch.cuda.get_device_name()}, triton {triton.__version__}")
    print(f"{'variant':32s} {'ms':>7s} {'TFLOP/s':>8s} {'rel err':>9s}")
    for r in results:
        if "ms" in r:
            print(f"{r['name']:32s} {r['ms']:7.3f} {r['tflops']:8.0f} {r['max_rel_err']:9.1e}")
        else:
            print(f"{r['name']:32s} {r.get('error', '')[:60]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
