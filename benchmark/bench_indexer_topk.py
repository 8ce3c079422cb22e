#!/usr/bin/env python3
"""GPU benchmark of the indexer top-k backends; see ``indexer_topk.bench`` for what is measured.

    python benchmark/bench_indexer_topk.py            # full grid, results in benchmark/results/
    python benchmark/bench_indexer_topk.py --quick    # small grid
    python benchmark/bench_indexer_topk.py --help
"""

import sys
from pathlib import Path

try:
    from indexer_topk.bench.cli import main
except ImportError:  # running from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    from indexer_topk.bench.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="python benchmark/bench_indexer_topk.py"))
