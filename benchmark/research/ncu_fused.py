#!/usr/bin/env python3
"""One fused call at the reference shape, for Nsight Compute (the second call is the one to profile).

    ncu --clock-control none -k regex:'fused_topk_kernel|hopper_stream_kernel' --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section WarpStateStats \
        python3 benchmark/research/ncu_fused.py [--layout sglang_fp8] [--context 786432] [--rows 1024] [--topk 1024] \
        [--requests 1] [--plain | --build NAME]

The fused backend as routed (on an sm_90 GPU the FP8 cache takes the Hopper stream,
``hopper_stream_kernel``); ``--plain`` the plain-Triton kernel; ``--build`` a configuration of the
stream from ``hopper_probe.BUILDS``. ``--requests N``: a decode batch, N requests of ``--rows`` rows
each (the call gets ``rows_per_request``).
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layout", default="sglang_fp8")
    p.add_argument("--context", type=int, default=786432)
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--topk", type=int, default=1024)
    p.add_argument("--requests", type=int, default=1, help="requests of --rows rows each; above 1, a decode batch")
    p.add_argument("--plain", action="store_true", help="the plain-Triton fused kernel, not the Hopper stream")
    p.add_argument("--build", help="a configuration of the Hopper stream (hopper_probe.BUILDS)")
    a = p.parse_args(argv)
    from functools import partial

    from hopper_probe import run_fused

    if a.build:
        run = partial(run_fused, hopper=True, build=a.build)
    elif a.plain:
        run = partial(run_fused, hopper=False)
    else:
        from indexer_topk.backends.fused import fused_indexer_topk as run
    from indexer_topk.workload import make_workload

    w = make_workload(a.layout, context_tokens=[a.context] * a.requests, rows_per_request=[a.rows] * a.requests,
                      topk=a.topk, seed=1, device="cuda")
    hint = {"rows_per_request": a.rows} if a.requests > 1 else {}
    for _ in range(2):
        run(w.inputs(), **hint)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
