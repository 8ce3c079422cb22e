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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # host_path

from indexer_topk import api  # noqa: E402
from indexer_topk.bench.mix import host_us  # noqa: E402
from indexer_topk.bench.timing import median_ms  # noqa: E402
from indexer_topk.envs import envs  # noqa: E402
from indexer_topk.options import parse_tokens  # noqa: E402

from host_path import call, fresh_calls, graph_check  # noqa: E402  (the same shapes, calls and checks)


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
    with envs.INDEXER_TOPK_DRIVER_LAUNCH.override(driver):
        same, w, out, ws = fresh_calls(layout, rows, tokens, decode, backend, hint,
                                       f"{rows}x{tokens} driver={driver}")
        d, n = driver_steps()
        step = lambda: call(w, backend, out, ws, hint)  # noqa: E731
        host = host_us(step, 200, "cuda")
        eager = median_ms(step, warmup=3, iters=20, device="cuda")
        gms = None
        if decode:
            graph_same, gms = graph_check(step, w, out, layout, rows, tokens, backend, hint,
                                          f"{rows}x{tokens} driver={driver}")
            same = same and graph_same
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
