#!/usr/bin/env python3
"""Legacy's decode step for Nsight Compute: the mix's decode workload, three steps through the out
operator (the first compiles and records; profile a later one's four kernels).

    ncu --clock-control none \\
        -k regex:'logits_kernel|gate_rows_kernel|gather_rows_kernel|finish_rows_kernel|score_sample_kernel' \\
        --launch-skip 4 --launch-count 4 --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python3 benchmark/research/ncu_decode.py [--shape 1x128K] [--layout sglang_fp8] [--topk 1024]

``--shape REQUESTSxTOKENS[xROWS]`` as in ``decode_bench.py``; the workload is the serving mix's
(:func:`indexer_topk.bench.mix.make_inputs`, seed 0), called as an engine's captured decode calls
it (``backend="legacy"``, ``rows_per_request``, a caller-owned workspace). ``benchmark/research/
ncu_decode.sh`` runs it under Nsight Compute for several shapes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decode_bench import parse_shape  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="1x128K", type=parse_shape)
    p.add_argument("--layout", default="sglang_fp8")
    p.add_argument("--topk", type=int, default=1024)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--kind", choices=("decode", "prefill"), default="decode",
                   help="prefill: REQUESTSxTOKENSxROWS is one request's chunk of its last ROWS rows (1x16Kx128)")
    a = p.parse_args(argv)
    import indexer_topk
    from indexer_topk.bench.mix import MixShape, make_inputs

    requests, tokens, per_request = a.shape
    shape = MixShape(a.kind, a.layout, a.topk, requests, per_request, tokens)
    w = make_inputs(shape, "cuda")
    out = indexer_topk.allocate_result(w.rows, w.topk, "cuda")
    workspace = torch.empty(indexer_topk.workspace_size(w.rows, w.topk, w.layout.value, device="cuda"),
                            dtype=torch.uint8, device="cuda")
    for _ in range(a.steps):
        torch.ops.indexer_topk.indexer_topk_out(*w.args(), w.topk, w.layout.value, *out, workspace, w.weight_scale,
                                                "legacy", False, per_request)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
