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
(kernel time, no host): the package's call (``backend="legacy"``, its stages chained by
programmatic dependent launch where the GPU has it), the score stage alone, the select stage alone, the two in turn,
and for each chunk count the chunks in turn on one stream and pipelined on two. Chunking alone
changes the select a chunk takes (its sort's width, its programs, the split select below 128
rows), so the pipeline is judged against the same chunks on one stream ("/ one stream"); each
record names the chunk's select, and a select programs setting that does not reach it is not run
twice. Each graph is replayed once on a poisoned key matrix and poisoned outputs, then compared
bit for bit with the package's outputs (a chunk selected before its scores were written would
select the poison), then timed. Records are printed and the JSON (``--out``) rewritten as each is
made, so a run cut by its time limit keeps what it measured; the table is printed last. Nothing
here changes the package: it measures whether an overlapped legacy path is worth building.
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
from indexer_topk.bench.mix import MixShape, capture_graph, make_inputs  # noqa: E402
from indexer_topk.bench.timing import median_ms, queue_hold  # noqa: E402
from indexer_topk.compare import bitwise_equal  # noqa: E402
from indexer_topk.backends.key_matrix import key_matrix_width  # noqa: E402
from indexer_topk.contract import allocate_result  # noqa: E402
from indexer_topk.kernels.launch import device_sm_count  # noqa: E402

from decode_bench import parse_shape  # noqa: E402


def _shapes(text: str, kind: str):
    for item in filter(None, (s.strip() for s in text.split(","))):
        if kind == "prefill":  # ROWSxTOKENS: one request's last ROWS rows
            rows, tokens, _ = parse_shape(item)
            yield MixShape("prefill", "sglang_fp8", 1024, 1, rows, tokens)
        else:  # REQUESTSxTOKENS, one row each
            requests, tokens, per_request = parse_shape(item)
            yield MixShape("decode", "sglang_fp8", 1024, requests, per_request, tokens)


def _select_setup(n: int, width: int, sm_count: int) -> str:
    """How :func:`legacy_select` takes a chunk of ``n`` rows under the current settings."""
    way = legacy_backend.select_way(n, width, sm_count)
    if way != "rows":
        return way
    progs, warps = legacy_backend.row_programs(n, sm_count)
    return f"rows: {progs} programs of {warps} warps, {legacy_backend.row_sort_bits(n, width)}-bit sort"


def probe(shape: MixShape, chunks, programs, iters: int, device, emit) -> None:
    """Time one shape's variants, handing each record to ``emit`` as it is made."""
    w = make_inputs(shape, device)
    inputs = w.inputs()
    rows, width = inputs.rows, key_matrix_width(inputs.page_table)
    sm_count = device_sm_count(device)
    rpr = 1 if shape.kind == "decode" else None
    keys = torch.empty((rows, width), dtype=torch.int32, device=device)
    ref = allocate_result(rows, w.topk, device)
    out = allocate_result(rows, w.topk, device)
    second = torch.cuda.Stream(device)
    hold = queue_hold(device)

    def package():
        legacy_backend.legacy_indexer_topk(inputs, out=ref, rows_per_request=rpr)

    def score(r0=0, n=rows):
        legacy_backend.legacy_score(inputs, keys=keys[r0:r0 + n], row_start=r0, row_count=n, rows_per_request=rpr)

    def select(r0=0, n=rows):
        legacy_backend.legacy_select(keys[r0:r0 + n], inputs.seq_lens, inputs.page_table, topk=w.topk, out=out,
                                     row_start=r0)

    def chunked(c, two_streams: bool):
        """The rows in ``c`` chunks, each scored then selected; with ``two_streams`` a chunk's
        select runs on the second stream, beside the next chunk's score."""
        bounds = [rows * i // c for i in range(c + 1)]

        def step():
            main = torch.cuda.current_stream(device)
            for r0, r1 in zip(bounds, bounds[1:]):
                score(r0, r1 - r0)
                if not two_streams:
                    select(r0, r1 - r0)
                    continue
                done = torch.cuda.Event()
                done.record(main)
                with torch.cuda.stream(second):
                    second.wait_event(done)  # the chunk's scores, and (in order) the work before them
                    select(r0, r1 - r0)
            if two_streams:
                main.wait_stream(second)
        return step

    def measure(step, check: bool):
        """(ms, bits equal to the package's or None): the captured graph replayed once on a
        poisoned key matrix and outputs (a select that read a chunk before its score wrote it
        would select the poison), compared, then timed."""
        graph = capture_graph(step)
        if check:
            keys.fill_(0x7F7F7F7F)  # the key of a score of about 3.4e38, far above these inputs' scores
            for t in out:
                t.fill_(-7)
            graph.replay()
            torch.cuda.synchronize(device)
        equal = bitwise_equal(out, ref) if check else None
        ms = median_ms(graph.replay, warmup=3, iters=iters, device=device, before=hold)
        return ms, equal

    label = f"{shape.kind} {shape.rows} x {shape.context_tokens // 1024}K"
    package()  # the reference bits
    torch.cuda.synchronize(device)

    def record(variant, step, check, **extra):
        ms, equal = measure(step, check)
        emit(dict(shape=label, variant=variant, ms=ms, equal=equal, **extra))
        return ms

    record("package (with PDL)", package, False, select=_select_setup(rows, width, sm_count))
    record("score", score, False)
    record("select", select, False)  # reads the key matrix the score variant left
    record("in turn", lambda: (score(), select()), True)
    shipped = legacy_backend.ROWS_PROGRAMS_PER_SM
    try:
        for c in chunks:
            n = rows // c
            if n < 1:
                continue
            seen = set()
            for p in programs:
                legacy_backend.ROWS_PROGRAMS_PER_SM = p
                setup = _select_setup(n, width, sm_count)
                if setup in seen:  # the setting does not reach this chunk's select
                    continue
                seen.add(setup)
                one = record(f"{c} chunks, one stream", chunked(c, False), True, chunk_select=setup)
                two = record(f"{c} chunks, two streams", chunked(c, True), True, chunk_select=setup, one_stream_ms=one)
                print(f"  {c} chunks ({setup}): two streams / one = {two / one:.3f}", flush=True)
    finally:
        legacy_backend.ROWS_PROGRAMS_PER_SM = shipped


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

    def emit(r):
        recs.append(r)
        print(f"{r['shape']:22s} {r['variant']:26s} {r['ms']:8.4f} ms  bits {r['equal']}  "
              f"{r.get('chunk_select') or r.get('select') or ''}", flush=True)
        Path(a.out).write_text(json.dumps(recs, indent=1))  # a run cut by its limit keeps what it measured

    for shape in shapes:
        probe(shape, chunks, programs, a.iters, device, emit)
    print("\n| shape | variant | chunk's select | ms | / in turn | / one stream | bits equal |")
    print("|---|---|---|---|---|---|---|")
    base = {r["shape"]: r["ms"] for r in recs if r["variant"] == "in turn"}
    for r in recs:
        one = f"{r['ms'] / r['one_stream_ms']:.3f}" if "one_stream_ms" in r else "-"
        print(f"| {r['shape']} | {r['variant']} | {r.get('chunk_select', '-')} | {r['ms']:.4f} | "
              f"{r['ms'] / base[r['shape']]:.3f} | {one} | {r['equal'] if r['equal'] is not None else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
