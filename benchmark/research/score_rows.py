#!/usr/bin/env python3
"""Legacy's score kernel alone at prefill shapes, under other score tiles: rows a tile, warps,
pipeline depth. Graph-replayed time and the key matrix's bits against the shipped tile's.

    PYTHONPATH=python python3 benchmark/research/score_rows.py [--shapes 8192x16K,1024x64K,...]
        [--tiles 2:4:3,4:8:3,4:4:3] [--iters 30] [--json FILE] [--once]

Each shape is one request of ``CTX`` tokens whose last ``ROWS`` rows are the chunk, the bytes
the serving mix makes (:func:`indexer_topk.bench.mix.make_inputs`, FP8 keys). A tile
``R:WARPS:STAGES[:r]`` runs legacy's launch of :func:`indexer_topk.kernels.logits.logits_kernel`
with ``R`` rows sharing each key page (one MMA of N = 64 R), ``WARPS`` warps and ``STAGES``
pipeline stages, the spans as :func:`indexer_topk.backends.legacy.score_span` gives them for that
many row groups; ``r``: the chunk's rows in reverse order (its queries, weights, lengths and page-table
rows flipped, the matrix flipped back to compare), so that programs start with the longest rows
(the kernel takes row groups in program order, and a chunk's last rows are its longest).
The first tile is the reference: every other tile's key matrix is compared with it bit for bit
(the contract: legacy and fused scores agree bit for bit, so a tile that changes a bit is not a
candidate however fast); each matrix's digest is printed too, so that two trees' runs (an A/B of
a kernel change, PYTHONPATH set to each) compare bit for bit. Effective TFLOP/s count only the
positions below each row's length.
``--once``: each tile launched twice, eagerly, and nothing timed, for a profiler attached to the
second launch (``ncu_score.sh``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from unittest import mock

import torch
import triton

from indexer_topk.backends import legacy as legacy_backend
from indexer_topk.backends.key_matrix import key_matrix_width
from indexer_topk.bench.mix import MixShape, graph_ms, make_inputs
from indexer_topk.contract import HEAD_DIM, HEADS
from indexer_topk.kernels.launch import pack_args, tile_config
from indexer_topk.options import parse_tokens


def score(inputs, keys, R: int, warps: int, stages: int) -> None:
    """``keys`` (``[rows, width]`` int32) from legacy's own launch of the score kernel
    (``legacy._launch_score``, spans and all), its tile config replaced by this one."""
    tile = dataclasses.replace(tile_config(inputs.layout), rows=R, num_warps=warps, logits_stages=stages)
    with mock.patch.object(legacy_backend, "tile_config", lambda layout: tile):
        legacy_backend._launch_score(inputs, pack_args(inputs), keys, 0, keys.shape[0], R)


def reversed_rows(inputs):
    """``inputs`` with its rows in reverse order (the per-row tensors flipped along rows)."""
    flip = {name: getattr(inputs, name).flip(0).contiguous() for name in ("q", "weights", "page_table", "seq_lens")}
    if inputs.q_scale is not None:
        flip["q_scale"] = inputs.q_scale.flip(0).contiguous()
    return dataclasses.replace(inputs, **flip)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1024x16K,8192x16K,1024x64K,8192x64K")
    ap.add_argument("--tiles", default="2:4:3,4:8:3,4:4:3,2:8:3")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--once", action="store_true", help="launch each tile twice, untimed (for a profiler)")
    a = ap.parse_args(argv)
    device = torch.device("cuda")
    ref = tile_config("sglang_fp8")
    tiles = [(*(int(x) for x in t.split(":")[:3]), t.endswith(":r")) for t in a.tiles.split(",")]
    print(f"shipped tile: R={ref.rows} warps={ref.num_warps} stages={ref.logits_stages}; "
          f"{torch.cuda.get_device_name(device)}, triton {triton.__version__}")
    records = []
    for text in a.shapes.split(","):
        rows, ctx = text.lower().split("x")
        shape = MixShape("prefill", "sglang_fp8", 1024, 1, int(rows), parse_tokens(ctx))
        inputs = make_inputs(shape, device).inputs()
        width = key_matrix_width(inputs.page_table)
        lens = inputs.seq_lens.to(torch.int64).clamp(max=width)
        flop = 2.0 * HEADS * HEAD_DIM * float(lens.sum())
        first = None
        flipped = None
        for R, warps, stages, rev in tiles:
            name = f"{R}:{warps}:{stages}{':r' if rev else ''}"
            if rev and flipped is None:
                flipped = reversed_rows(inputs)
            run_inputs = flipped if rev else inputs
            keys = torch.full((inputs.rows, width), 0x7F7F7F7F, dtype=torch.int32, device=device)
            if a.once:
                for _ in range(2):
                    score(run_inputs, keys, R, warps, stages)
                torch.cuda.synchronize()
                print(f"{shape.label:>24}  {name}  launched twice", flush=True)
                continue
            try:
                ms = graph_ms(lambda: score(run_inputs, keys, R, warps, stages), iters=a.iters, device=device)
            except Exception as exc:  # a tile that does not compile or launch is a record too
                print(f"{shape.label:>24}  {name}  failed: {type(exc).__name__}: {str(exc)[:200]}")
                records.append(dict(shape=shape.label, tile=name, error=str(exc)[:500]))
                continue
            if rev:
                keys = keys.flip(0)
            if first is None:
                first = keys.clone()
            same = bool(torch.equal(keys, first))
            digest = hashlib.sha256(keys.cpu().numpy().tobytes()).hexdigest()[:16]
            rec = dict(shape=shape.label, tile=name, ms=ms, tflops=flop / ms / 1e9, same_bits=same, digest=digest)
            records.append(rec)
            print(f"{shape.label:>24}  {name:8s}  {ms:8.4f} ms  {rec['tflops']:6.0f} TFLOP/s  "
                  f"bits {'same' if same else 'DIFFER'}  digest {digest}", flush=True)
            keys = None
        first = inputs = flipped = run_inputs = None
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
