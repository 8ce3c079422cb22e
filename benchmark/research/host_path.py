#!/usr/bin/env python3
"""The host path on a GPU: replayed calls against the full path, bit for bit, on fresh tensors;
host time per call with and without replay; legacy's two k-th key searches.

    PYTHONPATH=python python3 benchmark/research/host_path.py [--shapes 128x16K,1024x64K,8x768Kd]

A shape ``RxT`` is one prefill request of ``T`` tokens whose last ``R`` rows are scored; a
trailing ``d`` makes it ``R`` decode requests of one row each (captured in a CUDA graph too).
For each layout and backend: a first call, then calls on new workloads (new addresses, new
values) of the same shape, each compared with the full path (``INDEXER_TOPK_REPLAY=0``) bit
for bit; decode shapes also replay the captured step with new inputs copied in. Host time is
the mean wall time of 200 back-to-back calls.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import indexer_topk  # noqa: E402
from indexer_topk import api  # noqa: E402
from indexer_topk.backends import legacy as legacy_backend  # noqa: E402
from indexer_topk.bench.mix import capture_graph, host_us  # noqa: E402
from indexer_topk.bench.timing import median_ms  # noqa: E402
from indexer_topk.compare import bitwise_equal, first_difference  # noqa: E402
from indexer_topk.contract import allocate_result  # noqa: E402
from indexer_topk.envs import envs  # noqa: E402
from indexer_topk.options import parse_tokens  # noqa: E402
from indexer_topk.workload import make_workload  # noqa: E402


def workload(layout, rows, tokens, decode, seed, topk=1024):
    if decode:
        return make_workload(layout, context_tokens=[tokens] * rows, rows_per_request=[1] * rows, topk=topk,
                             seed=seed, device="cuda")
    return make_workload(layout, context_tokens=[tokens], rows_per_request=[rows], topk=topk, seed=seed, device="cuda")


def call(w, backend, out, ws, hint, check=False):
    torch.ops.indexer_topk.indexer_topk_out(*w.args(), w.topk, w.layout.value, *out, ws, w.weight_scale, backend,
                                            check, hint)


def full(w, backend, hint):
    with envs.INDEXER_TOPK_REPLAY.override(False):
        out = allocate_result(w.rows, w.topk, "cuda")
        ws = torch.empty(indexer_topk.workspace_size(w.rows, w.topk, w.layout.value), dtype=torch.uint8, device="cuda")
        call(w, backend, out, ws, hint)
        torch.cuda.synchronize()
        return out


def fresh_calls(layout, rows, tokens, decode, backend, hint, what):
    """Three calls of one signature on new workloads (new addresses, new values) through the out
    operator into poisoned outputs, from a fresh record, each compared with the full path bit for
    bit (a difference is printed, ``what`` naming the case): ``(all equal, the last workload, its
    outputs, the workspace)``."""
    api._KNOWN.clear()
    ws = torch.empty(indexer_topk.workspace_size(rows, 1024, layout), dtype=torch.uint8, device="cuda")
    same = True
    for seed in (1, 2, 3):
        w = workload(layout, rows, tokens, decode, seed)
        out = allocate_result(w.rows, w.topk, "cuda")
        for x in out:
            x.view(torch.int32).fill_(-12345)
        call(w, backend, out, ws, hint)
        torch.cuda.synchronize()
        want = full(w, backend, hint)
        if not bitwise_equal(out, want):
            same = False
            print(f"MISMATCH {layout} {backend} {what} seed {seed}: {first_difference(out, want)}", flush=True)
    return same, w, out, ws


def graph_check(step, w, out, layout, rows, tokens, backend, hint, what):
    """A decode step captured in a CUDA graph, replayed with a new batch copied into its inputs
    and compared with the full path (a difference is printed): ``(equal, graph replay ms)``."""
    w2 = workload(layout, rows, tokens, True, 9)
    g = capture_graph(step)
    for dst, src in zip(w.args(), w2.args()):
        if dst is not None:
            dst.copy_(src)
    g.replay()
    torch.cuda.synchronize()
    same = bitwise_equal(out, full(w2, backend, hint))
    if not same:
        print(f"MISMATCH graph {layout} {backend} {what}", flush=True)
    return same, median_ms(g.replay, warmup=3, iters=20, device="cuda")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="128x16K,1024x64K,8x768Kd,64x128Kd")
    p.add_argument("--layouts", default="sglang_fp8,sglang_mxfp4,aiter_mxfp4")
    p.add_argument("--kth", default="torch,radix")
    a = p.parse_args()
    bad = 0
    rows_out = []
    for text in a.shapes.split(","):
        decode = text.endswith("d")
        r, t = text.rstrip("d").split("x")
        rows, tokens = int(r), parse_tokens(t)
        hint = 1 if decode else None
        for layout in a.layouts.split(","):
            for backend in ("fused", "legacy"):
                for kth in (a.kth.split(",") if backend == "legacy" else ["-"]):
                    if kth != "-":
                        legacy_backend.KTH_SEARCH = kth
                    same, w, out, ws = fresh_calls(layout, rows, tokens, decode, backend, hint, text)
                    known = list(api._KNOWN._calls.values())
                    replay = known[0].replays.get(backend) if known else None
                    step = lambda: call(w, backend, out, ws, hint)  # noqa: E731
                    on = host_us(step, 200, "cuda")
                    with envs.INDEXER_TOPK_REPLAY.override(False):
                        off = host_us(step, 50, "cuda")
                    call(w, backend, out, ws, hint, check=True)
                    torch.cuda.synchronize()
                    eager = median_ms(step, warmup=2, iters=10, device="cuda")
                    gms = None
                    if decode:
                        graph_same, gms = graph_check(step, w, out, layout, rows, tokens, backend, hint, text)
                        same = same and graph_same
                    bad += not same
                    rows_out.append((layout, text, backend + ("" if kth == "-" else f"/{kth}"), same,
                                     replay is not None, on, off, eager, gms))
                    print(rows_out[-1], flush=True)
    print(f"{'layout':13s} {'shape':10s} {'backend':13s} exact replay  host_us(on/off)   eager_ms  graph_ms")
    for layout, text, b, same, rep, on, off, eager, gms in rows_out:
        g = "-" if gms is None else f"{gms:.3f}"
        print(f"{layout:13s} {text:10s} {b:13s} {str(same):5s} {str(rep):6s} {on:7.1f} / {off:7.1f}  {eager:8.3f}  {g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
