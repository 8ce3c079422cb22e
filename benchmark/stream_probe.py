#!/usr/bin/env python3
"""The chunked stream beside the persistent fused kernel and legacy, same inputs, one run.

    PYTHONPATH=python python3 benchmark/stream_probe.py [--quick]
    PYTHONPATH=python python3 benchmark/stream_probe.py --compile LAYOUT TOPK   # warm the cache

For each case it times (median of CUDA events) legacy, the persistent fused kernel and the
chunked stream under several plans, checks every output bitwise against legacy's, and splits the
stream's time into its score launches, its select launches and the host's launch time. One
JSON record per timing goes to ``$OUT/stream_probe.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from indexer_topk.bench.timing import effective_tflops, median_ms
from indexer_topk.compare import bitwise_equal


def compile_only(layout, topk):
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from chunked_stream import stream_indexer_topk
    from indexer_topk.workload import make_workload

    t0 = time.time()
    w = make_workload(layout, context_tokens=[8 * topk + 300], rows_per_request=[64], topk=topk, seed=0,
                      device="cuda")
    stream_indexer_topk(w.inputs())
    legacy_indexer_topk(w.inputs())
    if layout == "sglang_fp8" and topk == 1024:
        from indexer_topk.backends.fused import fused_indexer_topk

        fused_indexer_topk(w.inputs())
    torch.cuda.synchronize()
    print(f"compiled {layout} topk {topk} in {time.time() - t0:.1f} s", flush=True)


def stage_times(inputs, plan_kw, iters):
    """Score-only and select-only passes of the stream's launch sequence, and the host time of
    one call (launches issued without waiting)."""
    import triton

    import chunked_stream as st
    from indexer_topk.contract import PAGE_SIZE, allocate_result
    from indexer_topk.kernels.launch import device_sm_count, pack_args, tile_config
    from indexer_topk.kernels.logits import logits_kernel
    from chunked_stream import chunk_select_kernel

    ka = pack_args(inputs)
    cfg = tile_config(inputs.layout)
    plan = st.plan_stream(inputs.rows, inputs.topk, cfg.rows, **plan_kw)
    ws = torch.empty(plan.nbytes, dtype=torch.uint8, device="cuda")
    keys, bk, bp, state = st._carve(ws, plan)
    out = allocate_result(inputs.rows, inputs.topk, "cuda")
    pt = ka.page_table
    width = pt.shape[1] * PAGE_SIZE
    chunk = min(plan.chunk, triton.cdiv(width, PAGE_SIZE) * PAGE_SIZE)
    order = st.chunk_order(triton.cdiv(width, chunk))
    slots = device_sm_count("cuda") * st.SCORE_PROGRAMS_PER_SM[inputs.layout]

    from chunked_stream import Relaunch

    score_k = Relaunch(logits_kernel, dict(LAYOUT=ka.layout, R=cfg.rows, TMA=ka.tma, INTERPRET=False,
                                           STAGES=cfg.logits_stages),
                       dict(num_warps=cfg.num_warps, num_stages=cfg.logits_stages))
    fold_k = Relaunch(chunk_select_kernel, dict(TOPK=inputs.topk, CAP=plan.cap, TILE=plan.tile, BLOCK=plan.block,
                                                SPAN=plan.span),
                      dict(num_warps=st.SELECT_WARPS, **({"maxnreg": st.SELECT_MAXNREG} if st.SELECT_MAXNREG else {})))

    def run(score, select):
        for r0 in range(0, inputs.rows, plan.rows_per_step):
            n = min(plan.rows_per_step, inputs.rows - r0)
            groups = triton.cdiv(n, cfg.rows)
            span = triton.cdiv(triton.cdiv(chunk, max(1, slots // groups)), PAGE_SIZE) * PAGE_SIZE
            for i, c in enumerate(order):
                col0 = c * chunk
                ncols = min(chunk, width - col0)
                if score:
                    score_k((groups, triton.cdiv(ncols, span)), ka.q, ka.qs, ka.w, ka.kc, ka.kf, ka.ks, ka.kdesc,
                            ka.pages, pt, pt.stride(0), ka.seq_lens, r0 + n, r0, float(inputs.weight_scale), keys,
                            chunk, col0, col0 + ncols, span)
                if select:
                    fold_k((n,), keys, chunk, col0, ncols, ka.seq_lens, r0, r0 + n, width, bk, bp, state, pt,
                           pt.stride(0), out.values.view(torch.int32), out.raw_indices, out.physical_indices,
                           out.counts, int(i == 0), int(i == len(order) - 1))

    res = dict(score_ms=median_ms(lambda: run(True, False), warmup=2, iters=iters, device="cuda"),
               select_ms=median_ms(lambda: run(False, True), warmup=2, iters=iters, device="cuda"))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run(True, True)
    res["host_ms"] = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    res["launches"] = 2 * len(order) * triton.cdiv(inputs.rows, plan.rows_per_step)
    res["chunk"] = chunk
    res["rows_per_step"] = plan.rows_per_step
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compile", nargs=2, metavar=("LAYOUT", "TOPK"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--iters", type=int, default=8)
    a = p.parse_args(argv)
    if a.compile:
        compile_only(a.compile[0], int(a.compile[1]))
        return 0
    from indexer_topk.backends.fused import fused_indexer_topk
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from chunked_stream import stream_indexer_topk
    from indexer_topk.contract import allocate_result
    from indexer_topk.workload import make_workload

    MiB = 1 << 20
    # name -> plan overrides; "stream" is the module's default (256 rows per step, no register cap)
    stream_plans = {
        "stream": {},
        "stream_r512": dict(rows_per_step=512),
        "stream_r512_nreg96": dict(rows_per_step=512, select_maxnreg=96),
        "stream_r256_b2048": dict(block=2048),
        "stream_r1024_32M": dict(rows_per_step=1024, budget=32 * MiB),
    }
    cases = [  # layout, tokens, rows, pattern, variants
        ("sglang_fp8", 786432, 1024, "random", ["legacy", "fused", *stream_plans]),
        ("sglang_fp8", 786432, 1024, "increasing", ["stream"]),
        ("sglang_fp8", 65536, 1024, "random", ["legacy", "fused", "stream"]),
        ("sglang_mxfp4", 786432, 1024, "random", ["legacy", "stream"]),
        ("sglang_fp8", 786432, 8, "random", ["legacy", "stream"]),
    ]
    if a.quick:
        cases = cases[:1]
    records = []
    out_dir = os.environ.get("OUT", ".")
    for layout, tokens, rows, pattern, variants in cases:
        w = make_workload(layout, context_tokens=[tokens], rows_per_request=[rows], topk=1024, seed=1,
                          device="cuda", pattern=pattern)
        inputs = w.inputs()
        ref = legacy_indexer_topk(inputs)
        for name in variants:
            out = allocate_result(w.rows, 1024, "cuda")
            if name == "legacy":
                fn = lambda: legacy_indexer_topk(inputs, out=out)  # noqa: E731
            elif name == "fused":
                fn = lambda: fused_indexer_topk(inputs, out=out)  # noqa: E731
            else:
                kw = dict(stream_plans[name])
                import chunked_stream as st

                nreg = kw.pop("select_maxnreg", st.SELECT_MAXNREG)
                ws = torch.empty(st.plan_stream(w.rows, 1024, **kw).nbytes, dtype=torch.uint8, device="cuda")

                def fn(kw=kw, ws=ws, nreg=nreg):
                    saved, st.SELECT_MAXNREG = st.SELECT_MAXNREG, nreg
                    try:
                        return stream_indexer_topk(inputs, out=out, workspace=ws, **kw)
                    finally:
                        st.SELECT_MAXNREG = saved
            try:
                ms = median_ms(fn, warmup=2, iters=a.iters, device="cuda")
                rec = dict(layout=layout, tokens=tokens, rows=rows, pattern=pattern, variant=name, ms=ms,
                           tflops=effective_tflops(w.rows, w.c4_len, ms), eq_legacy=bitwise_equal(out, ref))
                if name == "stream":
                    plan_kw = {k: v for k, v in stream_plans[name].items() if k != "select_maxnreg"}
                    rec.update(stage_times(inputs, plan_kw, a.iters))
            except Exception as e:  # a variant that fails is a data point, not the end of the run
                rec = dict(layout=layout, tokens=tokens, rows=rows, pattern=pattern, variant=name, error=repr(e)[:300])
            print(json.dumps(rec), flush=True)
            records.append(rec)
            fn = out = None
        w = inputs = ref = None
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "stream_probe.json"), "w") as f:
        json.dump(records, f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}, topk 1024")
    print(f"{'layout':13s} {'tokens':>7s} {'rows':>5s} {'pattern':10s} {'variant':17s} {'ms':>7s} {'TF/s':>5s} eq  stages")
    for r in records:
        head = f"{r['layout']:13s} {r['tokens'] // 1024:6d}K {r['rows']:5d} {r['pattern']:10s} {r['variant']:17s}"
        if "error" in r:
            print(head, "error", r["error"][:60])
            continue
        extra = ""
        if "score_ms" in r:
            extra = (f"score {r['score_ms']:.3f} select {r['select_ms']:.3f} host {r['host_ms']:.2f} ms, "
                     f"{r['launches']} launches, chunk {r['chunk']}")
        print(f"{head} {r['ms']:7.3f} {r['tflops']:5.0f} {'Y' if r['eq_legacy'] else 'N'}  {extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
