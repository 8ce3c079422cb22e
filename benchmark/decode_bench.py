#!/usr/bin/env python3
"""Decode-shaped calls, legacy against fused, each replayed from a CUDA graph as a serving
engine runs decode.

    PYTHONPATH=python python3 benchmark/decode_bench.py [--shapes 8x768K,64x768K,256x128K]
        [--layouts sglang_fp8,sglang_mxfp4,aiter_mxfp4] [--topk 1024] [--iters 20] [--out-dir DIR]
        [--sglang-kit DIR]

A shape ``NxT`` is N requests of one query row each (a decode step), every request ``T`` raw
tokens long (``T / 4`` C4 positions). Each backend runs through the operator form
(``torch.ops.indexer_topk.indexer_topk_out``: caller-owned outputs, no value checks,
``rows_per_request=1``; fused with its caller-owned workspace, legacy with its key matrix
allocated per call), is captured once in a CUDA graph after a warm-up, and the graph's replays are timed
(CUDA events, median); the eager call is timed too. The fused outputs are compared with legacy's
bit for bit. Records carry the grid's fields (``indexer_topk.bench.runs.workload_record``, the
environment) plus ``requests``, ``graph_ms`` and ``eager_ms``; the JSON goes to
``DIR/decode_<gpu>.json``. ``--smoke`` runs two tiny shapes eagerly under the Triton interpreter
(no GPU, no graphs): the script's own check.

``--sglang-kit DIR`` (the SGLang CUDA anchor kit, with DeepGEMM built and importable and its
``sglang_topk_v2`` folder) adds SGLang 0.5.23's own NVIDIA decode step on the same bytes, for
``sglang_fp8``: DeepGEMM's ``fp8_paged_mqa_logits`` (next_n 1, its schedule built once per batch,
as SGLang's metadata does) then ``topk_v2``'s plan-driven ``transform_paged`` to page indices,
captured and replayed the same way (backend ``sglang``). Its selection is compared with legacy's
as an overlap (its scores are DeepGEMM's, not this package's bits).
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
from indexer_topk.bench.mix import graph_ms, load_anchor_kit  # noqa: E402
from indexer_topk.bench.runs import workload_record  # noqa: E402
from indexer_topk.bench.timing import median_ms  # noqa: E402
from indexer_topk.compare import bitwise_equal  # noqa: E402
from indexer_topk.contract import allocate_result  # noqa: E402
from indexer_topk.options import parse_tokens  # noqa: E402

DEFAULT_SHAPES = "8x768K,64x768K,256x128K"
SMOKE_SHAPES = "2x8K,3x4K"


def parse_shape(text: str):
    """``"8x768K"`` -> ``(8, 786432, 1)``: requests, raw tokens per request, rows per request
    (``"32x768Kx2"``: two rows per request, a decode step with one MTP draft row)."""
    parts = text.strip().lower().split("x")
    if len(parts) not in (2, 3) or not parts[0].isdigit() or int(parts[0]) < 1 or not parts[1] or (
            len(parts) == 3 and (not parts[2].isdigit() or int(parts[2]) < 1)):
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected REQUESTSxTOKENS[xROWS], e.g. 8x768K")
    return int(parts[0]), parse_tokens(parts[1]), int(parts[2]) if len(parts) == 3 else 1


def step_fn(w, backend: str, out, workspace, per_request: int = 1):
    """One decode step through the out operator (what a captured graph replays)."""
    args = w.args()

    def step():
        torch.ops.indexer_topk.indexer_topk_out(*args, w.topk, w.layout.value, *out, workspace, w.weight_scale,
                                                backend, False, per_request)
    return step


def time_backend(w, backend: str, *, iters: int, device, graphs: bool, per_request: int = 1) -> tuple:
    """``(record fields, outputs)`` of one backend on one decode batch."""
    import indexer_topk

    out = allocate_result(w.rows, w.topk, device)
    # legacy allocates its full key matrix per call (from the graph's pool when captured), as an
    # engine's fallback does: a workspace it could hold only a few rows of would chunk its rows
    nbytes = indexer_topk.workspace_size(w.rows, w.topk, w.layout.value, device=device) if backend == "fused" else 0
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None
    step = step_fn(w, backend, out, workspace, per_request)
    eager = median_ms(step, warmup=2, iters=iters, device=device)
    fields = {"backend": backend, "eager_ms": eager, "graph_ms": None, "workspace_mib": nbytes / 2**20}
    if graphs:
        fields["graph_ms"] = graph_ms(step, iters=iters, device=device)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return fields, out


_SGLANG = {}


def sglang_kernels(kit: str, shape_hint: str):
    """DeepGEMM and SGLang's topk_v2 through the anchor kit at ``kit`` (loaded once)."""
    if "dg" not in _SGLANG:
        _SGLANG["dg"], _SGLANG["anchor"], _SGLANG["topk"] = load_anchor_kit(kit, [shape_hint])
    return _SGLANG["dg"], _SGLANG["anchor"], _SGLANG["topk"]


def time_sglang(w, kit: str, *, iters: int, device) -> tuple:
    """``(record fields, [rows, topk] int32 page indices)`` of SGLang's decode step (see the module
    docstring) on the batch ``w`` (``sglang_fp8``)."""
    q, _qs, kc, _ks, wts, pt, sl = w.args()
    width = pt.shape[1] * 64
    dg, anchor, topk = sglang_kernels(kit, f"{w.rows}x{width}")
    paged, _ragged, paged_name, _ = anchor.dg_api(dg, False)
    kv = kc.view(kc.shape[0], 64, 1, kc.shape[1] // 64)  # SGLang's view of the same cache bytes
    qd, wd, cl = q.unsqueeze(1), (wts.float() * w.weight_scale).contiguous(), sl.view(-1, 1)
    schedule = dg.get_paged_mqa_logits_metadata(cl, 64, dg.get_num_sms())  # once per batch in SGLang
    plan = topk.plan(sl)  # once per batch in SGLang
    pages = torch.full((w.rows, w.topk), -7, dtype=torch.int32, device=device)

    def step():
        logits = paged(qd, kv, wd, cl, pt, schedule, width)
        topk.transform(logits, sl, pt, pages, 64, plan)

    eager = median_ms(step, warmup=2, iters=iters, device=device)
    fields = {"backend": "sglang", "eager_ms": eager, "graph_ms": graph_ms(step, iters=iters, device=device),
              "workspace_mib": 0.0, "sglang_step": f"deep_gemm.{paged_name} + topk_v2 transform_paged (plan per batch)",
              "sglang_topk_dispatch": topk.dispatch.get(f"{w.rows}x{width}")}
    torch.cuda.synchronize()
    return fields, pages


def overlap(pages: torch.Tensor, out) -> float:
    """Mean fraction of legacy's selected page indices that ``pages`` also selects, per row."""
    ours = out.physical_indices.long()
    fractions = []
    for r in range(ours.shape[0]):
        mine = ours[r][ours[r] >= 0]
        theirs = pages[r][pages[r] >= 0].long()
        if mine.numel():
            fractions.append(torch.isin(mine, theirs).float().mean().item())
    return sum(fractions) / max(1, len(fractions))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=None, help=f"comma list of REQUESTSxTOKENS (default {DEFAULT_SHAPES})")
    p.add_argument("--layouts", default="sglang_fp8,sglang_mxfp4,aiter_mxfp4")
    p.add_argument("--topk", type=int, default=1024)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=os.environ.get("OUT", "benchmark/results"))
    p.add_argument("--smoke", action="store_true", help=f"tiny shapes ({SMOKE_SHAPES}), eager, on a CPU too")
    p.add_argument("--sglang-kit", default=None, metavar="DIR",
                   help="time SGLang's own decode step too (sglang_fp8; DeepGEMM importable, see above)")
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
        for requests, tokens, per_request in shapes:
            w = make_workload(layout, context_tokens=[tokens] * requests, rows_per_request=[per_request] * requests,
                              topk=topk, seed=a.seed, device=device)
            base = None
            for backend in ("legacy", "fused"):
                fields, out = time_backend(w, backend, iters=2 if a.smoke else a.iters, device=device, graphs=graphs,
                                           per_request=per_request)
                if base is None:
                    base = (fields, out)
                same = bitwise_equal(out, base[1])
                ms = fields["graph_ms"] if graphs else fields["eager_ms"]
                base_ms = base[0]["graph_ms"] if graphs else base[0]["eager_ms"]
                rec = {**workload_record(w), **fields, "rows_per_request": per_request, "matches_legacy": same,
                       "vs_legacy": base_ms / ms,
                       **env, "command": command, "timing": "CUDA graph replays" if graphs else "eager calls"}
                records.append(rec)
                shape = f"{requests}x{tokens // 1024}K" + (f"x{per_request}" if per_request > 1 else "")
                graph_txt = "-" if fields["graph_ms"] is None else f"{fields['graph_ms']:9.3f}"
                print(f"{layout:13s} {shape:>9s} {backend:7s} {graph_txt:>9s} {fields['eager_ms']:9.3f} "
                      f"{base_ms / ms:8.2f}x {'Y' if same else 'N'}", flush=True)
            if a.sglang_kit and graphs and layout == "sglang_fp8" and per_request == 1:
                fields, pages = time_sglang(w, a.sglang_kit, iters=a.iters, device=device)
                shared = overlap(pages, base[1])
                rec = {**workload_record(w), **fields, "matches_legacy": None, "overlap_with_legacy": shared,
                       "vs_legacy": base[0]["graph_ms"] / fields["graph_ms"], **env, "command": command,
                       "timing": "CUDA graph replays"}
                records.append(rec)
                print(f"{layout:13s} {shape:>9s} {'sglang':7s} {fields['graph_ms']:9.3f} {fields['eager_ms']:9.3f} "
                      f"{rec['vs_legacy']:8.2f}x overlap {shared:.4f}", flush=True)
            w = base = out = None
            if device == "cuda":
                torch.cuda.empty_cache()
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"decode_{gpu_slug(env['gpu'])}.json"
    path.write_text(json.dumps(records, indent=1, default=str) + "\n")
    print(f"wrote {path}")
    return 0 if all(r["matches_legacy"] is not False for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
