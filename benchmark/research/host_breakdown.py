#!/usr/bin/env python3
"""Where a replayed call's host time goes, on a GPU; and legacy's k-th key searches, GPU time.

    PYTHONPATH=python python3 benchmark/research/host_breakdown.py [--cases sglang_fp8:128:16K:legacy,...] [--kth]

Host time of: the out operator and the Python API called directly (each the median run of 20
back-to-back calls, the two in turn over 10 rounds, first each in every other); the
API with the replay's launches left out, the replay alone and each recorded step alone (an
allocation, or a launch with its argument and descriptor counts; each the mean wall time of 200
calls in runs of 20). A case is
``layout:rows:tokens:backend`` (``decode`` after the rows: one row per request); the backend may
be ``auto``. ``--kth``: then legacy at prefill shapes, its k-th key found by torch.topk or by the
select kernel's radix passes, each replayed from a CUDA graph (GPU time only).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import indexer_topk  # noqa: E402
from indexer_topk import api, calls, replay  # noqa: E402
from indexer_topk.backends import legacy as legacy_backend  # noqa: E402
from indexer_topk.bench.mix import graph_ms, host_us  # noqa: E402
from indexer_topk.contract import allocate_result  # noqa: E402
from indexer_topk.options import parse_tokens  # noqa: E402

CASES = ("sglang_fp8:128:16K:fused,sglang_fp8:1024:64K:fused,sglang_fp8:8decode:768K:fused,sglang_mxfp4:128:16K:fused,"
         "aiter_mxfp4:128:16K:fused,sglang_fp8:128:16K:legacy")
from indexer_topk.workload import make_workload  # noqa: E402

ROUNDS = 10


def setup(layout, rows, tokens, decode):
    w = (make_workload(layout, context_tokens=[tokens] * rows, rows_per_request=[1] * rows, topk=1024, device="cuda")
         if decode else make_workload(layout, context_tokens=[tokens], rows_per_request=[rows], topk=1024, device="cuda"))
    out = allocate_result(w.rows, w.topk, "cuda")
    ws = torch.empty(indexer_topk.workspace_size(w.rows, w.topk, layout), dtype=torch.uint8, device="cuda")
    return w, out, ws, (1 if decode else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--kth", action="store_true")
    a = ap.parse_args()
    print(f"{'case':34s} {'op':>7s} {'api':>7s} {'no-launch':>9s} {'replay':>7s}  per step")
    for case in a.cases.split(","):
        layout, rows, tokens, backend = case.split(":")
        decode = rows.endswith("decode")
        rows, tokens = int(rows.removesuffix("decode")), parse_tokens(tokens)
        api._KNOWN.clear()
        w, out, ws, hint = setup(layout, rows, tokens, decode)
        args = w.args()

        def op():
            torch.ops.indexer_topk.indexer_topk_out(*args, w.topk, w.layout.value, *out, ws, w.weight_scale, backend,
                                                    False, hint)

        def direct():
            api.indexer_topk(*args, topk=w.topk, layout=w.layout.value, weight_scale=w.weight_scale, backend=backend,
                             out=out, workspace=ws, check_values=False, rows_per_request=hint)

        op()
        torch.cuda.synchronize()
        # Alternate the two in rounds: timed one after the other, the first timed read 1.5-3x the
        # second on the GPU host, which a single order cannot tell from the dispatch's cost.
        runs_op, runs_api = [], []
        for r in range(ROUNDS):
            for step, runs in ((op, runs_op), (direct, runs_api))[:: 1 if r % 2 == 0 else -1]:
                host_us(step, 40, "cuda", runs)
        t_op, t_api = statistics.median(runs_op), statistics.median(runs_api)
        means = f"mean of runs: op {statistics.fmean(runs_op):.1f} us, api {statistics.fmean(runs_api):.1f} us"
        known = next(iter(api._KNOWN._calls.values()))
        route = next(iter(known.replays)) if backend == "auto" else backend
        rep = known.replays.get(route)
        if rep is None:
            print(f"{case}: {route}, not replayed: op {t_op:.1f} us, api {t_api:.1f} us; {means}", flush=True)
            continue
        real_run = replay.Replay.run
        replay.Replay.run = lambda self, *a: None
        t_none = host_us(direct, 200, "cuda")
        replay.Replay.run = real_run
        tensors = (*args, *out, ws)
        ptrs = [None if t is None else t.data_ptr() for t in tensors]
        stream = calls.raw_stream(torch.device("cuda"))
        t_rep = host_us(lambda: rep.run(tensors, ptrs, stream), 200, "cuda")
        per, full = [], list(ptrs)
        scratch = torch.empty(rep.scratch_bytes, dtype=torch.uint8, device="cuda")  # the replay's one allocation
        if rep.scratch_bytes:
            per.append(f"alloc {host_us(lambda: torch.empty(rep.scratch_bytes, dtype=torch.uint8, device='cuda'), 200, 'cuda'):.1f}")
        for step in rep.steps:
            if isinstance(step, replay._Alloc):
                full.append(scratch.data_ptr() + step.offset)
            else:
                us = host_us(lambda: step.run(full, None, stream), 200, "cuda")
                per.append(f"{us:.1f}({len(step.template)}a,{len(step.descs)}d)")
        name = f"{layout} {'decode ' if decode else ''}{rows}x{tokens // 1024}K {backend}->{route}"
        print(f"{name:34s} {t_op:7.1f} {t_api:7.1f} {t_none:9.1f} {t_rep:7.1f}  {' '.join(per)}", flush=True)
        print(f"   {means}", flush=True)
        t0 = time.perf_counter()
        for _ in range(1000):
            calls.signature(tensors, (1, 2, 3))
        guard = ""
        if getattr(known, "guard", None) is not None:  # a tree with the signature's guard
            t_guard = host_us(lambda: known.guard.addresses(tensors, known.guard.scalars), 200, "cuda")
            guard = f"; guard {t_guard:.2f} us"
        print(f"   signature {1e3 * (time.perf_counter() - t0):.2f} us{guard}; route "
              f"{host_us(lambda: indexer_topk.resolve_backend('auto', layout=known.layout, topk=1024, rows=known.rows, c4_len=known.c4_len), 200, 'cuda'):.1f} us")
    if not a.kth:
        return
    print("\nlegacy, GPU time (graph replays), k-th key by torch.topk / by radix passes in the select kernel")
    for rows, tokens in ((128, 16384), (128, 786432), (1024, 16384), (1024, 65536), (1024, 262144), (1024, 786432),
                         (8192, 65536)):
        res = []
        for kth in ("torch", "radix"):
            legacy_backend.KTH_SEARCH = kth
            api._KNOWN.clear()
            w, out, ws, hint = setup("sglang_fp8", rows, tokens, False)
            args = w.args()
            step = lambda: torch.ops.indexer_topk.indexer_topk_out(*args, w.topk, w.layout.value, *out, None,  # noqa: E731
                                                                    w.weight_scale, "legacy", False, None)
            res.append(graph_ms(step, iters=10, device="cuda"))
            del w, out, ws
            torch.cuda.empty_cache()
        print(f"  {rows:5d} x {tokens // 1024:4d}K  torch {res[0]:7.3f} ms  radix {res[1]:7.3f} ms", flush=True)


if __name__ == "__main__":
    main()
