#!/usr/bin/env python3
"""The Python part of a replayed call's host path, on a CPU (no GPU needed): the API's own work
between the caller and the first launch, with the replay's launches left out.

    TRITON_INTERPRET=1 PYTHONPATH=python python3 benchmark/research/host_cpu.py [--calls 50000]

One small call (FP8, 8 rows of one request, 4K tokens, topk 1024, a workspace, caller-owned
outputs) is made once through each way, so its signature is known and its launches recorded;
then ``Replay.run`` is replaced by a no-op and the mean wall time of back-to-back calls is taken
through the out operator and through the Python API, with the parts of the API timed alone.
What a GPU host adds (the launches, the scratch allocation, CUDA's current-device and stream
queries) is not here: ``host_breakdown.py`` times those on a GPU. Figures from one CPU compare
two commits run on it, not another machine's host.
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import torch  # noqa: E402

import indexer_topk  # noqa: E402
from indexer_topk import api, calls, replay  # noqa: E402
from indexer_topk.contract import allocate_result  # noqa: E402
from indexer_topk.envs import envs  # noqa: E402
from indexer_topk.workload import make_workload  # noqa: E402


def mean_us(fn, calls_: int) -> float:
    for _ in range(min(1000, calls_)):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls_):
        fn()
    return (time.perf_counter() - t0) / calls_ * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=50000)
    ap.add_argument("--backend", default="legacy", choices=("legacy", "fused", "auto"))
    a = ap.parse_args()
    w = make_workload("sglang_fp8", context_tokens=[4096], rows_per_request=[8], topk=1024, device="cpu")
    out = allocate_result(w.rows, w.topk, "cpu")
    ws = torch.empty(indexer_topk.workspace_size(w.rows, w.topk, "sglang_fp8"), dtype=torch.uint8)
    args = w.args()

    def op():
        torch.ops.indexer_topk.indexer_topk_out(*args, w.topk, w.layout.value, *out, ws, w.weight_scale, a.backend,
                                                False, None)

    def direct():
        api.indexer_topk(*args, topk=w.topk, layout=w.layout.value, weight_scale=w.weight_scale, backend=a.backend,
                         out=out, workspace=ws, check_values=False, rows_per_request=None)

    op()
    (known,) = api._KNOWN._calls.values()
    rep = next(r for r in known.replays.values() if r is not None)
    replay.Replay.run = lambda self, *args_: None
    tensors = (*args, *out, ws)
    scalars = (int, w.topk, str, w.layout.value, float, w.weight_scale, False, a.backend, bool, False, None, False, -1)
    if getattr(known, "guard", None) is not None:  # a tree with the guard: the scalars as its API keys them
        scalars = known.guard.scalars
    # as the API keys it, in this tree or an earlier one's
    keyed = (api._OFFSET_KEYED, api._SIGN_KEYED) if hasattr(api, "_SIGN_KEYED") else (api._OFFSET_KEYED,)
    key, ptrs = calls.signature(tensors, scalars, *keyed)
    parts = {
        "operator": op,
        "API": direct,
        "  signature": lambda: calls.signature(tensors, scalars, *keyed),
        "  lookup": lambda: api._KNOWN.get(key),
        **({"  or the guard instead": lambda: known.guard.addresses(tensors, scalars)}
           if getattr(known, "guard", None) is not None else {}),
        "  replay switch": lambda: envs.INDEXER_TOPK_REPLAY.get(),
        "  overlap check": (lambda: calls.disjoint(ptrs, known.lengths, known.sized)) if hasattr(known, "sized")
        else (lambda: calls.disjoint(ptrs, known.lengths)),
        "  route": lambda: api._known_route(known, a.backend, w.topk),
        "  recorded switches": rep.matches_env,
    }
    print(f"{a.backend}, {len(rep.env)} recorded switches; us per call (launches left out)")
    for name, fn in parts.items():
        print(f"{name:22s} {mean_us(fn, a.calls):6.2f}", flush=True)
    # a recording's one piece of host work for each launch through the driver (GPU only) that a
    # CPU can time: its kernel's .entry parameters read from a PTX of 20 pointer parameters
    from indexer_topk.kernels.driver_launch import ptx_params

    ptx = (".version 8.7\n.visible .entry k(\n"
           + ",\n".join(f"\t.param .u64 .ptr .global .align 1 k_param_{i}" for i in range(20))
           + "\n)\n{\n" + "\tld.global.u32 %r1, [%rd1];\n" * 20000 + "}\n")
    parse = getattr(ptx_params, "__wrapped__", ptx_params)
    print(f"{'PTX parameters, read':22s} {mean_us(lambda: parse(ptx, 'k'), 200):6.2f}")
    print(f"{'  as a recording asks':22s} {mean_us(lambda: ptx_params(ptx, 'k'), 200):6.2f}")


if __name__ == "__main__":
    main()
