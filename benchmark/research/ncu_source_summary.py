#!/usr/bin/env python3
"""Where a kernel's warps stall, by Python source line and by region of the fused kernel.

    ncu --clock-control none -k regex:fused_topk_kernel --launch-skip 1 --launch-count 1 \\
        --section WarpStateStats --section SourceCounters --import-source yes -o fused_src \\
        python3 benchmark/research/ncu_fused.py
    ncu -i fused_src.ncu-rep --page source --csv --print-source cuda,sass > src.csv
    python3 benchmark/research/ncu_source_summary.py src.csv [--top 40] [--regions KERNEL_MODULE.py]

Nsight Compute's source page attributes warp-stall samples (all samples: a warp resident and
sampled, issuing or not) to the Triton source lines the machine code came from. This sums them
per file, per line and per region of ``kernels/fused.py`` (the scoring loop with the score
tile, the flush and the cuts, the end of an item), so the share of time each part holds comes
from one measurement. Library lines (``triton/language/standard.py``: sums, scans, sorts) serve
several regions and are listed on their own. ``--regions`` names another kernel module whose
functions are the regions (``kernels/split_topk.py`` for the decode step's finishing kernel).
"""

from __future__ import annotations

import argparse
import collections
import csv
import ast
import gzip
import sys
from pathlib import Path

FUSED_SOURCE = Path(__file__).resolve().parents[2] / "python" / "indexer_topk" / "kernels" / "fused.py"
FUSED_ROLES = {"_stage": "scoring loop (_stage)", "_flush": "flush (_flush)", "_finish_row": "end of item (_finish_row)",
               "fused_topk_kernel": "item set-up and queue (fused_topk_kernel)", "visit_step": "visit order",
               "_gcd": "visit order"}
# Files that only one region uses.
FILE_REGIONS = {"score.py": "score tile (score.py)", "candidates.py": "cut (candidates.py)",
                "select.py": "radix histogram and final write (select.py)", "common.py": "order keys (common.py)"}


def read_samples(path):
    """``({(file, line): samples}, {(file, line): source text}, {(file, line): Counter of stall
    reasons})`` from a ``--page source --csv`` export."""
    opener = gzip.open if path.endswith(".gz") else open
    samples, text, reasons = collections.Counter(), {}, collections.defaultdict(collections.Counter)
    name = col = None
    stall_cols = {}
    with opener(path, "rt", newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "File Path":
                name = row[1].replace("\\", "/").split("/")[-1]
            elif row[0] == "Line No":
                col = row.index("Warp Stall Sampling (All Samples)")
                stall_cols = {i: h[len("stall_"):] for i, h in enumerate(row)
                              if h.startswith("stall_") and "Not Issued" not in h}
            elif row[0] and col is not None and name is not None:
                try:
                    line, n = int(row[0]), int(row[col])
                except ValueError:
                    continue
                samples[(name, line)] += n
                text[(name, line)] = row[1].strip()
                for i, reason in stall_cols.items():
                    if row[i].isdigit():
                        reasons[(name, line)][reason] += int(row[i])
    return samples, text, reasons


def module_regions(source=FUSED_SOURCE):
    """``[(label, first line, last line)]`` of a kernel module's functions (the fused kernel's by
    default), read from the source the profile ran (run this from the same checkout)."""
    tree = ast.parse(Path(source).read_text())
    return [(FUSED_ROLES.get(f.name, f.name), f.lineno, f.end_lineno)
            for f in tree.body if isinstance(f, ast.FunctionDef)]


def region(name, line, regions, module="fused.py"):
    if name == module:
        for label, lo, hi in regions:
            if lo <= line <= hi:
                return label
    return FILE_REGIONS.get(name, f"library ({name})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--regions", default=str(FUSED_SOURCE), help="the kernel module whose functions are the regions")
    a = p.parse_args(argv)
    samples, text, reasons = read_samples(a.csv)
    total = sum(samples.values())
    if not total:
        print("no warp-stall samples in", a.csv, file=sys.stderr)
        return 1
    print(f"warp-stall samples: {total}")
    spans = module_regions(a.regions)
    module = Path(a.regions).name
    regions = collections.Counter()
    for (name, line), n in samples.items():
        regions[region(name, line, spans, module)] += n
    print("\nby region")
    for label, n in regions.most_common():
        print(f"{100 * n / total:6.1f}%  {label}")
    overall = collections.Counter()
    for r in reasons.values():
        overall.update(r)
    print("\nby stall reason (all lines)")
    for reason, n in overall.most_common(8):
        print(f"{100 * n / total:6.1f}%  {reason}")
    print(f"\ntop {a.top} lines, with their three largest stall reasons")
    for (name, line), n in samples.most_common(a.top):
        top = ", ".join(f"{r} {100 * v / n:.0f}%" for r, v in reasons[(name, line)].most_common(3) if v)
        print(f"{100 * n / total:6.1f}%  {name}:{line}  {text[(name, line)][:80]}  [{top}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
