#!/usr/bin/env python3
"""Legacy's score spans in whole waves (``SCORE_WHOLE_WAVES``) against the shipped spans, on the
serving mix's shapes where the two rules differ, in one process on the same bytes.

    PYTHONPATH=python python3 benchmark/research/waves_ab.py [--shapes "decode 64 x 768K,prefill 128 x 768K"]
        [--rounds 3] [--out waves.json] [--smoke]

Each shape is the mix's (:func:`indexer_topk.bench.mix.default_shapes`, chosen by label) through
the out operator with ``backend="legacy"`` as the mix calls it: prefill as eager calls (median
CUDA-event time, host included), decode replayed from a CUDA graph. Rounds alternate the two
rules so that a drift of the machine falls on both; every output of the whole-wave rule is
compared bit for bit with the shipped rule's. The table (median over rounds) is printed last.
``--smoke``: the mix's two tiny shapes on the CPU under the Triton interpreter, eager calls (a
check that the script runs; the rules take the same spans there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels' modules are imported

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from indexer_topk import api  # noqa: E402
from indexer_topk.backends import legacy as legacy_backend  # noqa: E402
from indexer_topk.bench.mix import OurPath, default_shapes, graph_ms, make_inputs  # noqa: E402
from indexer_topk.bench.timing import median_ms, synchronize  # noqa: E402
from indexer_topk.compare import bitwise_equal  # noqa: E402
from indexer_topk.kernels.launch import device_sm_count  # noqa: E402

# the two rules differ at 64 x 768K, the mixed batch and 128 x 768K; 32 x 768K and 256 x 128K
# take the same programs either way (the spread between two runs of one plan)
SHAPES = "decode 64 x 768K,decode 64 x 4K..768K,prefill 128 x 768K,decode 32 x 768K,decode 256 x 128K"


def programs(w, hint) -> tuple:
    """Score programs of the shipped rule and of whole waves, for this workload."""
    from indexer_topk.kernels.launch import tile_config

    group = 1 if hint == 1 else tile_config(w.layout).rows
    groups, width, sms = -(-w.rows // group), w.page_table.shape[1] * 64, device_sm_count(w.q.device)
    out = []
    for whole in (False, True):
        legacy_backend.SCORE_WHOLE_WAVES = whole
        out.append(groups * -(-width // legacy_backend.score_span(groups, width, sms)))
    legacy_backend.SCORE_WHOLE_WAVES = False
    return tuple(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=SHAPES, help="mix labels, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true", help="the mix's tiny shapes on the CPU (interpreter)")
    a = ap.parse_args(argv)
    device = "cpu" if a.smoke else "cuda"
    if a.smoke:
        a.shapes = ",".join(s.label for s in default_shapes(smoke=True))
    wanted = [x.strip() for x in a.shapes.split(",") if x.strip()]
    shapes = [s for s in default_shapes(smoke=a.smoke) if s.label in wanted]
    missing = set(wanted) - {s.label for s in shapes}
    if missing:
        ap.error(f"--shapes: not mix labels: {sorted(missing)}")
    rows = []
    for shape in shapes:
        w = make_inputs(shape, device)
        hint = shape.rows_per_request if shape.kind == "decode" else None
        path = OurPath(w, "legacy", None, device, hint)
        before, after = programs(w, hint)
        times = {False: [], True: []}
        outs = {}
        for _ in range(a.rounds):
            for whole in (False, True):
                legacy_backend.SCORE_WHOLE_WAVES = whole
                api._KNOWN.clear()  # the plan is made on a signature's first call
                path.step()
                synchronize(device)
                outs[whole] = type(path.out)(*(t.clone() for t in path.out))
                graph = shape.kind == "decode" and device == "cuda"
                times[whole].append(graph_ms(path.step, iters=a.iters, device=device) if graph
                                    else median_ms(path.step, warmup=2, iters=a.iters, device=device))
        legacy_backend.SCORE_WHOLE_WAVES = False
        same = bitwise_equal(outs[False], outs[True])
        t0, t1 = statistics.median(times[False]), statistics.median(times[True])
        rows.append({"shape": shape.label, "programs": [before, after], "shipped_ms": t0, "whole_waves_ms": t1,
                     "rounds": {"shipped": times[False], "whole_waves": times[True]}, "bitwise_equal": same})
        print(f"{shape.label}: programs {before} -> {after}, {t0:.4f} -> {t1:.4f} ms, equal {same}", flush=True)
        del w, path, outs
        if device == "cuda":
            torch.cuda.empty_cache()
    if a.out:
        gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"
        Path(a.out).write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1) + "\n")
    print("\n| shape | score programs (shipped -> whole waves) | shipped ms | whole waves ms | ratio | bitwise equal |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['programs'][0]} -> {r['programs'][1]} | {r['shipped_ms']:.4f} | "
              f"{r['whole_waves_ms']:.4f} | {r['whole_waves_ms'] / r['shipped_ms']:.3f} | {r['bitwise_equal']} |")
    return 0 if all(r["bitwise_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
