#!/usr/bin/env python3
"""A quick GPU check of replayed driver launches: three legacy calls (128 x 16K, FP8) on fresh
workloads against the full path, how many launches go through the driver, and a replay from a
new thread.

    PYTHONPATH=python python3 benchmark/research/driver_launch_check.py
"""
import sys, threading
sys.path.insert(0, "python")
import torch, indexer_topk
from indexer_topk import api
from indexer_topk.envs import envs
from indexer_topk.compare import bitwise_equal
from indexer_topk.contract import allocate_result
from indexer_topk.workload import make_workload
ok = True
for seed in (1, 2, 3):
    w = make_workload("sglang_fp8", context_tokens=[16384], rows_per_request=[128], topk=1024, seed=seed, device="cuda")
    out = allocate_result(w.rows, w.topk, "cuda")
    torch.ops.indexer_topk.indexer_topk_out(*w.args(), w.topk, "sglang_fp8", *out, None, w.weight_scale, "legacy", False, None)
    with envs.INDEXER_TOPK_REPLAY.override(False):
        want = indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="legacy")
    ok &= bitwise_equal(out, want)
steps = [s for k in api._KNOWN._calls.values() for r in k.replays.values() if r for s in r.steps if hasattr(s, "driver")]
print("driver launches", sum(s.driver is not None for s in steps), "of", len(steps), "exact", ok)
# a replay from a thread that made no CUDA call before
res = {}
def worker():
    out2 = allocate_result(w.rows, w.topk, "cuda")
    torch.ops.indexer_topk.indexer_topk_out(*w.args(), w.topk, "sglang_fp8", *out2, None, w.weight_scale, "legacy", False, None)
    torch.cuda.synchronize()
    res["eq"] = bitwise_equal(out2, want)
t = threading.Thread(target=worker); t.start(); t.join()
print("thread replay exact", res.get("eq"))
