#!/usr/bin/env python3
"""The fused backend's Hopper stream beside its plain-Triton kernel and legacy, one run (an sm_90 GPU).

    PYTHONPATH=python python3 benchmark/research/hopper_probe.py [--quick] [--skip-check] [--build NAME] [--no-select]
                                                        [--profile] [--rows-sweep]

First an exactness sweep on small shapes (every adversarial pattern, several requests so that
groups straddle requests, small pools that force cuts, split rows, topk 512 and 1024): the Hopper
stream's outputs against legacy's, bit for bit, into poisoned outputs. Then timings (median of
CUDA events) of legacy, the plain-Triton fused kernel (``fused``: ``INDEXER_TOPK_HOPPER_STREAM``
off) and one configuration of the stream (``BUILDS``: :class:`indexer_topk.kernels.hopper.HopperConfig`
fields) on the same inputs, each checked against legacy; ``<build>_no_select`` times it with its
selection taken out (a probe of the loads and MMAs alone; its outputs are undefined).
``--rows-sweep`` times legacy and the stream from 8 to 1024 rows at 64K and 768K tokens (where
the policy's row threshold comes from). JSON records go to ``$OUT/hopper_probe_<build>.json``.
``hopper_round.sh`` runs several builds, each in its own process under a time limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

from indexer_topk.bench.timing import effective_tflops, median_ms
from indexer_topk.compare import bitwise_equal


def run_fused(inputs, hopper: bool, build: str = "hopper", **kw):
    """The stream in configuration ``BUILDS[build]`` (over the layout's default), or (``hopper``
    False) the plain-Triton kernel."""
    from indexer_topk.backends.fused import fused_indexer_topk
    from indexer_topk.backends.fused import hopper_indexer_topk
    from indexer_topk.envs import envs
    from indexer_topk.kernels.hopper import HopperConfig

    if hopper:
        config = dataclasses.replace(HopperConfig.for_layout(inputs.layout), **BUILDS[build])
        return hopper_indexer_topk(inputs, config=config, **kw)
    with envs.INDEXER_TOPK_HOPPER_STREAM.override(False):
        return fused_indexer_topk(inputs, **kw)


def check(quick: bool, build: str, layout: str = "sglang_fp8") -> list:
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from indexer_topk.workload import make_workload

    cases = [  # tokens per request, rows per request, topk, pattern, fused kwargs
        ([20000], [16], 1024, "random", {}),
        ([9000, 30000, 4100], [5, 7, 3], 512, "random", {}),
        ([40000], [4], 512, "random", dict(pool=64)),
        ([30000], [6], 1024, "increasing", dict(pool=128)),
        ([30000], [6], 1024, "decreasing", {}),
        ([12000, 5000], [3, 3], 512, "equal", dict(pool=64)),
        ([12000], [5], 512, "zero_plateau", {}),
        ([12000], [4], 512, "nan_rows", {}),
        ([1500, 300, 64], [3, 2, 1], 512, "random", {}),  # rows shorter than topk
        ([200000], [2], 1024, "random", dict(num_splits=16)),
        ([50000, 70000], [1, 2], 512, "increasing", dict(num_splits=4, pool=64)),
    ]
    if quick:
        cases = cases[:3]
    records = []
    for i, (tokens, rows, topk, pattern, kw) in enumerate(cases):
        w = make_workload(layout, context_tokens=tokens, rows_per_request=rows, topk=topk, seed=10 + i,
                          device="cuda", pattern=pattern)
        ref = legacy_indexer_topk(w.inputs())
        try:
            from indexer_topk.contract import allocate_result

            out = allocate_result(w.rows, topk, "cuda")
            for t in (out.values, out.raw_indices, out.physical_indices, out.counts):
                t.view(torch.int32).fill_(-12345)  # poison: every element must be written
            run_fused(w.inputs(), True, build, out=out, **kw)
            torch.cuda.synchronize()
            rec = dict(case=i, tokens=tokens, rows=rows, topk=topk, pattern=pattern, kw=kw,
                       eq_legacy=bitwise_equal(out, ref))
        except Exception as e:
            rec = dict(case=i, tokens=tokens, rows=rows, topk=topk, pattern=pattern, kw=kw, error=repr(e)[:400])
        print(json.dumps(rec), flush=True)
        records.append(rec)
    return records


# Configurations of the stream by name: HopperConfig fields over the layout's default. ``hopper``
# is the default (the fastest measured); the builds of the rounds that found it (two MMA
# warpgroups, 8-bit and 512-bin cuts, per-slot barriers, for MXFP4 three warpgroups widening
# half a page at a time, ...) are in git history and results/NOTES.md.
BUILDS = {
    "hopper": {},
    "slots128": dict(score_slots=128),  # half the score ring
    "g16": dict(select_visits=16),  # 16 visits per selection step
    "kst12": dict(key_stages=12),  # a key ring twice as deep
    "slots256": dict(score_slots=256),  # MXFP4: the FP8 ring's depth
}


def timings(quick: bool, iters: int, only: int = 0, build: str = "hopper", baselines=("legacy", "fused"),
            no_select: bool = False, layout: str = "sglang_fp8") -> list:
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from indexer_topk.contract import allocate_result
    from indexer_topk.workload import make_workload

    cases = [  # tokens, rows, pattern
        (786432, 1024, "random"),
        (786432, 1024, "increasing"),
        (65536, 1024, "random"),
        (262144, 1024, "random"),
        (786432, 8, "random"),
        (786432, 8192, "random"),  # a chunked-prefill step
    ]
    if quick:
        cases = cases[:1]
    if only:
        cases = cases[:only]
    records = []
    for tokens, rows, pattern in cases:
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
                fn = lambda: run_fused(inputs, True, build, out=out, no_select=True)  # noqa: E731
            else:
                fn = lambda: run_fused(inputs, True, build, out=out)  # noqa: E731
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
    selection: where each partition's cycles go (:func:`profile_table`)."""
    from indexer_topk.kernels.launch import device_sm_count
    from indexer_topk.workload import make_workload

    records = []
    for tokens in tokens_list:
        w = make_workload("sglang_fp8", context_tokens=[tokens], rows_per_request=[1024], topk=1024, seed=1,
                          device="cuda", pattern="random")
        inputs = w.inputs()
        for no_select in (False, True):
            prof = torch.zeros(device_sm_count("cuda"), 5, 8, dtype=torch.int64, device="cuda")
            run_fused(inputs, True, build, no_select=no_select, profile=prof)  # compile and warm
            prof.zero_()
            torch.cuda.synchronize()
            run_fused(inputs, True, build, no_select=no_select, profile=prof)
            torch.cuda.synchronize()
            print(f"== {build} {tokens // 1024}K 1024 rows{' (selection taken out)' if no_select else ''}")
            print(profile_table(prof), flush=True)
            records.append(dict(build=build, tokens=tokens, no_select=no_select, **profile_fields(prof)))
        w = inputs = None
        torch.cuda.empty_cache()
    return records


PROFILE_FIELDS = (
    ("select", ("all", "wait tiles", "step cuts", "item ends", "cuts")),
    ("load", ("all", "wait key stage", "wait queries", "", "")),
    ("score 0", ("all", "wait keys", "mma", "wait slot", "releases")),
    ("score 1", ("all", "wait keys", "mma", "wait slot", "releases")),
    ("score 2", ("all", "wait keys", "mma", "wait slot", "releases")),
)


def _ran(profile: torch.Tensor) -> torch.Tensor:
    """The rows of ``profile`` of programs that ran (rows beyond the grid stay zero)."""
    return profile[profile[:, :, 0].sum(1) > 0]


def profile_means(profile: torch.Tensor) -> torch.Tensor:
    """``[5, 8]``: the ``PROF`` build's counters averaged over the programs that ran."""
    return _ran(profile).double().mean(0).cpu()


def _cut_detail(mean: torch.Tensor) -> dict:
    """Cycles of the step cuts in loading their buffer and in the threshold search: counter 7 of
    the selection's row and of the loader's (the selection's own counters are all taken)."""
    return {"step cut loads": mean[0, 7].item(), "step cut threshold": mean[1, 7].item()}


def profile_spans(profile: torch.Tensor) -> dict:
    """Microseconds on the global timer (counters 5 and 6: each partition's start and end): the
    kernel's span from the first start to the last end, the programs' spans (first partition start
    to last partition end) on average and at most, and how far apart the programs start and end."""
    t = _ran(profile)[:, :, 5:7].double().cpu() / 1e3
    seen = t[:, :, 1] > 0  # partitions that recorded nothing are left out
    start = torch.where(seen, t[:, :, 0], float("inf")).min(1).values
    end = torch.where(seen, t[:, :, 1], float("-inf")).max(1).values
    span = end - start
    return {"kernel us": (end.max() - start.min()).item(), "program us": span.mean().item(),
            "longest program us": span.max().item(), "start spread us": (start.max() - start.min()).item(),
            "end spread us": (end.max() - end.min()).item()}


def profile_fields(profile: torch.Tensor) -> dict:
    """The ``PROF`` counters averaged over programs, as record fields ``"<partition>:<region>"``
    (the step cuts' detail under ``select``), and the spans of :func:`profile_spans` as
    ``"timeline:<span>"``."""
    mean = profile_means(profile)
    fields = {f"{name}:{f}": mean[i, k].item() for i, (name, fields) in enumerate(PROFILE_FIELDS)
              for k, f in enumerate(fields) if f}
    fields.update({f"select:{k}": v for k, v in _cut_detail(mean).items()})
    return {**fields, **{f"timeline:{k}": v for k, v in profile_spans(profile).items()}}


def profile_table(profile: torch.Tensor) -> str:
    """The ``PROF`` build's counters, averaged over programs: each partition's cycles and the share
    of them spent in each timed region."""
    mean = profile_means(profile)
    lines = []
    for part, (name, fields) in enumerate(PROFILE_FIELDS):
        total = mean[part, 0].item()
        if total == 0:  # a partition that recorded nothing
            continue
        cells = [f"{name:8s} {total / 1e6:8.3f} Mcycles"]
        for k, f in enumerate(fields[1:], 1):
            if f == "cuts":
                cells.append(f"{f} {mean[part, k].item():.1f}")
            elif f:
                cells.append(f"{f} {100 * mean[part, k].item() / max(total, 1):5.1f}%")
        lines.append("  ".join(cells))
    lines.append("timeline " + "  ".join(f"{k} {v:.1f}" for k, v in profile_spans(profile).items()))
    cut = mean[0, 2].item()
    if cut > 0:
        detail = _cut_detail(mean)
        lines.append(f"step cuts  load {100 * detail['step cut loads'] / cut:5.1f}%  threshold "
                     f"{100 * detail['step cut threshold'] / cut:5.1f}%  per cut {cut / max(mean[0, 4].item(), 1e-9) / 1e3:.1f} Kcycles")
    return "\n".join(lines)


def rows_sweep(iters: int, layout: str = "sglang_fp8", contexts=(65536, 786432)) -> list:
    """Legacy and the stream (``fused``, as the package routes it) at 8 to 1024 rows, 64K and
    768K tokens (or ``contexts``), topk 1024, random scores: where the stream starts to win."""
    from indexer_topk.backends.fused import fused_indexer_topk
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from indexer_topk.contract import allocate_result
    from indexer_topk.workload import make_workload

    records = []
    print(f"{'tokens':>7s} {'rows':>5s} {'legacy':>8s} {'stream':>8s} {'ratio':>6s} eq")
    for tokens in contexts:
        for rows in (8, 32, 64, 128, 256, 512, 1024):
            w = make_workload(layout, context_tokens=[tokens], rows_per_request=[rows], topk=1024, seed=1,
                              device="cuda")
            inputs = w.inputs()
            ref = legacy_indexer_topk(inputs)
            out_l, out_f = allocate_result(rows, 1024, "cuda"), allocate_result(rows, 1024, "cuda")
            ms_l = median_ms(lambda: legacy_indexer_topk(inputs, out=out_l), warmup=2, iters=iters, device="cuda")
            ms_f = median_ms(lambda: fused_indexer_topk(inputs, out=out_f), warmup=2, iters=iters, device="cuda")
            eq = bitwise_equal(out_f, ref)
            records.append(dict(layout=layout, tokens=tokens, rows=rows, legacy_ms=ms_l, fused_ms=ms_f,
                                eq_legacy=eq))
            print(f"{tokens // 1024:6d}K {rows:5d} {ms_l:8.3f} {ms_f:8.3f} {ms_f / ms_l:6.2f} {'Y' if eq else 'N'}",
                  flush=True)
            w = inputs = ref = out_l = out_f = None
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
    p.add_argument("--rows-sweep", action="store_true", help="only legacy and the stream from 8 to 1024 rows")
    p.add_argument("--layout", default="sglang_fp8", choices=["sglang_fp8", "sglang_mxfp4"],
                   help="the cache layout of the check, timing and rows-sweep cases")
    p.add_argument("--contexts", default="65536,786432", help="rows sweep: comma-separated tokens per request")
    a = p.parse_args(argv)
    if a.profile:
        recs = profile(a.build)
        with open(os.path.join(os.environ.get("OUT", "."), f"hopper_profile_{a.build}.json"), "w") as f:
            json.dump(recs, f, indent=1)
        return 0
    if a.rows_sweep:
        recs = rows_sweep(a.iters, a.layout, [int(t) for t in a.contexts.split(",")])
        tag = "" if a.layout == "sglang_fp8" else f"_{a.layout}"
        with open(os.path.join(os.environ.get("OUT", "."), f"hopper_rows_sweep{tag}.json"), "w") as f:
            json.dump(recs, f, indent=1)
        return 0
    checks = [] if a.skip_check else check(a.quick, a.build, a.layout)
    times = [] if a.skip_time else timings(a.quick, a.iters, a.cases, a.build,
                                          [b for b in a.baselines.split(",") if b], a.no_select, a.layout)
    tag = a.build if a.layout == "sglang_fp8" else f"{a.layout}_{a.build}"
    with open(os.path.join(os.environ.get("OUT", "."), f"hopper_probe_{tag}.json"), "w") as f:
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
