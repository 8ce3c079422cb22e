#!/usr/bin/env python3
"""The chunked stream beside the persistent fused kernel and legacy, same inputs, one run.

    PYTHONPATH=python python3 benchmark/research/stream_probe.py [--quick]
    PYTHONPATH=python python3 benchmark/research/stream_probe.py --compile LAYOUT TOPK   # warm the cache

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
    """The stream's score launches alone, its fold launches alone, and the host time of one call
    (launches issued without waiting)."""
    import triton

    import chunked_stream as st
    from indexer_topk.contract import PAGE_SIZE
    from indexer_topk.kernels.launch import tile_config

    plan = st.plan_stream(inputs.rows, inputs.topk, tile_config(inputs.layout).rows, **plan_kw)
    ws = torch.empty(plan.nbytes, dtype=torch.uint8, device="cuda")

    def run(*launch):
        return lambda: st.stream_indexer_topk(inputs, workspace=ws, launch=launch, **plan_kw)

    res = dict(score_ms=median_ms(run("score"), warmup=2, iters=iters, device="cuda"),
               select_ms=median_ms(run("fold"), warmup=2, iters=iters, device="cuda"))
    call = run("score", "fold")
    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    res["host_ms"] = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    chunk, n_chunks = st.chunk_geometry(plan, inputs.page_table.shape[1] * PAGE_SIZE)
    res["launches"] = 2 * n_chunks * triton.cdiv(inputs.rows, plan.rows_per_step)
    res["chunk"] = chunk
    res["rows_per_step"] = plan.rows_per_step
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compile", nargs=2, metavar=("LAYOUT", "TOPK"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--fused-only", action="store_true", help="legacy and the fused kernel only (no stream plans)")
    p.add_argument("--iters", type=int, default=8)
    a = p.parse_args(argv)
    if a.compile:
        compile_only(a.compile[0], int(a.compile[1]))
        return 0
    from indexer_topk.backends.fused import fused_indexer_topk
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from chunked_stream import plan_stream, stream_indexer_topk
    from indexer_topk.contract import allocate_result
    from indexer_topk.workload import make_workload

    MiB = 1 << 20
    # name -> plan overrides; "stream" is the module's default (256 rows per step)
    stream_plans = {
        "stream": {},
        "stream_r512": dict(rows_per_step=512),
        "stream_r1024_32M": dict(rows_per_step=1024, budget=32 * MiB),
    }
    cases = [  # layout, tokens, rows, pattern, variants
        ("sglang_fp8", 786432, 1024, "random", ["legacy", "fused", *stream_plans]),
        ("sglang_fp8", 786432, 1024, "increasing", ["fused", "stream"]),
        ("sglang_fp8", 65536, 1024, "random", ["legacy", "fused", "stream"]),
        ("sglang_mxfp4", 786432, 1024, "random", ["legacy", "fused", "stream"]),
        ("sglang_mxfp4", 65536, 1024, "random", ["legacy", "fused"]),
        ("sglang_fp8", 786432, 8, "random", ["legacy", "stream"]),
    ]
    if a.fused_only:
        cases = [(l, t, r, pat, [v for v in vs if v in ("legacy", "fused")]) for l, t, r, pat, vs in cases]
        cases = [c for c in cases if c[4]]
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
                kw = stream_plans[name]
                ws = torch.empty(plan_stream(w.rows, 1024, **kw).nbytes, dtype=torch.uint8, device="cuda")
                fn = lambda kw=kw, ws=ws: stream_indexer_topk(inputs, out=out, workspace=ws, **kw)  # noqa: E731
            try:
                ms = median_ms(fn, warmup=2, iters=a.iters, device="cuda")
                rec = dict(layout=layout, tokens=tokens, rows=rows, pattern=pattern, variant=name, ms=ms,
                           tflops=effective_tflops(w.rows, w.c4_len, ms), eq_legacy=bitwise_equal(out, ref))
                if name == "stream":
                    rec.update(stage_times(inputs, stream_plans[name], a.iters))
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
