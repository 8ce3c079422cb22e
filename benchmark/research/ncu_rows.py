#!/usr/bin/env python3
"""The legacy row select alone, for Nsight Compute: a key matrix of normal scores (as
``row_select.py`` builds it), three selections through ``legacy_select`` with the row select
(the first compiles; profile a later one).

    ncu --clock-control none -k regex:topk_rows_kernel --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python3 benchmark/research/ncu_rows.py [--shape 8192x4096] [--topk 1024]

``benchmark/research/ncu_rows.sh`` runs it with the source view.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from row_select import key_matrix  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="8192x4096", help="ROWSxKEYS")
    p.add_argument("--topk", type=int, default=1024)
    p.add_argument("--pattern", default="random", choices=("random", "increasing"))
    p.add_argument("--order", default="score", choices=("score", "position"),
                   help="position: each row left in ascending positions, no sort")
    p.add_argument("--bins", type=int, default=None, help="ROWS_BINS for the run (default: the package's)")
    p.add_argument("--device", default="cuda", help="cpu: under Triton's interpreter (a check of the script)")
    a = p.parse_args(argv)
    from indexer_topk.backends import legacy as legacy_backend
    from indexer_topk.contract import allocate_result

    rows, width = (int(x) for x in a.shape.split("x"))
    legacy_backend.KTH_SEARCH = "rows"
    if a.bins is not None:
        legacy_backend.ROWS_BINS = a.bins
    dev = a.device
    keys, _scores = key_matrix(rows, width, a.pattern, dev)
    seq_lens = torch.full((rows,), width, dtype=torch.int32, device=dev)
    page_table = torch.arange(rows * (width // 64), dtype=torch.int32, device=dev).view(rows, -1)
    out = allocate_result(rows, a.topk, dev)
    for _ in range(3):
        legacy_backend.legacy_select(keys, seq_lens, page_table, topk=a.topk, out=out, order=a.order)
    if dev != "cpu":
        torch.cuda.synchronize()
    print(f"row select {a.shape} topk {a.topk} order {a.order} bins {legacy_backend.ROWS_BINS} counts {out.counts.min().item()}..{out.counts.max().item()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
