#!/usr/bin/env python3
"""What SGLang's CUDA top-k (topk_v2, from the SGLang CUDA anchor kit) selects when scores are NaN.

    PYTHONPATH=python python3 benchmark/research/sglang_nan.py KIT

Rows of random FP32 logits with NaN at a few positions (rows longer than k, as in prefill and
decode); prints, per case, how many NaN positions topk_v2 selected, how many torch.topk selects
on the same logits, and how many ours would (none: the contract ranks NaN below every number).
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch


def main(kit: str) -> int:
    sys.path.insert(0, str(Path(kit).resolve()))
    import sglang_cuda_anchor as anchor

    jit = anchor.load_topk_v2(SimpleNamespace(topk_v2=str(Path(kit) / "sglang_topk_v2"), topk_v2_build_dir=None), {}, [])
    gen = torch.Generator(device="cuda").manual_seed(0)
    for rows, width, nans in ((4, 8192, 3), (4, 65536, 3), (600, 8192, 3), (2, 196608, 50)):
        k = 1024
        logits = torch.randn((rows, width), generator=gen, device="cuda")
        at = torch.randint(0, width, (rows, nans), generator=gen, device="cuda")
        logits.scatter_(1, at, float("nan"))
        sl = torch.full((rows,), width, dtype=torch.int32, device="cuda")
        pt = torch.arange(width // 64, dtype=torch.int32, device="cuda").repeat(rows, 1)
        pages = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")
        raw = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")
        jit.transform(logits, sl, pt, pages, 64, jit.plan(sl), raw)
        torch.cuda.synchronize()
        picked = sum(int(torch.isin(at[r], raw[r]).sum()) for r in range(rows))
        by_torch = sum(int(torch.isin(at[r], torch.topk(logits[r], k).indices).sum()) for r in range(rows))
        print(f"rows {rows} width {width}: {rows * nans} NaN positions; topk_v2 selected {picked}, "
              f"torch.topk {by_torch}, ours 0; topk_v2 filled {int((raw >= 0).sum())} of {rows * k} slots", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
