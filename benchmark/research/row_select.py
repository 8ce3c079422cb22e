"""The legacy select stage on its own: the one-read row select against the earlier ones.

Run on a GPU from the repository root::

    PYTHONPATH=python python3 benchmark/research/row_select.py [--shapes 1024x8192,...] [--configs 8192:8:4,...]

Builds key matrices as the score stage leaves them (int32 order keys of fp32 scores,
``KEY_NONE`` past each row's length; every row as long as the matrix) from normal scores
("random") and from scores that increase along the row ("increasing"), and times
:func:`indexer_topk.backends.legacy.legacy_select` replayed from a CUDA graph (kernel time, no
host) with each way of selecting: ``rows`` (kernels/row_topk.py) for each ``TILE:WARPS:PROGRAMS_PER_SM[:MAXNREG[:SORT_BITS]]``
config at every row count (``ROWS_FEW_WARPS`` off; MAXNREG 0: the compiler's choice; SORT_BITS 32 or 64, 0 or
none: the package's rule; ``pos`` in its place: ``order="position"``, each row left in ascending positions
unsorted, what the sort costs; a further ``bN``: ``ROWS_BINS = N``, 0 for the radix digits over each tile, ``cN``: ``ROWS_CAND = N``, ``sN``:
``ROWS_SET_POOL_WIDTH = N``, 0 for every width), ``split`` (kernels/split_topk.py) for each ``WARPS:PROGRAMS_PER_SM[:gN]`` of
``--split-configs`` (``gN``: ``SPLIT_GATHER_STRIDED = N``), ``auto``
(the way ``legacy_select`` picks for the shape), ``torch`` (torch.topk for the k-th key, then the select pass) and ``radix`` (8-bit
histogram passes over each row). Every output is checked bitwise against the ``torch`` way's (a ``pos``
config's after both are put in ascending positions).
With ``--sglang-kit <kit>`` SGLang's ``topk_v2`` (the anchor kit's build) is timed on the same
scores beside them. Prints a table; ``--json`` writes the records.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from indexer_topk.backends import legacy as legacy_backend
from indexer_topk.bench.mix import graph_ms
from indexer_topk.contract import KEY_NONE, IndexerTopKResult, allocate_result, by_position, ordered_score_bits
from indexer_topk.kernels.launch import device_sm_count


def key_matrix(rows, width, pattern, device):
    gen = torch.Generator(device=device).manual_seed(rows * 7919 + width)
    if pattern == "random":
        scores = torch.randn((rows, width), generator=gen, device=device)
    else:  # increasing along the row, with a little noise per row
        base = torch.linspace(0.0, 8.0, width, device=device)
        scores = base[None, :] + 1e-3 * torch.rand((rows, width), generator=gen, device=device)
    return ordered_score_bits(scores), scores


def run_select(keys, seq_lens, page_table, topk, out, order):
    legacy_backend.legacy_select(keys, seq_lens, page_table, topk=topk, out=out, order=order)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="128x4096,1024x4096,1024x8192,1024x16384,8192x4096,1024x65536,128x196608,1024x196608")
    ap.add_argument("--patterns", default="random,increasing")
    ap.add_argument("--configs", default="4096:8:2:128")
    ap.add_argument("--split-configs", default="16:4",
                    help="the split way's finishing and gate warps and gathering programs an SM, WARPS:PROGRAMS_PER_SM"
                         "[:gN] (gN: SPLIT_GATHER_STRIDED = N)")
    ap.add_argument("--ways", default="rows,torch,radix")
    ap.add_argument("--topk", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sglang-kit", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    device = "cuda"
    topk_v2 = None
    if args.sglang_kit:
        from indexer_topk.bench.mix import load_anchor_kit

        topk_v2 = load_anchor_kit(args.sglang_kit)[2]
    records = []
    lines = []
    knobs = ("ROWS_TILE", "ROWS_WARPS", "ROWS_FEW_WARPS", "ROWS_PROGRAMS_PER_SM", "ROWS_MAXNREG", "ROWS_SORT_BITS",
             "ROWS_BINS", "ROWS_CAND", "ROWS_SET_POOL_WIDTH", "SPLIT_WARPS", "SPLIT_PROGRAMS_PER_SM",
             "SPLIT_MORE_PROGRAMS_PER_SM", "SPLIT_GATHER_STRIDED")
    knobs = tuple(k for k in knobs if hasattr(legacy_backend, k))  # an earlier package may lack some
    shipped = {k: getattr(legacy_backend, k) for k in knobs}  # each way starts from the package's settings
    for shape in args.shapes.split(","):
        rows, width = (int(x) for x in shape.split("x"))
        for pattern in args.patterns.split(","):
            keys, scores = key_matrix(rows, width, pattern, device)
            seq_lens = torch.full((rows,), width, dtype=torch.int32, device=device)
            page_table = torch.arange(rows * (width // 64), dtype=torch.int32, device=device).view(rows, -1)
            ref = None
            row = {"rows": rows, "keys": width, "pattern": pattern, "topk": args.topk}
            ways = []
            for way in args.ways.split(","):
                configs = {"rows": args.configs, "split": args.split_configs}.get(way)
                for cfg in configs.split(",") if configs else [None]:
                    for k, v in shipped.items():
                        setattr(legacy_backend, k, v)
                    legacy_backend.KTH_SEARCH = way
                    name = way
                    words = cfg.split(":") if cfg and way == "rows" else []
                    unsorted = "pos" in words
                    bins = [int(w[1:]) for w in words if w.startswith("b")]
                    cand = [int(w[1:]) for w in words if w.startswith("c")]
                    set_pool = [int(w[1:]) for w in words if w.startswith("s")]
                    order = "position" if unsorted else "score"
                    if cfg and way == "split":
                        fields = cfg.split(":")
                        warps, pps = (int(x) for x in fields[:2])
                        legacy_backend.SPLIT_WARPS, legacy_backend.SPLIT_PROGRAMS_PER_SM = warps, pps
                        for w in fields[2:]:
                            if not w.startswith("g"):
                                raise SystemExit(f"--split-configs: {cfg!r}: {w!r} is not gN")
                            legacy_backend.SPLIT_GATHER_STRIDED = int(w[1:])
                        legacy_backend.SPLIT_MORE_PROGRAMS_PER_SM = None  # pps at every row count
                        name = f"split {cfg}"
                    elif cfg:
                        fields = [int(x) for x in words if x.isdigit()]
                        tile, warps, pps, maxnreg, bits = fields + [0, 0][len(fields) - 3:]
                        legacy_backend.ROWS_TILE, legacy_backend.ROWS_WARPS = tile, warps
                        legacy_backend.ROWS_PROGRAMS_PER_SM = pps
                        legacy_backend.ROWS_FEW_WARPS = None  # the config names every row count's launch
                        legacy_backend.ROWS_MAXNREG = maxnreg or None
                        legacy_backend.ROWS_SORT_BITS = bits or None
                        if bins:
                            legacy_backend.ROWS_BINS = bins[0]
                        if cand:
                            legacy_backend.ROWS_CAND = cand[0]
                        if set_pool:
                            legacy_backend.ROWS_SET_POOL_WIDTH = set_pool[0]
                        name = f"rows {cfg}"
                    if way == "auto":
                        name = f"auto={legacy_backend.select_way(rows, width, device_sm_count(device))}"
                    if way == "radix" and rows * width > (1 << 24):
                        continue  # minutes at these sizes: one program per row, many passes
                    out = allocate_result(rows, args.topk, device)
                    out.raw_indices.fill_(-7)
                    try:
                        ms = graph_ms(lambda: run_select(keys, seq_lens, page_table, args.topk, out, order),
                                      iters=args.iters, device=device)
                    except Exception as e:  # a config that does not compile is a finding, not a stop
                        print(f"{shape} {pattern} {name}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                        continue
                    bits = [t.view(torch.int32).clone() for t in out]
                    if ref is None:
                        ref = bits
                    if unsorted:
                        same = all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in
                                   zip(by_position(IndexerTopKResult(*bits)), by_position(IndexerTopKResult(*ref))))
                    else:
                        same = all(torch.equal(a, b) for a, b in zip(bits, ref))
                    row[name] = {"ms": ms, "same": same}
                    ways.append(f"{name}={ms:.3f}{'' if same else '!'}")
            if topk_v2 is not None:
                pages_out = torch.empty((rows, args.topk), dtype=torch.int32, device=device)
                raw_out = torch.empty_like(pages_out)

                def sglang_step():
                    topk_v2.transform(scores, seq_lens, page_table, pages_out, 64, topk_v2.plan(seq_lens), raw_out)

                try:
                    row["topk_v2"] = {"ms": graph_ms(sglang_step, iters=args.iters, device=device)}
                    ways.append(f"topk_v2={row['topk_v2']['ms']:.3f}")
                except Exception as e:
                    print(f"topk_v2 {shape}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
            records.append(row)
            lines.append(f"{rows:>5} x {width:<7} {pattern:<10} " + "  ".join(ways))
            print(lines[-1], flush=True)
            del keys, scores
            torch.cuda.empty_cache()
    legacy_backend.KTH_SEARCH = "auto"
    for k, v in shipped.items():
        setattr(legacy_backend, k, v)
    print("\nms per call, CUDA-graph replays ('!' = differs from the first way's bits)")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
