#!/usr/bin/env python3
"""Whether legacy's score and select stages run faster side by side than one after the other.

    PYTHONPATH=python python3 benchmark/research/overlap_probe.py [--prefill 8192x16K,1024x16K,1024x64K]
        [--decode 256x32K] [--chunks 2,4,8] [--select-programs 1,2] [--iters 20]

At short contexts legacy's call is two kernels of about equal length: the score kernel (tensor
cores and loads) and the row select (integer work, shuffles and shared memory; at 8192 x 4,096
it reads DRAM at 5-12% of its rate). They use different parts of an SM, yet the select starts only
once every row is scored. This probe splits the rows into ``C`` chunks and scores chunk ``i + 1``
on one stream while chunk ``i`` is selected on a second one, so that the two kernels may share
SMs; the row select's programs an SM (``ROWS_PROGRAMS_PER_SM``, 2 shipped: their registers fill an
SM) are a setting of the run, since a select holding every register leaves no room beside it.

For each shape (the serving mix's bytes, seed 0, FP8, topk 1024), replayed from a CUDA graph
(kernel time, no host): the package's call (``backend="legacy"``), the score stage alone, the
select stage alone, the two in turn, and each ``(chunks, programs)`` pipeline. Every pipeline's
four outputs are compared bit for bit with the package's. Nothing here changes the package: it
measures whether an overlapped legacy path is worth building. The table is printed last,
``--out`` takes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from indexer_topk.backends import legacy as legacy_backend  # noqa: E402
from indexer_topk.bench.mix import MixShape, graph_ms, make_inputs  # noqa: E402
from indexer_topk.compare import bitwise_equal  # noqa: E402
from indexer_topk.backends.key_matrix import key_matrix_width  # noqa: E402
from indexer_topk.contract import allocate_result  # noqa: E402

from decode_bench import parse_shape  # noqa: E402


def _shapes(text: str, kind: str):
    for item in filter(None, (s.strip() for s in text.split(","))):
        if kind == "prefill":  # ROWSxTOKENS: one request's last ROWS rows
            rows, tokens, _ = parse_shape(item)
            yield MixShape("prefill", "sglang_fp8", 1024, 1, rows, tokens)
        else:  # REQUESTSxTOKENS, one row each
            requests, tokens, per_request = parse_shape(item)
            yield MixShape("decode", "sglang_fp8", 1024, requests, per_request, tokens)


def probe(shape: MixShape, chunks, programs, iters: int, device) -> list:
    w = make_inputs(shape, device)
    inputs = w.inputs()
    rows, width = inputs.rows, key_matrix_width(inputs.page_table)
    rpr = 1 if shape.kind == "decode" else None
    keys = torch.empty((rows, width), dtype=torch.int32, device=device)
    ref = allocate_result(rows, w.topk, device)
    out = allocate_result(rows, w.topk, device)
    second = torch.cuda.Stream(device)

    def package():
        legacy_backend.legacy_indexer_topk(inputs, out=ref, rows_per_request=rpr)

    def score(r0=0, n=rows):
        legacy_backend.legacy_score(inputs, keys=keys[r0:r0 + n], row_start=r0, row_count=n, rows_per_request=rpr)

    def select(r0=0, n=rows):
        legacy_backend.legacy_select(keys[r0:r0 + n], inputs.seq_lens, inputs.page_table, topk=w.topk, out=out,
                                     row_start=r0)

    def in_turn():
        score()
        select()

    def pipeline(c):
        bounds = [rows * i // c for i in range(c + 1)]

        def step():
            main = torch.cuda.current_stream(device)
            second.wait_stream(main)
            for r0, r1 in zip(bounds, bounds[1:]):
                score(r0, r1 - r0)
                done = torch.cuda.Event()
                done.record(main)
                with torch.cuda.stream(second):
                    second.wait_event(done)
                    select(r0, r1 - r0)
            main.wait_stream(second)
        return step

    label = f"{shape.kind} {shape.rows} x {shape.context_tokens // 1024}K"
    recs = [dict(shape=label, variant="package", ms=graph_ms(package, iters=iters, device=device))]
    recs.append(dict(shape=label, variant="score", ms=graph_ms(score, iters=iters, device=device)))
    recs.append(dict(shape=label, variant="select", ms=graph_ms(select, iters=iters, device=device)))
    recs.append(dict(shape=label, variant="in turn", ms=graph_ms(in_turn, iters=iters, device=device),
                     equal=bitwise_equal(out, ref)))
    shipped = legacy_backend.ROWS_PROGRAMS_PER_SM
    try:
        for p in programs:
            legacy_backend.ROWS_PROGRAMS_PER_SM = p
            for c in chunks:
                if rows // c < 1:
                    continue
                for t in out:
                    t.fill_(-7)  # poisoned: every element must be written again
                ms = graph_ms(pipeline(c), iters=iters, device=device)
                recs.append(dict(shape=label, variant=f"{c} chunks, {p} select programs an SM", ms=ms,
                                 equal=bitwise_equal(out, ref)))
    finally:
        legacy_backend.ROWS_PROGRAMS_PER_SM = shipped
    for r in recs:
        print(f"{r['shape']:22s} {r['variant']:36s} {r['ms']:8.4f} ms  {'' if 'equal' not in r else r['equal']}",
              flush=True)
    return recs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefill", default="8192x16K,1024x16K,1024x64K")
    p.add_argument("--decode", default="256x32K")
    p.add_argument("--chunks", default="2,4,8")
    p.add_argument("--select-programs", default="1,2")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "overlap_probe.json"))
    a = p.parse_args(argv)
    device = torch.device("cuda")
    chunks = [int(c) for c in a.chunks.split(",") if c]
    programs = [int(c) for c in a.select_programs.split(",") if c]
    shapes = list(_shapes(a.prefill, "prefill")) + list(_shapes(a.decode, "decode"))
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    recs = []
    for shape in shapes:
        recs += probe(shape, chunks, programs, a.iters, device)
    Path(a.out).write_text(json.dumps(recs, indent=1))
    print("\n| shape | variant | ms | / in turn | bits equal |\n|---|---|---|---|---|")
    base = {r["shape"]: r["ms"] for r in recs if r["variant"] == "in turn"}
    for r in recs:
        print(f"| {r['shape']} | {r['variant']} | {r['ms']:.4f} | {r['ms'] / base[r['shape']]:.2f} | "
              f"{r.get('equal', '-')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
