"""Build a routes table (``python/indexer_topk/routes/*.json``) from benchmark records.

    python benchmark/routes_from_records.py --mix FILE [--out PATH]   # from a serving-mix records file
    python benchmark/routes_from_records.py [--out PATH]              # from the committed H200 records
    python benchmark/routes_from_records.py --check                   # the shipped table is what they give

``--mix`` reads a serving-mix file (``{"env": {...}, "records": [...]}``, see
``indexer_topk.routes.table_from_records``) and writes the table of its device, by default
``python/indexer_topk/routes/<gpu>.json``. Without it, the committed H200 measurements the
policy's routes came from are converted to serving-mix records first (each citing its file and
commit) and ``python/indexer_topk/routes/nvidia-h200.json`` is written:

* prefill, ``sglang_fp8``: the rows sweep of the Hopper stream against legacy (8 to 1024 rows at
  64K and 768K tokens), the grid at 1024 and 8192 rows, and SGLang's CUDA path (DeepGEMM's paged
  logits and ``topk_v2``: the path the plugin's paged branch replaces) at 1024 rows x 64K, 256K,
  768K and 8192 rows x 768K. That run's own timings of our backends are left out: they predate
  the Hopper stream, which serves this layout now.
* prefill, ``sglang_mxfp4``: its stream's rows sweep (8 to 1024 rows at 64K, 256K, 768K) and
  grid (1024 and 8192 rows); the earlier grid's ``sglang_mxfp4`` rows timed the plain kernel,
  which no longer serves it here, and are left out. SGLang has no FP4 indexer below SM100.
* prefill, ``aiter_mxfp4``: the grid (1024 rows at 64K and 768K, 8192 rows at 768K).
* decode (graph replays, one or two rows per request): the three committed decode runs, with
  SGLang's own decode step where it was timed (``sglang_fp8``).

The grid's ``random`` pattern only (its ``increasing`` rows are an adversarial check).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from indexer_topk import routes  # noqa: E402
from indexer_topk.files import relative_name  # noqa: E402

RESULTS = "benchmark/results"
SHIPPED = REPO / "python/indexer_topk/routes/nvidia-h200.json"
H200 = routes.DeviceClass("nvidia", "sm_90", 132, "NVIDIA H200")
H200_CONDITIONS = {"triton": "3.6", "hopper_stream": True}
NO_PATH = {"sglang_mxfp4", "aiter_mxfp4"}  # no SGLang path of these layouts on an H200

# (file, commit that measured it, what it holds). Commits of files whose records do not carry
# one (or carry a working tree's) are those benchmark/results/NOTES.md gives.
ROWS_SWEEPS = [
    (f"{RESULTS}/hopper/rows_sweep_nvidia-h200.json", "27ad8e3"),
    (f"{RESULTS}/hopper/rows_sweep_sglang_mxfp4_nvidia-h200.json", "2b18357"),
]
GRIDS = [  # (file, commit, layouts taken from it)
    (f"{RESULTS}/bench_nvidia-h200.json", "a1204af", {"sglang_fp8", "aiter_mxfp4"}),
    (f"{RESULTS}/r8192/bench_nvidia-h200.json", "a1204af", {"sglang_fp8", "aiter_mxfp4"}),
    (f"{RESULTS}/hopper/grid_mxfp4_stream/bench_nvidia-h200.json", "2b18357", {"sglang_mxfp4"}),
    (f"{RESULTS}/hopper/grid_mxfp4_stream/r8192/bench_nvidia-h200.json", "2b18357", {"sglang_mxfp4"}),
]
SGLANG_PREFILL = [
    (f"{RESULTS}/sglang_cuda/sglang_cuda_anchor_r1024.json", "2e194a3"),
    (f"{RESULTS}/sglang_cuda/sglang_cuda_anchor_r8192.json", "2e194a3"),
]
DECODE = [
    (f"{RESULTS}/decode/decode_nvidia-h200.json", "61a93a9"),
    (f"{RESULTS}/decode/decode_fc40b20_nvidia-h200.json", "fc40b20"),
    (f"{RESULTS}/decode/decode_df2fe3c_nvidia-h200.json", "df2fe3c"),
]


def _load(path: str):
    return json.loads((REPO / path).read_text())


def _record(kind, layout, rows, requests, tokens, topk, candidates, source, sglang="unset"):
    r = {"kind": kind, "layout": layout, "topk": topk, "requests": requests, "rows_per_request": rows // requests,
         "rows": rows, "context_tokens": tokens, "timing": "eager" if kind == "prefill" else "graph",
         "candidates": candidates, "source": {"file": source[0], "commit": source[1]}}
    if layout in NO_PATH:
        r["sglang_ms"] = None
    elif sglang != "unset":
        r["sglang_ms"] = sglang
    return r


def committed_h200_records() -> list:
    """The committed H200 measurements as serving-mix records (see the module docstring)."""
    out = []
    for path, commit in ROWS_SWEEPS:
        for r in _load(path):
            cands = {"legacy": r["legacy_ms"], **({"fused": r["fused_ms"]} if r["eq_legacy"] else {})}
            out.append(_record("prefill", r["layout"], r["rows"], 1, r["tokens"], 1024, cands, (path, commit)))
    for path, commit, layouts in GRIDS:
        groups: dict = {}
        for r in _load(path):
            if r["layout"] in layouts and r.get("pattern") == "random" and r.get("status") == "ok":
                key = (r["layout"], r["rows"], r["requests"], r["context_tokens"], r["topk"])
                groups.setdefault(key, []).append(r)
        for (layout, rows, requests, tokens, topk), rs in groups.items():
            cands = {r["backend"]: r["median_ms"] for r in rs if r["backend"] == "legacy" or r.get("matches_legacy")}
            out.append(_record("prefill", layout, rows, requests, tokens, topk, cands, (path, commit)))
    for path, commit in SGLANG_PREFILL:
        for c in _load(path)["cases"]:
            out.append(_record("prefill", c["layout"], c["rows"], 1, c["context_tokens"], c["topk"], {}, (path, commit),
                               sglang=c["sglang_paged_pipeline"]["ms"]))
    for path, commit in DECODE:
        groups = {}
        for r in _load(path):
            groups.setdefault((r["layout"], r["rows"], r["requests"], r["context_tokens"], r["topk"]), []).append(r)
        for (layout, rows, requests, tokens, topk), rs in groups.items():
            ours = {r["backend"]: r["graph_ms"] for r in rs if r["backend"] in routes.OURS
                    and (r["backend"] == "legacy" or r.get("matches_legacy"))}
            theirs = [r["graph_ms"] for r in rs if r["backend"] == "sglang"]
            out.append(_record("decode", layout, rows, requests, tokens, topk, ours, (path, commit),
                               sglang=theirs[0] if theirs else "unset"))
    return out


def _results_commit() -> str:
    """The last commit that touched the records read (the checkout the table cites)."""
    files = [p for p, *_ in ROWS_SWEEPS + GRIDS + SGLANG_PREFILL + DECODE]
    proc = subprocess.run(["git", "log", "-1", "--format=%h", "--", *files], cwd=REPO, capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def committed_h200_table() -> dict:
    return routes.table_from_records(
        committed_h200_records(), H200, "benchmark/routes_from_records.py (committed H200 records)",
        commit=_results_commit(), versions={"torch": "2.11.0+cu130", "triton": "3.6.0"}, conditions=H200_CONDITIONS,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mix", metavar="FILE", help="a serving-mix records file (default: the committed H200 records)")
    p.add_argument("--out", metavar="PATH", help="where to write the table (default: the package's table of the device)")
    p.add_argument("--check", action="store_true", help="compare with the table at --out instead of writing it")
    a = p.parse_args(argv)
    if a.mix:
        mix = Path(a.mix)
        doc = routes.table_from_file(mix, source=relative_name(mix, REPO))
        default = REPO / "python/indexer_topk/routes" / f"{doc['device']['name'].lower().replace(' ', '-') or 'device'}.json"
    else:
        doc, default = committed_h200_table(), SHIPPED
    out = Path(a.out) if a.out else default
    if a.check:
        have = json.loads(out.read_text())
        same = all(have.get(k) == doc[k] for k in ("device", "conditions", "context", "engine_margin", "entries"))
        print(f"{out}: {'matches' if same else 'DIFFERS from'} what the records give ({len(doc['entries'])} entries)")
        return 0 if same else 1
    routes.write_table(doc, out, force=True)
    print(f"wrote {out}: {len(doc['entries'])} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
