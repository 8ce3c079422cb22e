"""Stress run: many mixed calls, fused checked against legacy bit for bit, inside guard bands.

On a GPU, from the repository root (about 1,000 calls; ``--minutes`` caps the wall time)::

    PYTHONPATH=python python3 benchmark/stress.py --calls 1000 --minutes 30 --seed 0 --out benchmark/results

On a CPU, a smoke run of tiny shapes under the Triton interpreter (the test suite runs it)::

    PYTHONPATH=python python3 benchmark/stress.py --smoke --calls 6 --out /tmp/stress

Each call draws a layout, a score pattern, a topk (512 or 1024), a shape class (``small``:
1-64 rows over 1K-64K tokens; ``medium``: 64-1024 rows over 64K-256K; ``large``: 1024-4096
rows over 256K-1M; ``tiny`` in the smoke run: 1-3 rows over 0-4K), 1-4 requests (some
empty), ``check_values`` on or off, and a workspace: none, or one of three caller-owned
workspaces that persist across calls (grown when a call needs more, never cleared, so each
call finds the previous calls' scratch in it). Legacy and fused get the same workspace and
outputs that are poisoned (sentinels) slices of larger sentinel buffers. A call passes when
the four outputs of the two paths are identical bit for bit, no output slot still holds a
sentinel, and no byte around an output or the workspace changed.

Writes ``stress_<device>.json`` (``stress_smoke.json`` in the smoke run) under ``--out``,
rewritten after every call so a run cut short keeps its record: the environment, the
command, totals, and every call with its draw and its outcome. Prints a summary table by
layout and shape class. Exit status 1 if any call mismatched, left a slot unwritten, wrote
out of bounds or raised.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections import Counter

import torch

WORKSPACE_SLOTS = 3
PATTERN_WEIGHTS = {"random": 3, "increasing": 1, "decreasing": 1, "equal": 1, "zero_plateau": 1, "nan_rows": 1}
# (rows, raw context tokens per request) ranges, drawn log-uniformly, and each class's share.
SHAPES = {
    "small": ((1, 64), (1024, 64 * 1024), 0.80),
    "medium": ((64, 1024), (64 * 1024, 256 * 1024), 0.15),
    "large": ((1024, 4096), (256 * 1024, 1024 * 1024), 0.05),
}
SMOKE_SHAPE = ((1, 3), (0, 4000))


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def draw_call(rng: random.Random, layouts, smoke: bool) -> dict:
    """One call's random draw (plain values, so it goes into the JSON record as is)."""
    if smoke:
        shape = "tiny"
        (row_lo, row_hi), (ctx_lo, ctx_hi) = SMOKE_SHAPE
        total_rows = rng.randint(row_lo, row_hi)
        n_req = rng.randint(1, 2)
        contexts = [rng.randint(ctx_lo, ctx_hi) for _ in range(n_req)]
        topk = 512
    else:
        shape = rng.choices(list(SHAPES), weights=[s[2] for s in SHAPES.values()])[0]
        (row_lo, row_hi), (ctx_lo, ctx_hi), _ = SHAPES[shape]
        total_rows = _log_uniform(rng, row_lo, row_hi)
        n_req = rng.randint(1, 4)
        contexts = [0 if rng.random() < 0.1 else _log_uniform(rng, ctx_lo, ctx_hi) for _ in range(n_req)]
        topk = rng.choice([512, 1024])
    cuts = sorted(rng.randint(0, total_rows) for _ in range(n_req - 1))
    rows = [max(1, b - a) for a, b in zip([0] + cuts, cuts + [total_rows])]
    return dict(
        layout=rng.choice(list(layouts)),
        pattern=rng.choices(list(PATTERN_WEIGHTS), weights=list(PATTERN_WEIGHTS.values()))[0],
        topk=topk, shape=shape, context_tokens=contexts, rows_per_request=rows,
        check_values=rng.random() < 0.5,
        workspace=rng.choice([None] + list(range(WORKSPACE_SLOTS))),
        seed=rng.randrange(1 << 30),
    )


def run_call(spec: dict, workspaces: list, device) -> dict:
    """Build the call's workload, run legacy and fused on it; the outcome's fields."""
    import indexer_topk as it
    from indexer_topk.compare import bitwise_equal, first_difference
    from indexer_topk.guards import GuardedResult, GuardedWorkspace, unwritten_slots

    w = it.make_workload(spec["layout"], context_tokens=spec["context_tokens"], rows_per_request=spec["rows_per_request"],
                         topk=spec["topk"], seed=spec["seed"], device=device, pattern=spec["pattern"])
    outcome = {"rows": w.rows, "c4_len": w.c4_len}
    ws = None
    if spec["workspace"] is not None:
        need = it.workspace_size(w.rows, w.topk, w.layout.value, device)
        slot = spec["workspace"]
        if workspaces[slot] is None or workspaces[slot].nbytes < need:
            # grown with headroom; a fresh one is garbage (0xA5) like a reused one
            workspaces[slot] = GuardedWorkspace(need + need // 2, device)
        ws = workspaces[slot]
        outcome["workspace_bytes"] = ws.nbytes
    results, problems = {}, []
    for backend in ("legacy", "fused"):
        g = GuardedResult(w.rows, w.topk, device)
        it.indexer_topk(*w.args(), **w.kwargs(), backend=backend, out=g.out, workspace=None if ws is None else ws.workspace,
                        check_values=spec["check_values"])
        problems += [f"{backend}: {v}" for v in g.violations()]
        problems += [f"{backend}: {name} has a slot never written" for name in unwritten_slots(g.out)]
        if ws is not None:
            problems += [f"{backend}: {v}" for v in ws.violations()]
        results[backend] = g.out
    if problems:
        outcome.update(status="out_of_bounds", detail="; ".join(problems))
    elif not bitwise_equal(results["fused"], results["legacy"]):
        outcome.update(status="mismatch", detail=first_difference(results["fused"], results["legacy"]))
    else:
        outcome["status"] = "ok"
    return outcome


def summary_table(calls: list) -> str:
    """Calls and failures by layout and shape class, and the total."""
    groups = Counter((c["layout"], c["shape"]) for c in calls)
    bad = Counter((c["layout"], c["shape"], c["status"]) for c in calls if c["status"] != "ok")
    head = f"{'layout':14s} {'shape':7s} {'calls':>6s} {'mismatch':>9s} {'out of bounds':>14s} {'error':>6s}"
    lines = [head, "-" * len(head)]
    for (layout, shape), n in sorted(groups.items()):
        lines.append(f"{layout:14s} {shape:7s} {n:6d} {bad[layout, shape, 'mismatch']:9d} "
                     f"{bad[layout, shape, 'out_of_bounds']:14d} {bad[layout, shape, 'error']:6d}")
    status = Counter(c["status"] for c in calls)
    lines.append(f"{'all':14s} {'':7s} {len(calls):6d} {status['mismatch']:9d} {status['out_of_bounds']:14d} "
                 f"{status['error']:6d}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=1000, help="calls to make (default 1000)")
    p.add_argument("--minutes", type=float, default=None, help="stop drawing new calls after this long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under the Triton interpreter")
    p.add_argument("--out", default="benchmark/results")
    a = p.parse_args(argv)
    if a.smoke:
        # before any kernel module is imported: Triton decides then
        os.environ["TRITON_INTERPRET"] = "1"
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print("stress: needs a CUDA/HIP GPU (or --smoke for a CPU run under the Triton interpreter)", file=sys.stderr)
        return 2
    from indexer_topk.bench.environment import environment, gpu_slug
    from indexer_topk.options import LAYOUTS

    rng = random.Random(a.seed)
    env = environment(device)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "stress_smoke.json" if a.smoke else f"stress_{gpu_slug(env['gpu'])}.json")
    shown = list(sys.argv[1:] if argv is None else argv)
    calls: list = []
    workspaces: list = [None] * WORKSPACE_SLOTS
    started = time.time()

    def write(finished: bool) -> dict:
        status = Counter(c["status"] for c in calls)
        record = {
            **env, "command": "PYTHONPATH=python python3 benchmark/stress.py " + " ".join(shown),
            "seed": a.seed, "smoke": a.smoke, "calls_requested": a.calls, "minutes_limit": a.minutes,
            "finished": finished, "elapsed_s": round(time.time() - started, 1),
            "calls": len(calls), "ok": status["ok"], "mismatches": status["mismatch"],
            "out_of_bounds": status["out_of_bounds"], "errors": status["error"],
            "check_values_off": sum(not c["check_values"] for c in calls),
            "with_workspace": sum(c["workspace"] is not None for c in calls),
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
            "by_layout": dict(Counter(c["layout"] for c in calls)),
            "by_pattern": dict(Counter(c["pattern"] for c in calls)),
            "by_shape": dict(Counter(c["shape"] for c in calls)),
            "call_log": calls,
        }
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
        return record

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for i in range(a.calls):
        if a.minutes is not None and time.time() - started > 60 * a.minutes:
            break
        spec = draw_call(rng, LAYOUTS, a.smoke)
        t0 = time.time()
        try:
            outcome = run_call(spec, workspaces, device)
        except Exception as exc:  # a failure is a result to record, not a reason to stop
            outcome = {"status": "error", "detail": repr(exc)[:500]}
        calls.append({"index": i, **spec, **outcome, "seconds": round(time.time() - t0, 3)})
        write(finished=False)
    record = write(finished=True)
    print(summary_table(calls))
    print(f"stress: {record['calls']} calls ({record['check_values_off']} with check_values off, "
          f"{record['with_workspace']} with a reused workspace), {record['mismatches']} mismatches, "
          f"{record['out_of_bounds']} out of bounds, {record['errors']} errors, {record['elapsed_s']:.0f} s on "
          f"{record['gpu']}; record: {path}")
    return 0 if record["ok"] == record["calls"] else 1


if __name__ == "__main__":
    sys.exit(main())
