#!/usr/bin/env python3
"""Decode-shaped calls, legacy against fused, each replayed from a CUDA graph as a serving
engine runs decode.

    PYTHONPATH=python python3 benchmark/decode_bench.py [--shapes 8x768K,64x768K,256x128K]
        [--layouts sglang_fp8,sglang_mxfp4,aiter_mxfp4] [--topk 1024] [--iters 20] [--out-dir DIR]

A shape ``NxT`` is N requests of one query row each (a decode step), every request ``T`` raw
tokens long (``T / 4`` C4 positions). Each backend runs through the operator form
(``torch.ops.indexer_topk.indexer_topk_out``: caller-owned outputs and workspace, no value
checks), is captured once in a CUDA graph after a warm-up, and the graph's replays are timed
(CUDA events, median); the eager call is timed too. The fused outputs are compared with legacy's
bit for bit. Records carry the grid's fields (``indexer_topk.bench.runs.workload_record``, the
environment) plus ``requests``, ``graph_ms`` and ``eager_ms``; the JSON goes to
``DIR/decode_<gpu>.json``. ``--smoke`` runs two tiny shapes eagerly under the Triton interpreter
(no GPU, no graphs): the script's own check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from indexer_topk.bench.environment import environment, gpu_slug  # noqa: E402
from indexer_topk.bench.runs import workload_record  # noqa: E402
from indexer_topk.bench.timing import median_ms  # noqa: E402
from indexer_topk.compare import bitwise_equal  # noqa: E402
from indexer_topk.contract import allocate_result  # noqa: E402
from indexer_topk.options import parse_tokens  # noqa: E402

DEFAULT_SHAPES = "8x768K,64x768K,256x128K"
SMOKE_SHAPES = "2x8K,3x4K"


def parse_shape(text: str):
    """``"8x768K"`` -> ``(8, 786432)``: requests, raw tokens per request."""
    n, _, tokens = text.strip().lower().partition("x")
    if not n.isdigit() or int(n) < 1 or not tokens:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected REQUESTSxTOKENS, e.g. 8x768K")
    return int(n), parse_tokens(tokens)


def step_fn(w, backend: str, out, workspace):
    """One decode step through the out operator (what a captured graph replays)."""
    args = w.args()

    def step():
        torch.ops.indexer_topk.indexer_topk_out(*args, w.topk, w.layout.value, *out, workspace, w.weight_scale,
                                                backend, False)
    return step


def time_backend(w, backend: str, *, iters: int, device, graphs: bool) -> tuple:
    """``(record fields, outputs)`` of one backend on one decode batch."""
    import indexer_topk

    out = allocate_result(w.rows, w.topk, device)
    nbytes = indexer_topk.workspace_size(w.rows, w.topk, w.layout.value, device=device)
    workspace = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    step = step_fn(w, backend, out, workspace)
    eager = median_ms(step, warmup=2, iters=iters, device=device)
    fields = {"backend": backend, "eager_ms": eager, "graph_ms": None, "workspace_mib": nbytes / 2**20}
    if graphs:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        fields["graph_ms"] = median_ms(graph.replay, warmup=3, iters=iters, device=device)
        graph.replay()  # the outputs compared below are the graph's
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return fields, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=None, help=f"comma list of REQUESTSxTOKENS (default {DEFAULT_SHAPES})")
    p.add_argument("--layouts", default="sglang_fp8,sglang_mxfp4,aiter_mxfp4")
    p.add_argument("--topk", type=int, default=1024)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=os.environ.get("OUT", "benchmark/results"))
    p.add_argument("--smoke", action="store_true", help=f"tiny shapes ({SMOKE_SHAPES}), eager, on a CPU too")
    a = p.parse_args(argv)
    from indexer_topk.workload import make_workload

    device = "cuda" if torch.cuda.is_available() else "cpu"
    graphs = device == "cuda" and not a.smoke
    shapes = [parse_shape(s) for s in (a.shapes or (SMOKE_SHAPES if a.smoke else DEFAULT_SHAPES)).split(",")]
    topk = 512 if a.smoke and a.topk == 1024 else a.topk
    env = environment(device)
    command = "python3 benchmark/decode_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    records = []
    print(f"{'layout':13s} {'shape':>9s} {'backend':7s} {'graph ms':>9s} {'eager ms':>9s} {'vs legacy':>9s} eq")
    for layout in a.layouts.split(","):
        for requests, tokens in shapes:
            w = make_workload(layout, context_tokens=[tokens] * requests, rows_per_request=[1] * requests,
                              topk=topk, seed=a.seed, device=device)
            base = None
            for backend in ("legacy", "fused"):
                fields, out = time_backend(w, backend, iters=2 if a.smoke else a.iters, device=device, graphs=graphs)
                if base is None:
                    base = (fields, out)
                same = bitwise_equal(out, base[1])
                ms = fields["graph_ms"] if graphs else fields["eager_ms"]
                base_ms = base[0]["graph_ms"] if graphs else base[0]["eager_ms"]
                rec = {**workload_record(w), **fields, "matches_legacy": same, "vs_legacy": base_ms / ms,
                       **env, "command": command, "timing": "CUDA graph replays" if graphs else "eager calls"}
                records.append(rec)
                shape = f"{requests}x{tokens // 1024}K"
                graph_txt = "-" if fields["graph_ms"] is None else f"{fields['graph_ms']:9.3f}"
                print(f"{layout:13s} {shape:>9s} {backend:7s} {graph_txt:>9s} {fields['eager_ms']:9.3f} "
                      f"{base_ms / ms:8.2f}x {'Y' if same else 'N'}", flush=True)
            w = base = out = None
            if device == "cuda":
                torch.cuda.empty_cache()
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"decode_{gpu_slug(env['gpu'])}.json"
    path.write_text(json.dumps(records, indent=1, default=str) + "\n")
    print(f"wrote {path}")
    return 0 if all(r["matches_legacy"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
