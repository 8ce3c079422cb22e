#!/usr/bin/env python3
"""Replayed launches through the CUDA driver (``INDEXER_TOPK_DRIVER_LAUNCH``, on) against
Triton's launcher (off), side by side on the same workloads in one process.

    PYTHONPATH=python python3 benchmark/research/driver_launch_ab.py [--shapes 128x16K,1024x64K,8x768Kd]

A shape ``RxT`` is one prefill request of ``T`` tokens whose last ``R`` rows are scored; a
trailing ``d`` makes it ``R`` decode requests of one row each. For each shape and backend, each
way records its signature afresh, then: three calls on new workloads through the out operator,
into poisoned outputs, each compared bit for bit with the full path (``INDEXER_TOPK_REPLAY=0``);
how many of the replay's launches go through the driver; host time (mean wall time of 200
back-to-back calls, runs of 20); the eager call's time (median CUDA-event time of single calls,
host included, as the serving mix times it); for decode shapes the captured step replayed with a
new batch, compared again. The table comes last.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import indexer_topk  # noqa: E402
from indexer_topk import api  # noqa: E402
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


def call(w, backend, out, ws, hint):
    torch.ops.indexer_topk.indexer_topk_out(*w.args(), w.topk, w.layout.value, *out, ws, w.weight_scale, backend,
                                            False, hint)


def full(w, backend, hint):
    with envs.INDEXER_TOPK_REPLAY.override(False):
        return indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend=backend, rows_per_request=hint)


def driver_steps():
    """``(launches through the driver, launches)`` of the recorded replays."""
    n = d = 0
    for known in api._KNOWN._calls.values():
        for rep in known.replays.values():
            for step in getattr(rep, "steps", ()):
                if hasattr(step, "driver"):
                    n += 1
                    d += step.driver is not None
    return d, n


def one_way(layout, rows, tokens, decode, backend, driver):
    hint = 1 if decode else None
    api._KNOWN.clear()
    ws = torch.empty(indexer_topk.workspace_size(rows, 1024, layout), dtype=torch.uint8, device="cuda")
    same = True
    with envs.INDEXER_TOPK_DRIVER_LAUNCH.override(driver):
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
                print(f"MISMATCH {layout} {backend} {rows}x{tokens} driver={driver} seed {seed}: "
                      f"{first_difference(out, want)}", flush=True)
        d, n = driver_steps()
        step = lambda: call(w, backend, out, ws, hint)  # noqa: E731
        host = host_us(step, 200, "cuda")
        eager = median_ms(step, warmup=3, iters=20, device="cuda")
        gms = None
        if decode:
            g = capture_graph(step)
            w2 = workload(layout, rows, tokens, decode, 9)
            for dst, src in zip(w.args(), w2.args()):
                if dst is not None:
                    dst.copy_(src)
            g.replay()
            torch.cuda.synchronize()
            if not bitwise_equal(out, full(w2, backend, hint)):
                same = False
                print(f"MISMATCH graph {layout} {backend} {rows}x{tokens} driver={driver}", flush=True)
            gms = median_ms(g.replay, warmup=3, iters=20, device="cuda")
    return same, d, n, host, eager, gms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="128x16K,1024x16K,1024x64K,1024x256K,8x768Kd,1x128Kd")
    p.add_argument("--layouts", default="sglang_fp8")
    p.add_argument("--backends", default="legacy,fused")
    a = p.parse_args()
    rows_out = []
    bad = 0
    for text in a.shapes.split(","):
        decode = text.endswith("d")
        r, t = text.rstrip("d").split("x")
        rows, tokens = int(r), parse_tokens(t)
        for layout in a.layouts.split(","):
            for backend in a.backends.split(","):
                res = {}
                for driver in (False, True, False, True):  # twice each, interleaved: host time drifts
                    got = one_way(layout, rows, tokens, decode, backend, driver)
                    bad += not got[0]
                    prev = res.get(driver)
                    res[driver] = got if prev is None else (prev[0] and got[0], got[1], got[2],
                                                            min(prev[3], got[3]), min(prev[4], got[4]),
                                                            got[5] if prev[5] is None else min(prev[5], got[5] or 1e9))
                    print(layout, text, backend, "driver" if driver else "triton", got, flush=True)
                rows_out.append((layout, text, backend, res[False], res[True]))
    print("best of two runs each; host_us: mean host time per replayed call; eager: median ms of single calls")
    print(f"{'layout':11s} {'shape':10s} {'backend':7s} exact  driver_launches  host_us triton/driver  "
          f"eager_ms triton/driver  graph_ms triton/driver")
    for layout, text, b, off, on in rows_out:
        g = "-" if off[5] is None else f"{off[5]:.4f} / {on[5]:.4f}"
        print(f"{layout:11s} {text:10s} {b:7s} {str(off[0] and on[0]):5s}  {on[1]:2d} of {on[2]:2d}        "
              f"{off[3]:7.1f} / {on[3]:7.1f}      {off[4]:.4f} / {on[4]:.4f}   {g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
