#!/usr/bin/env python3
"""The warp-specialised Hopper kernel beside the plain-Triton fused kernel and legacy, one run.

    PYTHONPATH=python python3 benchmark/hopper_probe.py [--quick] [--skip-check] [--build NAME] [--no-select] [--profile]

First an exactness sweep on small shapes (every adversarial pattern, several requests so that
groups straddle requests, small pools that force cuts, split rows, topk 512 and 1024): the Hopper
kernel's outputs against legacy's, bit for bit. Then timings (median of CUDA events) of legacy,
the package's fused kernel and one build of the Hopper stream (``hopper_stream.py``, ``BUILDS``)
on the same inputs, each checked against legacy; ``<build>_no_select`` times the build with its
selection taken out (a probe of the loads and MMAs alone; its outputs are undefined). JSON
records go to ``$OUT/hopper_probe_<build>.json``. ``hopper_round.sh`` runs several builds, each in
its own process under a time limit.
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


def check(quick: bool, build_kw: dict) -> list:
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
            run_fused(w.inputs(), True, out=out, **{**build_kw, **kw})
            torch.cuda.synchronize()
            rec = dict(case=i, tokens=tokens, rows=rows, topk=topk, pattern=pattern, kw=kw,
                       eq_legacy=bitwise_equal(out, ref))
        except Exception as e:
            rec = dict(case=i, tokens=tokens, rows=rows, topk=topk, pattern=pattern, kw=kw, error=repr(e)[:400])
        print(json.dumps(rec), flush=True)
        records.append(rec)
    return records


# Three score warpgroups (the tensor core idles while two take turns): 104 registers each, 24 for the loader.
S3 = dict(score_groups=3, score_regs=104, load_regs=24)
# The best of the first three-warpgroup round (4.74 ms at 768K): the cut from the highest differing
# byte, one exchange of the parts' counts, keys reloaded after a cut, a 128-slot score ring.
S3R = dict(S3, cut=1, one_exchange=True, reload_after_cut=True, score_slots=128)
# The best of the next two (4.46 ms): 4-bit digits in the cut, a 256-slot ring, 8 visits per step.
S3B = dict(S3R, cut=2, score_slots=256, select_visits=8)
# Builds of the Hopper stream by name: hopper_stream.hopper_indexer_topk keyword arguments. ``hopper``
# is the kept one; ``--build`` picks the one the sweep checks and the timings run.
BUILDS = {
    "hopper": S3B,  # the kept build
    "hopper_2wg": {},  # the kept build until S3B: two MMA warpgroups, 16 visits per step dealt to 4 warps
    "kst8": dict(key_stages=8),  # the kept build with a key ring twice as deep
    "s3": S3,
    "s3_g8": dict(S3, select_visits=8),
    "s3_slots128": dict(S3, score_slots=128),
    # (the three builds above ran with 4 key stages, which three warpgroups cannot share: see hopper_stream)
    # (weights in shared memory for 96-register score threads, "s3w96", lost: 5.42 ms; gone, see NOTES)
    # prepared without a device (sm_90 compiles only; not yet run): the cut from the highest
    # differing digit, 8-bit digits in 256 bins (cut=1) or 4-bit in 16 (cut=2)
    "s3_cut1": dict(S3, cut=1),
    "s3_cut2": dict(S3, cut=2),
    # ... the parts' counts met in one exchange per step
    "s3_xchg": dict(S3, one_exchange=True),
    "s3_cut1_xchg": dict(S3, cut=1, one_exchange=True),
    # ... and a cut that reloads its step's keys from the ring (half the selection's spills at 144 registers)
    "s3_cut1_xchg_reload": dict(S3, cut=1, one_exchange=True, reload_after_cut=True),
    "s3_cut1_xchg_reload_slots128": S3R,
    # around it: 4-bit digits, a score ring twice as deep (220 KB of shared memory), 8 visits per step
    "s3_cut2_xchg_reload_slots128": dict(S3R, cut=2),
    "s3_cut1_xchg_reload_slots256": dict(S3R, score_slots=256),
    "s3_cut1_xchg_reload_slots128_g8": dict(S3R, select_visits=8),
    # 4-bit digits won the round above (4.57 ms): with the deeper ring and the shorter step
    "s3_cut2_xchg_reload_slots128_g8": dict(S3R, cut=2, select_visits=8),
    "s3_cut2_xchg_reload_slots256": dict(S3R, cut=2, score_slots=256),
    "s3_cut2_xchg_reload_slots256_g8": S3B,
    # ... a step with nothing past the gate skips its scan and stores; twice the pool (half the cuts,
    # but a 4096-entry cut tile: 185 local loads in the sm_90 compile)
    "s3_cut2_xchg_reload_slots256_g8_skip": dict(S3B, skip_empty=True),
    "s3_cut2_xchg_reload_slots256_g8_pool2048": dict(S3B, pool=2048),
    # 8 visits per step: half the step's registers (the 144-register selection spills in its step at 16)
    "s3_cut1_xchg_g8": dict(S3, cut=1, one_exchange=True, select_visits=8),
    "g4": dict(select_visits=4, select_parts=1, step_barriers=False),  # each row's work repeated on two warps (fdc6f40's selection)
    "g4_parts2": dict(select_visits=4, select_parts=2, step_barriers=False),
    "g8_parts2": dict(select_visits=8, select_parts=2, step_barriers=False),
    "g8_parts4": dict(select_visits=8, select_parts=4, step_barriers=False),
    "g16_parts4": dict(select_visits=16, select_parts=4, step_barriers=False),  # a barrier pair per slot
    "regs168": dict(score_regs=168),  # the score warpgroups' registers of the first builds
    "g16_parts4_stepbar": dict(select_visits=16, select_parts=4, step_barriers=True),  # the kept build, named
}


def timings(quick: bool, iters: int, only: int = 0, build: str = "hopper", baselines=("legacy", "fused"),
            no_select: bool = False) -> list:
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from indexer_topk.contract import allocate_result
    from indexer_topk.workload import make_workload

    cases = [  # layout, tokens, rows, pattern
        ("sglang_fp8", 786432, 1024, "random"),
        ("sglang_fp8", 786432, 1024, "increasing"),
        ("sglang_fp8", 65536, 1024, "random"),
        ("sglang_fp8", 262144, 1024, "random"),
        ("sglang_fp8", 786432, 8, "random"),
        ("sglang_fp8", 786432, 8192, "random"),  # a chunked-prefill step
    ]
    if quick:
        cases = cases[:1]
    if only:
        cases = cases[:only]
    records = []
    kw = BUILDS[build]
    for layout, tokens, rows, pattern in cases:
        w = make_workload(layout, context_tokens=[tokens], rows_per_request=[rows], topk=1024, seed=1,
                          device="cuda", pattern=pattern)
        inputs = w.inputs()
        ref = legacy_indexer_topk(inputs)
        names = list(baselines) + [build] + ([build + "_no_select"] if no_select else [])
        for name in names:
            out = allocate_result(w.rows, 1024, "cuda")
            if name == "legacy":
                fn = lambda: legacy_indexer_topk(inputs, out=out)  # noqa: E731
            elif name == "fused":
                fn = lambda: run_fused(inputs, False, out=out)  # noqa: E731
            elif name.endswith("_no_select"):  # a timing probe of the loads and MMAs: outputs undefined
                fn = lambda: run_fused(inputs, True, out=out, no_select=True, **kw)  # noqa: E731
            else:
                fn = lambda: run_fused(inputs, True, out=out, **kw)  # noqa: E731
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


def profile(build: str, tokens_list=(786432, 65536)) -> list:
    """Partition timers of the build (its ``PROF`` compile) at 1024 rows, with and without its
    selection: where each partition's cycles go (``hopper_stream.profile_table``)."""
    from hopper_stream import PROFILE_FIELDS, hopper_indexer_topk, profile_means, profile_table
    from indexer_topk.kernels.launch import device_sm_count
    from indexer_topk.workload import make_workload

    records = []
    for tokens in tokens_list:
        w = make_workload("sglang_fp8", context_tokens=[tokens], rows_per_request=[1024], topk=1024, seed=1,
                          device="cuda", pattern="random")
        inputs = w.inputs()
        for no_select in (False, True):
            prof = torch.zeros(device_sm_count("cuda"), 5, 8, dtype=torch.int64, device="cuda")
            kw = dict(BUILDS[build], no_select=no_select, profile=prof)
            hopper_indexer_topk(inputs, **kw)  # compile and warm
            prof.zero_()
            torch.cuda.synchronize()
            hopper_indexer_topk(inputs, **kw)
            torch.cuda.synchronize()
            print(f"== {build} {tokens // 1024}K 1024 rows{' (selection taken out)' if no_select else ''}")
            print(profile_table(prof), flush=True)
            mean = profile_means(prof)
            records.append(dict(build=build, tokens=tokens, no_select=no_select, **{
                f"{name}:{f}": mean[i, k].item() for i, (name, fields) in enumerate(PROFILE_FIELDS)
                for k, f in enumerate(fields) if f}))
        w = inputs = None
        torch.cuda.empty_cache()
    return records


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--skip-time", action="store_true")
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--cases", type=int, default=0, help="time only the first N shapes")
    p.add_argument("--build", default="hopper", choices=sorted(BUILDS), help="the build checked and timed")
    p.add_argument("--baselines", default="legacy,fused", help="comma-separated: legacy, fused (or empty)")
    p.add_argument("--no-select", action="store_true", help="also time the build with its selection taken out")
    p.add_argument("--profile", action="store_true", help="only the partition timers of the build (PROF compile)")
    a = p.parse_args(argv)
    if a.profile:
        recs = profile(a.build)
        with open(os.path.join(os.environ.get("OUT", "."), f"hopper_profile_{a.build}.json"), "w") as f:
            json.dump(recs, f, indent=1)
        return 0
    checks = [] if a.skip_check else check(a.quick, BUILDS[a.build])
    times = [] if a.skip_time else timings(a.quick, a.iters, a.cases, a.build,
                                          [b for b in a.baselines.split(",") if b], a.no_select)
    with open(os.path.join(os.environ.get("OUT", "."), f"hopper_probe_{a.build}.json"), "w") as f:
        json.dump(dict(checks=checks, timings=times), f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}")
    bad = [c for c in checks if not c.get("eq_legacy")]
    print(f"exactness: {len(checks) - len(bad)}/{len(checks)} cases bitwise equal to legacy")
    for c in bad:
        print("  FAILED", c)
    print(f"{'tokens':>7s} {'rows':>5s} {'pattern':10s} {'variant':16s} {'ms':>7s} {'TF/s':>5s} eq")
    for r in times:
        head = f"{r['tokens'] // 1024:6d}K {r['rows']:5d} {r['pattern']:10s} {r['variant']:16s}"
        if "error" in r:
            print(head, "error", r["error"][:80])
        else:
            print(f"{head} {r['ms']:7.3f} {r['tflops']:5.0f} {'Y' if r['eq_legacy'] else 'N'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
