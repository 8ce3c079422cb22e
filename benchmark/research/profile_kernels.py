"""Where the time goes: stage timings and measurement variants of the legacy and fused kernels.

Run on a GPU from the repository root::

    PYTHONPATH=python python3 benchmark/research/profile_kernels.py [--layouts ...] [--context 768K] [--rows 1024]

For each layout, on one DSv4-shaped prefill (one request, ``rows`` query tokens at the end of
the context), it times side by side: the legacy path (total, score stage, top-k stage and
``torch.topk(sorted=False)`` on the same logits), the fused path, the fused path with a larger
candidate pool (fewer cuts; over the scratch budget, so a measurement only) and the fused path
on the increasing-score adversarial pattern. It also checks fused == legacy bitwise (default
launch, four context splits, a one-page pool that forces a cut every page or two) and legacy
against the fp64 reference on a smaller ragged batch. Medians of CUDA-event timings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from indexer_topk.bench.runs import time_legacy_stages
from indexer_topk.bench.timing import effective_tflops, median_ms, peak_memory_mib
from indexer_topk.compare import bitwise_equal as same_bits
from indexer_topk.options import parse_tokens


def bench_ms(fn, iters):
    """Median CUDA-event time of ``fn`` in ms after three warm-up calls (the harness's timer)."""
    return median_ms(fn, warmup=3, iters=iters, device="cuda")


def check_correctness(layout, topk, device, log):
    from indexer_topk.backends.fused import fused_indexer_topk
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from indexer_topk.compare import compare_to_reference, mma_tolerance
    from indexer_topk.reference import reference_with_next_values
    from indexer_topk.workload import make_workload

    rows = []
    for pattern in ("random", "increasing", "equal", "zero_plateau", "nan_rows"):
        w = make_workload(layout, context_tokens=[131072, 20000, 300], rows_per_request=[5, 3, 2], topk=topk,
                          seed=7, device=device, pattern=pattern)
        inputs = w.inputs()
        leg = legacy_indexer_topk(inputs)
        fu = fused_indexer_topk(inputs)
        fu4 = fused_indexer_topk(inputs, num_splits=4)
        fp = fused_indexer_topk(inputs, pool=64)
        ref, next_values = reference_with_next_values(*w.args(), **w.kwargs())
        cmp = compare_to_reference(leg, ref, next_values=next_values, inputs=w,
                                   **mma_tolerance(layout, device, ref, inputs=w))
        rec = dict(layout=layout, topk=topk, pattern=pattern, fused_eq_legacy=same_bits(fu, leg),
                   fused_split4_eq_legacy=same_bits(fu4, leg), fused_pool64_eq_legacy=same_bits(fp, leg),
                   legacy_vs_reference=cmp.ok, detail=cmp.summary())
        log(rec)
        rows.append(rec)
    return rows


def time_layout(layout, ctx, n_rows, topk, device, log, iters, only=None):
    from indexer_topk.backends.fused import fused_indexer_topk, fused_workspace_size
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from indexer_topk.contract import allocate_result
    from indexer_topk.workload import make_workload

    recs = []
    for pattern in ("random", "increasing"):
        w = make_workload(layout, context_tokens=[ctx], rows_per_request=[n_rows], topk=topk, seed=1,
                          device=device, pattern=pattern)
        inputs = w.inputs()
        # variant -> fused options (None: legacy); every variant keeps its outputs for the
        # bitwise check
        specs = {"fused": {}}
        if pattern == "random":
            # a buffer three times topk past it: fewer cuts and longer stretches between counter
            # reads, over the 16 MiB scratch budget, so a measurement only
            specs.update({"legacy": None, "fused_pool3k": dict(pool=3 * topk)})
        timed = [name for name in specs if not only or name in only]
        outputs = {name: allocate_result(w.rows, topk, device) for name in timed}
        scratch_out = allocate_result(w.rows, topk, device)

        def call(name):
            opts, out = specs[name], outputs.get(name, scratch_out)
            if opts is None:
                return lambda: legacy_indexer_topk(inputs, out=out)
            ws = torch.empty(fused_workspace_size(w.rows, topk, layout, device, **opts), dtype=torch.uint8,
                             device=device)
            return lambda: fused_indexer_topk(inputs, out=out, workspace=ws, **opts)

        for name in timed:
            fn = call(name)
            t0 = time.time()
            ms = bench_ms(fn, iters=iters)
            mem = peak_memory_mib(fn, device)
            rec = dict(layout=layout, pattern=pattern, variant=name, ms=ms, tflops=effective_tflops(w.rows, w.c4_len, ms),
                       peak_mib=mem, wall_s=time.time() - t0)
            log(rec)
            recs.append(rec)
            fn = None  # its workspace goes before the next variant's
        if pattern == "random" and "legacy" in timed:
            # the timed runs left their outputs in place: compare the selecting variants that ran
            flags = dict(fused_eq_legacy_full="fused", pool3k_eq_legacy_full="fused_pool3k")
            log(dict(layout=layout, pattern=pattern, **{flag: same_bits(outputs[name], outputs["legacy"])
                                                        for flag, name in flags.items() if name in outputs}))
            stages = time_legacy_stages(w, iters=iters)
            for name, key in (("legacy_score", "score_ms"), ("legacy_select", "select_ms"), ("torch_topk", "torch_topk_ms")):
                ms = stages[key]
                rec = dict(layout=layout, pattern=pattern, variant=name, ms=ms,
                           tflops=effective_tflops(w.rows, w.c4_len, ms) if name == "legacy_score" else None)
                log(rec)
                recs.append(rec)
        w = inputs = outputs = scratch_out = None  # free the large inputs before the next workload
        torch.cuda.empty_cache()
    return recs


def sweep_configs(layout, ctx, n_rows, topk, device, log, iters, configs):
    """Time the legacy score stage and the fused path under alternative tile configs."""
    from indexer_topk.backends.fused import fused_indexer_topk, fused_workspace_size
    from indexer_topk.backends.legacy import key_matrix_width, legacy_indexer_topk, legacy_score
    from indexer_topk.contract import Layout, allocate_result
    from indexer_topk.kernels import launch
    from indexer_topk.workload import make_workload

    w = make_workload(layout, context_tokens=[ctx], rows_per_request=[n_rows], topk=topk, seed=1, device=device)
    inputs = w.inputs()
    keys = torch.empty((w.rows, key_matrix_width(w.page_table)), dtype=torch.int32, device=device)
    ws = torch.empty(fused_workspace_size(w.rows, topk, layout, device), dtype=torch.uint8, device=device)
    out_f = allocate_result(w.rows, topk, device)
    out_l = allocate_result(w.rows, topk, device)
    saved = launch.TILE_CONFIGS[Layout(layout)]
    try:
        for spec in configs:
            rows, nw, ls, fs, *cap = (int(x) for x in spec.split(","))
            maxnreg = (cap[0] or None) if cap else saved.fused_maxnreg
            launch.TILE_CONFIGS[Layout(layout)] = launch.TileConfig(rows, nw, ls, fs, maxnreg)
            try:
                ms_s = bench_ms(lambda: legacy_score(inputs, keys=keys), iters=iters)
                ms_f = bench_ms(lambda: fused_indexer_topk(inputs, out=out_f, workspace=ws), iters=iters)
                legacy_indexer_topk(inputs, out=out_l)
                rec = dict(layout=layout, pattern="random", variant=f"cfg {spec}", ms=ms_f,
                           tflops=effective_tflops(w.rows, w.c4_len, ms_f), score_ms=ms_s,
                           score_tflops=effective_tflops(w.rows, w.c4_len, ms_s), fused_eq_legacy_full=same_bits(out_f, out_l))
            except Exception as e:  # a config that does not compile is a data point, not a crash
                rec = dict(layout=layout, variant=f"cfg {spec}", error=repr(e)[:300])
            log(rec)
    finally:
        launch.TILE_CONFIGS[Layout(layout)] = saved


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layouts", nargs="+", default=["sglang_fp8", "sglang_mxfp4", "aiter_mxfp4"])
    p.add_argument("--context", default="768K")
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--topk", type=int, default=1024)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--variants", nargs="*", default=[], help="time only these variants (default: all)")
    p.add_argument("--sweep", nargs="*", default=[], metavar="ROWS,WARPS,LEGACY_STAGES,FUSED_STAGES[,MAXNREG]",
                   help="tile configs to time")
    p.add_argument("--sweep-layouts", nargs="*", default=[])
    p.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "profile.json"))
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_kernels: needs a CUDA/HIP GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    records = []

    def log(rec):
        records.append(rec)
        print(json.dumps(rec), flush=True)

    if not a.skip_check:
        for layout in a.layouts:
            check_correctness(layout, a.topk, device, log)
    for layout in a.layouts:
        time_layout(layout, parse_tokens(a.context), a.rows, a.topk, device, log, a.iters, a.variants)
    for layout in a.sweep_layouts or a.layouts[:1]:
        if a.sweep:
            sweep_configs(layout, parse_tokens(a.context), a.rows, a.topk, device, log, a.iters, a.sweep)
    with open(a.json, "w") as f:
        json.dump(records, f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}  rows={a.rows} context={a.context} topk={a.topk}")
    print(f"{'layout':14s} {'pattern':11s} {'variant':18s} {'ms':>8s} {'TFLOP/s':>8s} {'peak MiB':>9s}")
    for r in records:
        if "variant" in r:
            if "error" in r:
                print(f"{r['layout']:14s} {'':11s} {r['variant']:18s} error: {r['error'][:80]}")
                continue
            tf = f"{r['tflops']:.0f}" if r.get("tflops") else "-"
            pm = f"{r['peak_mib']:.1f}" if r.get("peak_mib") is not None else "-"
            extra = f"  score {r['score_ms']:.3f} ms {r['score_tflops']:.0f} TF/s eq={r['fused_eq_legacy_full']}" if "score_ms" in r else ""
            print(f"{r['layout']:14s} {r['pattern']:11s} {r['variant']:18s} {r['ms']:8.3f} {tf:>8s} {pm:>9s}{extra}")
    flags = ("fused_eq_legacy", "fused_eq_legacy_full", "legacy_vs_reference", "fused_split4_eq_legacy",
             "fused_pool64_eq_legacy", "pool3k_eq_legacy_full")
    bad = [r for r in records if any(r.get(f) is False for f in flags)]
    print(f"correctness failures: {len(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
