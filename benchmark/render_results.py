#!/usr/bin/env python3
"""Re-render the markdown table and the PNG plot of a benchmark run from its JSON.

    python benchmark/render_results.py benchmark/results/bench_nvidia-h200.json [--command "..."]

Writes ``<stem>.md`` and ``<stem>.png`` beside the JSON, exactly as the benchmark itself does
(the same writers), for a run whose JSON was kept but whose other files were not.
"""

import argparse
import json
import sys
from pathlib import Path

try:
    from indexer_topk.bench import environment, report
except ImportError:  # running from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    from indexer_topk.bench import environment, report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", type=Path)
    p.add_argument("--command", default="python benchmark/bench_indexer_topk.py",
                   help="the benchmark command the run used, for the markdown header")
    a = p.parse_args(argv)
    records = json.loads(a.json.read_text())
    if not records:
        print(f"{a.json}: no records", file=sys.stderr)
        return 1
    env = {k: records[0].get(k) for k in environment.ENV_KEYS}
    report.write_markdown(records, a.json.with_suffix(".md"), env=env, command=a.command)
    report.write_plot(records, a.json.with_suffix(".png"), title=f"indexer top-k on {env['gpu']}")
    print(f"wrote {a.json.with_suffix('.md')} and {a.json.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
