#!/usr/bin/env python3
"""Compile (into Triton's cache) the kernels one layout and topk need, for every split count.

    PYTHONPATH=python python3 benchmark/research/warm_kernels.py --layout sglang_fp8 --topk 1024 [--pool 64]

Runs the fused and the legacy backend once on small synthetic calls whose row counts give the
fused plan each context split count it can choose (1 to 64) on this GPU, so a later benchmark,
test or stress run in another process loads every binary from the cache instead of compiling
it. Launch one process per (layout, topk) side by side: compilation is single-threaded. Prints
the seconds each step took.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layout", required=True)
    p.add_argument("--topk", type=int, required=True)
    p.add_argument("--pool", type=int, default=None, help="the fused candidate pool (default: the backend's)")
    a = p.parse_args(argv)
    from indexer_topk.backends.fused import fused_indexer_topk, plan_fused
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from indexer_topk.workload import make_workload

    dev = torch.device("cuda")
    seen = set()
    t_all = time.time()
    for rows in (600, 200, 100, 64, 20, 12, 1):  # one row count per split count on a 132-SM GPU
        splits = plan_fused(rows, a.topk, dev, pool=a.pool).splits
        if splits in seen:
            continue
        seen.add(splits)
        w = make_workload(a.layout, context_tokens=[8 * a.topk + 300], rows_per_request=[rows], topk=a.topk,
                          seed=0, device=dev)
        t0 = time.time()
        fused_indexer_topk(w.inputs(), pool=a.pool)
        if rows == 600:
            legacy_indexer_topk(w.inputs())
        torch.cuda.synchronize()
        print(f"{a.layout} topk {a.topk} pool {a.pool}: rows {rows} splits {splits}: {time.time() - t0:.1f} s", flush=True)
    print(f"{a.layout} topk {a.topk} pool {a.pool}: all in {time.time() - t_all:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
