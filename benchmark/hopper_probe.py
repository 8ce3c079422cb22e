#!/usr/bin/env python3
"""The warp-specialised Hopper kernel beside the plain-Triton fused kernel and legacy, one run.

    PYTHONPATH=python python3 benchmark/hopper_probe.py [--quick] [--skip-check]

First an exactness sweep on small shapes (every adversarial pattern, several requests so that
groups straddle requests, small pools that force cuts, split rows, topk 512 and 1024): the Hopper
kernel's outputs against legacy's, bit for bit. Then timings (median of CUDA events) of legacy,
the package's fused kernel and the Hopper stream (``hopper_stream.py``) on the same inputs, each
checked against legacy; ``hopper_no_select`` times the Hopper stream with its selection taken
out (a probe of the loads and MMAs alone; its outputs are undefined), ``hopper_slots32`` with a
score ring twice as deep. JSON records go to ``$OUT/hopper_probe.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from indexer_topk.bench.timing import effective_tflops, median_ms
from indexer_topk.compare import bitwise_equal


def run_fused(inputs, hopper: bool, **kw):
    from indexer_topk.backends.fused import fused_indexer_topk

    from hopper_stream import hopper_indexer_topk

    return hopper_indexer_topk(inputs, **kw) if hopper else fused_indexer_topk(inputs, **kw)


def check(quick: bool) -> list:
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from indexer_topk.workload import make_workload

    cases = [  # layout, tokens per request, rows per request, topk, pattern, fused kwargs
        ("sglang_fp8", [20000], [16], 1024, "random", {}),
        ("sglang_fp8", [9000, 30000, 4100], [5, 7, 3], 512, "random", {}),
        ("sglang_fp8", [40000], [4], 512, "random", dict(pool=64)),
        ("sglang_fp8", [30000], [6], 1024, "increasing", dict(pool=128)),
        ("sglang_fp8", [30000], [6], 1024, "decreasing", {}),
        ("sglang_fp8", [12000, 5000], [3, 3], 512, "equal", dict(pool=64)),
        ("sglang_fp8", [12000], [5], 512, "zero_plateau", {}),
        ("sglang_fp8", [12000], [4], 512, "nan_rows", {}),
        ("sglang_fp8", [1500, 300, 64], [3, 2, 1], 512, "random", {}),  # rows shorter than topk
        ("sglang_fp8", [200000], [2], 1024, "random", dict(num_splits=16)),
        ("sglang_fp8", [50000, 70000], [1, 2], 512, "increasing", dict(num_splits=4, pool=64)),
    ]
    if quick:
        cases = cases[:3]
    records = []
    for i, (layout, tokens, rows, topk, pattern, kw) in enumerate(cases):
        w = make_workload(layout, context_tokens=tokens, rows_per_request=rows, topk=topk, seed=10 + i,
                          device="cuda", pattern=pattern)
        ref = legacy_indexer_topk(w.inputs())
        try:
            from indexer_topk.contract import allocate_result

            out = allocate_result(w.rows, topk, "cuda")
            for t in (out.values, out.raw_indices, out.physical_indices, out.counts):
                t.view(torch.int32).fill_(-12345)  # poison: every element must be written
            run_fused(w.inputs(), True, out=out, **kw)
            torch.cuda.synchronize()
            rec = dict(case=i, tokens=tokens, rows=rows, topk=topk, pattern=pattern, kw=kw,
                       eq_legacy=bitwise_equal(out, ref))
        except Exception as e:
            rec = dict(case=i, tokens=tokens, rows=rows, topk=topk, pattern=pattern, kw=kw, error=repr(e)[:400])
        print(json.dumps(rec), flush=True)
        records.append(rec)
    return records


# Builds not yet measured on a device, timed (and checked) beside the kept one at the first shape
# with --variants: hopper_stream.hopper_indexer_topk keyword arguments.
UNTESTED = {
    "hopper_regs120": dict(score_regs=120),  # the selection at 232 registers: no spill in an sm_90 compile
    "hopper_cut_call": dict(cut_call=True),
    "hopper_split2": dict(select_split=2),
    "hopper_g8_regs120": dict(select_visits=8, score_slots=32, score_regs=120),
    "hopper_g8_split2_regs120": dict(select_visits=8, score_slots=32, select_split=2, score_regs=120),
    "hopper_selectors2": dict(selectors=2, score_regs=120, select_regs=104, cut_call=True),
}


def timings(quick: bool, iters: int, only: int = 0, variants: bool = False) -> list:
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from indexer_topk.contract import allocate_result
    from indexer_topk.workload import make_workload

    cases = [  # layout, tokens, rows, pattern
        ("sglang_fp8", 786432, 1024, "random"),
        ("sglang_fp8", 786432, 1024, "increasing"),
        ("sglang_fp8", 65536, 1024, "random"),
        ("sglang_fp8", 262144, 1024, "random"),
        ("sglang_fp8", 786432, 8, "random"),
    ]
    if quick:
        cases = cases[:1]
    if only:
        cases = cases[:only]
    records = []
    for k, (layout, tokens, rows, pattern) in enumerate(cases):
        w = make_workload(layout, context_tokens=[tokens], rows_per_request=[rows], topk=1024, seed=1,
                          device="cuda", pattern=pattern)
        inputs = w.inputs()
        ref = legacy_indexer_topk(inputs)
        names = ["legacy", "fused", "hopper", "hopper_no_select", "hopper_slots32"]
        if variants and k == 0:
            names += list(UNTESTED)
        for name in names:
            out = allocate_result(w.rows, 1024, "cuda")
            if name == "legacy":
                fn = lambda: legacy_indexer_topk(inputs, out=out)  # noqa: E731
            elif name in UNTESTED:
                fn = lambda kw=UNTESTED[name]: run_fused(inputs, True, out=out, **kw)  # noqa: E731
            elif name == "hopper_slots32":  # a deeper score ring
                fn = lambda: run_fused(inputs, True, out=out, score_slots=32)  # noqa: E731
            elif name == "hopper_no_select":  # a timing probe: outputs undefined
                fn = lambda: run_fused(inputs, True, out=out, no_select=True)  # noqa: E731
            else:
                fn = lambda h=(name == "hopper"): run_fused(inputs, h, out=out)  # noqa: E731
            try:
                ms = median_ms(fn, warmup=2, iters=iters, device="cuda")
                rec = dict(layout=layout, tokens=tokens, rows=rows, pattern=pattern, variant=name, ms=ms,
                           tflops=effective_tflops(w.rows, w.c4_len, ms), eq_legacy=bitwise_equal(out, ref))
            except Exception as e:
                rec = dict(layout=layout, tokens=tokens, rows=rows, pattern=pattern, variant=name, error=repr(e)[:300])
            print(json.dumps(rec), flush=True)
            records.append(rec)
        w = inputs = ref = out = fn = None
        torch.cuda.empty_cache()
    return records


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--skip-time", action="store_true")
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--cases", type=int, default=0, help="time only the first N shapes")
    p.add_argument("--variants", action="store_true", help="also the builds in UNTESTED, at the first shape")
    a = p.parse_args(argv)
    checks = [] if a.skip_check else check(a.quick)
    times = [] if a.skip_time else timings(a.quick, a.iters, a.cases, a.variants)
    with open(os.path.join(os.environ.get("OUT", "."), "hopper_probe.json"), "w") as f:
        json.dump(dict(checks=checks, timings=times), f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}")
    bad = [c for c in checks if not c.get("eq_legacy")]
    print(f"exactness: {len(checks) - len(bad)}/{len(checks)} cases bitwise equal to legacy")
    for c in bad:
        print("  FAILED", c)
    print(f"{'tokens':>7s} {'rows':>5s} {'pattern':10s} {'variant':8s} {'ms':>7s} {'TF/s':>5s} eq")
    for r in times:
        head = f"{r['tokens'] // 1024:6d}K {r['rows']:5d} {r['pattern']:10s} {r['variant']:8s}"
        if "error" in r:
            print(head, "error", r["error"][:80])
        else:
            print(f"{head} {r['ms']:7.3f} {r['tflops']:5.0f} {'Y' if r['eq_legacy'] else 'N'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
