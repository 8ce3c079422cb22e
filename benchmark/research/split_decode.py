#!/usr/bin/env python3
"""The legacy path's decode step (one-row score tiles, the split select) under other settings:
graph-replayed time, device time per kernel, and bits against the default settings.

    PYTHONPATH=python python3 benchmark/research/split_decode.py [--shapes 1x128K,8x768K,...]
        [--configs "SPLIT_WARPS=8;SCORE_PROGRAMS_PER_SM=8,SCORE_MIN_SPAN=256"] [--patterns random,increasing]

Each ``;``-separated config sets attributes of :mod:`indexer_topk.backends.legacy` (an empty
config: the shipped settings, always run first as the reference). Every run goes through the out
operator with ``backend="legacy"`` and ``rows_per_request=1``, as an engine's captured decode
calls it, and is compared bit for bit with the first config's outputs. The table is printed
last; the JSON goes to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import indexer_topk  # noqa: E402
from indexer_topk import api  # noqa: E402
from indexer_topk.backends import legacy as legacy_backend  # noqa: E402
from indexer_topk.bench.mix import graph_ms  # noqa: E402
from indexer_topk.compare import bitwise_equal  # noqa: E402
from indexer_topk.workload import make_workload  # noqa: E402

from decode_bench import parse_shape  # noqa: E402
from decode_probe import kernel_times  # noqa: E402


def parse_config(text: str) -> dict:
    return {k.strip(): int(v) for k, v in (x.split("=") for x in text.split(",") if x.strip())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="1x128K,1x768K,8x128K,8x768K,32x768K,64x128K,256x32K")
    p.add_argument("--layout", default="sglang_fp8")
    p.add_argument("--patterns", default="random")
    p.add_argument("--configs", default="")
    p.add_argument("--topk", type=int, default=1024)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "split_decode.json"))
    a = p.parse_args(argv)
    device = "cuda"
    configs = [""] + [c for c in a.configs.split(";") if c.strip()]
    shipped = {k: getattr(legacy_backend, k) for c in configs for k in parse_config(c)}
    records = []
    for pattern in a.patterns.split(","):
        for requests, tokens, per_request in (parse_shape(s) for s in a.shapes.split(",")):
            w = make_workload(a.layout, context_tokens=[tokens] * requests, rows_per_request=[per_request] * requests,
                              topk=a.topk, seed=1, device=device, pattern=pattern)
            ref = None
            for text in configs:
                for k, v in shipped.items():
                    setattr(legacy_backend, k, v)
                for k, v in parse_config(text).items():
                    setattr(legacy_backend, k, v)
                api._KNOWN.clear()  # a signature's recorded launches would replay the earlier settings
                out = indexer_topk.allocate_result(w.rows, w.topk, device)

                def step():
                    torch.ops.indexer_topk.indexer_topk_out(*w.args(), w.topk, w.layout.value, *out, None,
                                                            w.weight_scale, "legacy", False, per_request)
                try:
                    step()
                    torch.cuda.synchronize()
                    ms = graph_ms(step, iters=a.iters, device=device)
                    kt = kernel_times(step, a.iters)
                    same = True if ref is None else bitwise_equal(out, ref)
                    if ref is None:
                        ref = type(out)(*(t.clone() for t in out))
                except Exception as exc:  # noqa: BLE001 - a config that does not build is a finding
                    ms, kt, same = float("nan"), {"error": f"{type(exc).__name__}: {exc}"[:300]}, None
                shape = f"{requests}x{tokens // 1024}K" + (f"x{per_request}" if per_request > 1 else "")
                rec = {"pattern": pattern, "shape": shape, "config": text or "shipped", "graph_ms": ms,
                       "kernels": kt, "matches_shipped": same}
                records.append(rec)
                print(f"{pattern} {shape} {rec['config']}: {ms:.4f} ms eq={same} "
                      + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in kt.items()),
                      flush=True)
            w = ref = None
            torch.cuda.empty_cache()
    for k, v in shipped.items():
        setattr(legacy_backend, k, v)
    Path(a.out).write_text(json.dumps({"records": records}, indent=1) + "\n")
    print(f"\n{'pattern':10s} {'shape':10s} {'config':44s} {'graph ms':>9s} eq  kernels (device ms)")
    for r in records:
        kt = " ".join(f"{k.replace('_kernel', '')[:14]}={v:.4f}" for k, v in r["kernels"].items() if isinstance(v, float))
        print(f"{r['pattern']:10s} {r['shape']:10s} {r['config'][:44]:44s} {r['graph_ms']:9.4f} "
              f"{'Y' if r['matches_shipped'] else 'N'}   {kt}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
