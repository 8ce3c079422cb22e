#!/usr/bin/env python3
"""The legacy path with and without programmatic dependent launch, side by side on one GPU.

    PYTHONPATH=python python3 benchmark/research/pdl_ab.py [--decode 1x128K,8x768K,...] [--prefill 128x16K,...]
    python3 benchmark/research/pdl_ab.py --verdict pdl_ab.json   # 1 or 0: the setting that measured faster

Each shape's workload is built once; then, in rounds that alternate the two settings (so that a
clock or temperature drift falls on both alike), the out operator with ``backend="legacy"``:
decode steps (``rows_per_request=1``) replayed from a CUDA graph, prefill chunks (one request,
its last rows) as the median CUDA-event time of single eager calls, host included, as the serving
mix times them. Every output is compared bit for bit with the first run's. The table is printed
last, the JSON goes to ``--out``. ``--verdict`` reads such a JSON and prints ``1`` where every
shape kept its bits and the geometric mean of on/off is at most 1, else ``0`` (a value for
``INDEXER_TOPK_PDL`` in the same device session).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import indexer_topk  # noqa: E402
from indexer_topk import api  # noqa: E402
from indexer_topk.bench.mix import graph_ms  # noqa: E402
from indexer_topk.bench.timing import median_ms  # noqa: E402
from indexer_topk.compare import bitwise_equal  # noqa: E402
from indexer_topk.workload import make_workload  # noqa: E402

from decode_bench import parse_shape  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--decode", default="1x128K,1x768K,8x128K,8x768K,32x128K,64x128K,256x32K")
    p.add_argument("--prefill", default="128x16K,128x64K,1024x16K,1024x64K")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "pdl_ab.json"))
    p.add_argument("--verdict", metavar="JSON", help="print 1 or 0 for a finished run's records, run nothing")
    a = p.parse_args(argv)
    if a.verdict:
        print(verdict(json.loads(Path(a.verdict).read_text())["records"]))
        return 0
    device = "cuda"
    shapes = [("decode", s) for s in a.decode.split(",") if s] + [("prefill", s) for s in a.prefill.split(",") if s]
    records = []
    for kind, text in shapes:
        n, tokens, _ = parse_shape(text)
        if kind == "decode":
            w = make_workload("sglang_fp8", context_tokens=[tokens] * n, rows_per_request=[1] * n, topk=1024, seed=1,
                              device=device)
        else:
            w = make_workload("sglang_fp8", context_tokens=[tokens], rows_per_request=[n], topk=1024, seed=1,
                              device=device)
        hint = 1 if kind == "decode" else None
        out = indexer_topk.allocate_result(w.rows, w.topk, device)
        args = w.args()

        def step():
            torch.ops.indexer_topk.indexer_topk_out(*args, w.topk, w.layout.value, *out, None, w.weight_scale, "legacy",
                                                    False, hint)

        times = {"on": [], "off": []}
        ref, same = None, True
        for _ in range(a.rounds):
            for name in ("on", "off"):
                os.environ["INDEXER_TOPK_PDL"] = "1" if name == "on" else "0"
                api._KNOWN.clear()  # recorded again under this setting
                for t in out:
                    t.view(torch.int32).fill_(-12345)
                step()
                torch.cuda.synchronize()
                if kind == "decode":
                    ms = graph_ms(step, iters=a.iters, device=device)
                else:
                    ms = median_ms(step, warmup=3, iters=a.iters, device=device)
                times[name].append(ms)
                if ref is None:
                    ref = type(out)(*(t.clone() for t in out))
                else:
                    same = same and bitwise_equal(out, ref)
        rec = {"kind": kind, "shape": text, "timing": "graph" if kind == "decode" else "eager",
               "on_ms": statistics.median(times["on"]), "off_ms": statistics.median(times["off"]),
               "on_all": times["on"], "off_all": times["off"], "same_bits": same}
        records.append(rec)
        print(json.dumps(rec), flush=True)
        w = out = ref = args = None
        torch.cuda.empty_cache()
    os.environ.pop("INDEXER_TOPK_PDL", None)
    Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                       "records": records}, indent=1) + "\n")
    print(f"\n{'kind':8s} {'shape':10s} {'timing':6s} {'PDL on ms':>10s} {'off ms':>9s} {'on/off':>7s} same bits")
    for r in records:
        print(f"{r['kind']:8s} {r['shape']:10s} {r['timing']:6s} {r['on_ms']:10.4f} {r['off_ms']:9.4f} "
              f"{r['on_ms'] / r['off_ms']:7.3f} {r['same_bits']}")
    return 0


def verdict(records) -> int:
    """1 where PDL kept every shape's bits and was no slower in geometric mean over the shapes."""
    if not records or not all(r["same_bits"] for r in records):
        return 0
    ratios = [r["on_ms"] / r["off_ms"] for r in records]
    return int(statistics.geometric_mean(ratios) <= 1.0)


if __name__ == "__main__":
    sys.exit(main())
