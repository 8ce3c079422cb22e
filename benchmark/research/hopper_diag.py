#!/usr/bin/env python3
"""Where a build of the Hopper stream departs from legacy: per call, the rows that differ and,
for the first few, how (counts, entries missing or extra, whether only their order differs).

    PYTHONPATH=python python3 benchmark/research/hopper_diag.py BUILD [BUILD ...]

Each build runs at 64K tokens x 1024 rows with the default grid (twice: a race shows as two runs
that differ) and with two context splits.
"""

import sys

import torch

from hopper_probe import run_fused


def describe(out, ref, rows_per_item: int = 2, programs: int = 0) -> str:
    bad = []
    for r in range(ref.counts.shape[0]):
        if not (torch.equal(out.raw_indices[r], ref.raw_indices[r]) and torch.equal(out.counts[r], ref.counts[r])
                and torch.equal(out.values[r].view(torch.int32), ref.values[r].view(torch.int32))):
            bad.append(r)
    lines = [f"rows differing: {len(bad)} of {ref.counts.shape[0]}"]
    if bad and programs:
        items = sorted({r // rows_per_item for r in bad})
        lines.append(f"  items {items[:12]}; item slot in its program {sorted({i // programs for i in items})}")
        lines.append(f"  row parity {sorted({r % rows_per_item for r in bad})}")
    for r in bad[:3]:
        co, cr = int(out.counts[r]), int(ref.counts[r])
        so = set(out.raw_indices[r, :co].tolist())
        sr = set(ref.raw_indices[r, :cr].tolist())
        lines.append(
            f"  row {r}: counts {co}/{cr}, missing {len(sr - so)}, extra {len(so - sr)}, "
            f"same set {so == sr}, dup {co - len(so)}, min value ours {out.values[r, co - 1].item():.6g} "
            f"legacy {ref.values[r, cr - 1].item():.6g}"
        )
        if so != sr:
            miss = sorted(sr - so)[:6]
            extra = sorted(so - sr)[:6]
            lines.append(f"    missing {miss} extra {extra}")
    return "\n".join(lines)


def main(argv):
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from indexer_topk.contract import allocate_result
    from indexer_topk.kernels.launch import device_sm_count
    from indexer_topk.workload import make_workload

    w = make_workload("sglang_fp8", context_tokens=[65536], rows_per_request=[1024], topk=1024, seed=1,
                      device="cuda", pattern="random")
    inputs = w.inputs()
    ref = legacy_indexer_topk(inputs)
    sms = device_sm_count(torch.device("cuda"))
    for build in argv:
        first = None
        for label, extra, progs in (("default grid", {}, sms), ("default grid again", {}, sms),
                                    ("two splits", dict(num_splits=2), 0)):
            out = allocate_result(w.rows, 1024, "cuda")
            for t in out:
                t.view(torch.int32).fill_(-12345)
            run_fused(inputs, True, build, out=out, **extra)
            torch.cuda.synchronize()
            print(f"== {build}, {label}: {describe(out, ref, 2, progs)}", flush=True)
            if first is None:
                first = out
            elif label == "default grid again":  # differing runs of one input mean a race
                print(f"   the two default-grid runs agree: {all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(first, out))}")


if __name__ == "__main__":
    main(sys.argv[1:])
