#!/usr/bin/env python3
"""Where a decode step's time goes, per kernel, and whether a one-row score tile gives the
two-row tile's bits.

    PYTHONPATH=python python3 benchmark/research/decode_probe.py [--shapes 8x768K,64x768K,256x128K]
        [--layouts sglang_fp8] [--variants legacy,fused,plain,plain_r1] [--bits-layouts ...]

Variants (each bit-compared with legacy on the same batch):

* ``legacy``: key matrix, then the per-row select;
* ``fused``: the fused backend without a hint (the Hopper stream where it applies; two rows
  per work item, each scored in its own pass where their pages differ);
* ``fused_r1``: the same with ``rows_per_request=1`` (one row per work item, ``R = 1``);
* ``plain_r1``: the plain-Triton fused kernel (``INDEXER_TOPK_HOPPER_STREAM=0``) with ``R = 1``.

``--bits-layouts``: for each layout, the legacy key matrix of a decode batch scored with
``R = 1`` against ``R = 2`` (random pages, several score patterns): whether a row's score bits
depend on the tile's width. ``--sweep`` times the Hopper stream's plan at the shapes (``R = 1``
for one row per request, else the two-row tile, as the package plans them) with other split
counts (``--sweep-splits``, multiples of the one-wave plan's) and stream configurations
(``--sweep-configs``, ``;``-separated ``HopperConfig`` overrides, the call's ``pool`` or
``merge_warps`` (the fused backend's ``MERGE_WARPS``), such as ``key_stages=12,select_visits=16``;
empty: the layout's default), each bit-compared with legacy.
``--profile`` prints the stream's partition timers (its ``PROF`` compile; ``--pool`` the call's) for the decode plan at
the shapes, with and without its selection (``hopper_probe.py``'s table). Device time per kernel comes from ``torch.profiler`` over
``--iters`` warm calls; the table is printed last, the JSON goes to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import indexer_topk  # noqa: E402
from indexer_topk.backends import fused as fused_backend  # noqa: E402
from indexer_topk.backends import legacy as legacy_backend  # noqa: E402
from indexer_topk.bench.timing import median_ms  # noqa: E402
from indexer_topk.compare import bitwise_equal  # noqa: E402
from indexer_topk.kernels.launch import tile_config  # noqa: E402
from indexer_topk.workload import make_workload  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # hopper_probe
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # decode_bench
from decode_bench import parse_shape  # noqa: E402


@contextlib.contextmanager
def tile_rows(module, rows: int):
    """``module``'s tile config with ``rows`` query rows per tile, for the length of the block."""
    saved = module.tile_config
    module.tile_config = lambda layout: dataclasses.replace(tile_config(layout), rows=rows)
    try:
        yield
    finally:
        module.tile_config = saved


@contextlib.contextmanager
def env(name, value):
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def variant_context(name):
    if name.startswith("plain"):
        return env("INDEXER_TOPK_HOPPER_STREAM", "0")
    return contextlib.nullcontext()


def kernel_times(fn, iters):
    """Mean device ms per call of each kernel ``fn`` launches."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    acc = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            acc[ev.name.split("(")[0][:40]] += ev.device_time_total / 1e3
    return {k: v / iters for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}


def bits_check(layouts, device, seed):
    """Legacy key matrices at R = 1 and R = 2 on decode batches: equal bit for bit?"""
    out = []
    for layout in layouts:
        for pattern in ("random", "increasing", "equal", "zero_plateau"):
            w = make_workload(layout, context_tokens=[65536 + 4 * 37 * i for i in range(12)],
                              rows_per_request=[1, 2, 1, 3, 1, 1, 2, 1, 1, 1, 4, 1], topk=1024, seed=seed,
                              device=device, pattern=pattern)
            inputs = w.inputs()
            k2 = legacy_backend.legacy_score(inputs).clone()
            with tile_rows(legacy_backend, 1):
                k1 = legacy_backend.legacy_score(inputs).clone()
            diff = int((k1 != k2).sum())
            out.append({"layout": layout, "pattern": pattern, "elements": k1.numel(), "differ": diff})
            print(f"bits R=1 vs R=2 {layout:13s} {pattern:10s}: {diff} of {k1.numel()} differ", flush=True)
    return out


def profile(a, device) -> int:
    """Partition timers of the stream's decode plan (see the module docstring)."""
    from hopper_probe import profile_fields, profile_table
    from indexer_topk.backends.fused import hopper_indexer_topk
    from indexer_topk.kernels.launch import device_sm_count

    records = []
    for layout in a.layouts.split(","):
        for requests, tokens, per_request in (parse_shape(s) for s in a.shapes.split(",")):
            w = make_workload(layout, context_tokens=[tokens] * requests, rows_per_request=[per_request] * requests,
                              topk=a.topk, seed=a.seed, device=device)
            inputs = w.inputs()
            for no_select in (False, True):
                prof = torch.zeros(device_sm_count(device), 5, 8, dtype=torch.int64, device=device)
                for _ in range(2):  # compile and warm, then the counted run
                    prof.zero_()
                    torch.cuda.synchronize()
                    hopper_indexer_topk(inputs, no_select=no_select, profile=prof, rows_per_request=per_request,
                                        pool=a.pool)
                    torch.cuda.synchronize()
                shape = f"{requests}x{tokens // 1024}K"
                print(f"== {layout} {shape}, {per_request} row(s) per request"
                      f"{' (selection taken out)' if no_select else ''}")
                print(profile_table(prof), flush=True)
                records.append(dict(layout=layout, shape=shape, no_select=no_select, **profile_fields(prof)))
            w = inputs = None
            torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps({"profile": records}, indent=1) + "\n")
    return 0


def sweep(a, device) -> int:
    """Device ms (sum of kernel times) of the stream's decode plan variants; see the docstring."""
    from indexer_topk.backends.fused import hopper_indexer_topk
    from indexer_topk.backends.hopper import hopper_kernels

    H = hopper_kernels()
    default_merge_warps = fused_backend.MERGE_WARPS
    rows_out = []
    for layout in a.layouts.split(","):
        for requests, tokens, per_request in (parse_shape(s) for s in a.shapes.split(",")):
            # one row per request: the decode plan (R = 1); more (MTP, prefill): the two-row tile
            group = fused_backend.group_rows_for(per_request, tile_config(layout).rows)
            base_cfg = H.HopperConfig.for_layout(layout, rows=group)
            w = make_workload(layout, context_tokens=[tokens] * requests, rows_per_request=[per_request] * requests,
                              topk=a.topk, seed=a.seed, device=device)
            inputs = w.inputs()
            ref = legacy_backend.legacy_indexer_topk(inputs)
            wave = fused_backend.plan_fused(w.rows, w.topk, device, group_rows=group, one_wave=group == 1).splits
            for mult in (int(x) for x in a.sweep_splits.split(",")):
                splits = min(64, wave * mult)
                for text in a.sweep_configs.split(";"):
                    over = {k: int(v) for k, v in (x.split("=") for x in text.split(",") if x)}
                    pool = over.pop("pool", None)  # the call's candidate room, the rest HopperConfig fields
                    # the few-program merge levels' warps (the fused backend's MERGE_WARPS)
                    fused_backend.MERGE_WARPS = over.pop("merge_warps", default_merge_warps)
                    out = indexer_topk.allocate_result(w.rows, w.topk, device)
                    ws = torch.empty(fused_backend.fused_workspace_size(w.rows, w.topk, layout, device, 64, pool),
                                     dtype=torch.uint8, device=device)

                    def call():
                        hopper_indexer_topk(inputs, out=out, workspace=ws, num_splits=splits, pool=pool,
                                            config=dataclasses.replace(base_cfg, **over), rows_per_request=per_request)
                    try:
                        call()
                        torch.cuda.synchronize()
                        kt = kernel_times(call, a.iters)
                        ms, same = sum(kt.values()), bitwise_equal(out, ref)
                    except Exception as exc:  # a variant that does not build or fit is reported, not fatal
                        ms, same, kt = float("nan"), None, {"error": f"{type(exc).__name__}: {exc}"[:200]}
                    rec = {"layout": layout, "shape": f"{requests}x{tokens // 1024}K", "splits": splits,
                           "config": text or "default", "device_ms": ms, "matches_legacy": same, "kernels": kt}
                    rows_out.append(rec)
                    print(f"sweep {rec['layout']} {rec['shape']} splits {splits:3d} {rec['config']}: "
                          f"{ms:.3f} ms eq={same} {kt}", flush=True)
            w = ref = inputs = None
            torch.cuda.empty_cache()
    fused_backend.MERGE_WARPS = default_merge_warps
    Path(a.out).write_text(json.dumps({"sweep": rows_out}, indent=1) + "\n")
    print(f"\n{'layout':12s} {'shape':9s} {'splits':>6s} {'config':24s} {'device ms':>9s} eq")
    for r in rows_out:
        print(f"{r['layout']:12s} {r['shape']:9s} {r['splits']:6d} {r['config']:24s} {r['device_ms']:9.3f} "
              f"{r['matches_legacy']}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="8x768K,64x768K,256x128K")
    p.add_argument("--layouts", default="sglang_fp8")
    p.add_argument("--variants", default="legacy,fused,fused_r1,plain_r1")
    p.add_argument("--bits-layouts", default="sglang_fp8,sglang_mxfp4,aiter_mxfp4")
    p.add_argument("--topk", type=int, default=1024)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "decode_probe.json"))
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--sweep-splits", default="1,2,4", help="multiples of the one-wave plan's splits")
    p.add_argument("--sweep-configs", default=";key_stages=12", help="';'-separated HopperConfig overrides")
    p.add_argument("--pool", type=int, help="--profile: the call's candidate room (default: the package's)")
    a = p.parse_args(argv)
    device = "cuda"
    if a.sweep:
        return sweep(a, device)
    if a.profile:
        return profile(a, device)
    result = {"bits": bits_check([x for x in a.bits_layouts.split(",") if x], device, a.seed), "runs": []}
    table = []
    for layout in a.layouts.split(","):
        for requests, tokens, per_request in (parse_shape(s) for s in a.shapes.split(",")):
            w = make_workload(layout, context_tokens=[tokens] * requests, rows_per_request=[per_request] * requests,
                              topk=a.topk, seed=a.seed, device=device)
            ref = None
            for name in a.variants.split(","):
                backend = "legacy" if name == "legacy" else "fused"
                out = indexer_topk.allocate_result(w.rows, w.topk, device)
                with variant_context(name):
                    nbytes = fused_backend.fused_workspace_size(w.rows, w.topk, layout, device=device) if backend == "fused" else 0
                    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device) if backend == "fused" else None

                    def call():
                        indexer_topk.indexer_topk(*w.args(), topk=w.topk, layout=layout, weight_scale=w.weight_scale,
                                                  backend=backend, out=out, workspace=ws, check_values=False,
                                                  rows_per_request=1 if name.endswith("_r1") else None)
                    call()
                    torch.cuda.synchronize()
                    ms = median_ms(call, warmup=2, iters=a.iters, device=device)
                    kt = kernel_times(call, a.iters)
                if ref is None:
                    ref = type(out)(*(t.clone() for t in out))
                same = bitwise_equal(out, ref)
                shape = f"{requests}x{tokens // 1024}K"
                rec = {"layout": layout, "shape": shape, "variant": name, "ms": ms, "kernels": kt, "matches_legacy": same}
                result["runs"].append(rec)
                table.append(rec)
                print(f"{layout} {shape} {name}: {ms:.3f} ms eq={same} " +
                      ", ".join(f"{k} {v:.3f}" for k, v in kt.items()), flush=True)
            w = ref = None
            torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{'layout':12s} {'shape':9s} {'variant':9s} {'ms':>8s} eq  top kernels")
    for r in table:
        top = ", ".join(f"{k} {v:.3f}" for k, v in list(r["kernels"].items())[:3])
        print(f"{r['layout']:12s} {r['shape']:9s} {r['variant']:9s} {r['ms']:8.3f} {'Y' if r['matches_legacy'] else 'N'}   {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
