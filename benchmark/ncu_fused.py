#!/usr/bin/env python3
"""One fused call at the reference shape, for Nsight Compute (the second call is the one to profile).

    ncu --clock-control none -k regex:fused_topk_kernel --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section WarpStateStats \
        python3 benchmark/ncu_fused.py [--layout sglang_fp8] [--context 786432] [--rows 1024] [--topk 1024] [--hopper [--build NAME]]
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
    p.add_argument("--hopper", action="store_true", help="the warp-specialised experiment (hopper_stream.py)")
    p.add_argument("--build", default="hopper", help="with --hopper: a build of hopper_probe.BUILDS")
    a = p.parse_args(argv)
    if a.hopper:
        from functools import partial

        from hopper_probe import BUILDS
        from hopper_stream import hopper_indexer_topk

        run = partial(hopper_indexer_topk, **BUILDS[a.build])
    else:
        from indexer_topk.backends.fused import fused_indexer_topk as run
    from indexer_topk.workload import make_workload

    w = make_workload(a.layout, context_tokens=[a.context], rows_per_request=[a.rows], topk=a.topk, seed=1,
                      device="cuda")
    for _ in range(2):
        run(w.inputs())
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
