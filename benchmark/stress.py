"""Stress run: minutes of mixed random batches, fused checked against legacy bit for bit.

Run on a GPU from the repository root::

    PYTHONPATH=python python3 benchmark/stress.py --minutes 3 [--out benchmark/results]

Each call draws a layout, a topk (512 or 1024), 1-4 requests with raw contexts log-uniform in
4K..1M tokens (some requests empty), and 1..8192 query rows in all, builds the batch with
``make_workload`` (scattered pages, a random score pattern), runs the legacy and fused backends
and compares all four outputs bit for bit. Writes ``stress_<gpu>.json`` with the number of
calls, mismatches (each with its seed and shape), errors and the peak device memory, and prints
one summary line. Exit status 1 if anything mismatched or raised.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import torch

from indexer_topk.bench.environment import environment, gpu_slug
from indexer_topk.options import LAYOUTS


def draw_batch(rng: random.Random):
    layout = rng.choice(LAYOUTS)
    topk = rng.choice([512, 1024])
    n_req = rng.randint(1, 4)
    total_rows = int(math.exp(rng.uniform(0, math.log(8192))))
    contexts = [0 if rng.random() < 0.1 else int(math.exp(rng.uniform(math.log(4096), math.log(1 << 20)))) for _ in range(n_req)]
    cuts = sorted(rng.randint(0, total_rows) for _ in range(n_req - 1))
    rows = [max(1, b - a) for a, b in zip([0] + cuts, cuts + [total_rows])]
    pattern = rng.choice(["random"] * 4 + ["increasing", "decreasing", "equal", "zero_plateau", "nan_rows"])
    return dict(layout=layout, topk=topk, context_tokens=contexts, rows_per_request=rows, pattern=pattern,
                seed=rng.randrange(1 << 30))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmark/results")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("stress: needs a CUDA/HIP GPU", file=sys.stderr)
        return 2
    from indexer_topk.backends.fused import fused_indexer_topk
    from indexer_topk.backends.legacy import legacy_indexer_topk
    from indexer_topk.compare import bitwise_equal
    from indexer_topk.workload import make_workload

    device = torch.device("cuda")
    rng = random.Random(a.seed)
    done, mismatches, errors = [], [], []
    argv = list(argv if argv is not None else sys.argv[1:])
    shown = [x for i, x in enumerate(argv) if x != "--out" and (i == 0 or argv[i - 1] != "--out")]
    os.makedirs(a.out, exist_ok=True)
    env = environment(device)
    path = os.path.join(a.out, f"stress_{gpu_slug(env['gpu'])}.json")

    def write():
        """The record so far: rewritten after every call, so a run cut short keeps its counts."""
        record = {
            **env, "minutes": a.minutes, "seed": a.seed,
            "calls": len(done), "mismatches": len(mismatches), "errors": len(errors),
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20,
            "mismatch_cases": mismatches[:20], "error_cases": errors[:20], "batches": done,
            "command": "PYTHONPATH=python python3 benchmark/stress.py " + " ".join(shown),
        }
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
        return record

    torch.cuda.reset_peak_memory_stats()
    deadline = time.time() + 60 * a.minutes
    while time.time() < deadline:
        spec = draw_batch(rng)
        try:
            w = make_workload(spec["layout"], context_tokens=spec["context_tokens"],
                              rows_per_request=spec["rows_per_request"], topk=spec["topk"], seed=spec["seed"],
                              device=device, pattern=spec["pattern"])
            leg = legacy_indexer_topk(w.args(), **w.kwargs())
            fu = fused_indexer_topk(w.args(), **w.kwargs())
            done.append(spec)
            if not bitwise_equal(fu, leg):
                mismatches.append(spec)
        except Exception as exc:  # a failure is a result to report, not a reason to stop
            errors.append({**spec, "error": repr(exc)[:300]})
        finally:
            w = leg = fu = None
        write()
    record = write()
    print(f"stress: {record['calls']} calls, {record['mismatches']} mismatches, {record['errors']} errors, "
          f"peak {record['peak_mib']:.0f} MiB on {record['gpu']}")
    return 1 if mismatches or errors else 0


if __name__ == "__main__":
    sys.exit(main())
