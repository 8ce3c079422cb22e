"""The serving-mix benchmark (:mod:`indexer_topk.bench.mix`) on a CPU: its record, its checks."""

import json

import torch

from indexer_topk.bench import mix


def test_selection_overlap_counts_what_theirs_selects_that_ours_selects_too():
    theirs = torch.tensor([[5, 3, -1, -1], [1, 2, 3, 4]], dtype=torch.int32)
    ours = torch.tensor([[3, 9, 5, 7], [4, 3, 8, -1]], dtype=torch.int32)
    assert mix.selection_overlap(theirs, ours) == 4 / 6  # row 0: both of two; row 1: two of four
    assert mix.selection_overlap(torch.full((2, 3), -1), ours) == 1.0


def test_mixed_batch_lengths_and_labels():
    s = mix.MixShape("decode", "sglang_fp8", 1024, 64, 1, 786432, spread=True)
    lengths = s.context_lengths()
    assert len(lengths) == 64 and lengths[0] == 4096 and lengths[-1] == 786432 and lengths == sorted(lengths)
    assert s.label == "decode 64 x 4K..768K"
    assert mix.MixShape("prefill", "aiter_mxfp4", 512, 1, 1024, 65536).label == "prefill 1024 x 64K (aiter_mxfp4, topk 512)"
    shapes = mix.default_shapes()
    prefill = {(s.layout, s.topk, s.rows, s.context_tokens) for s in shapes if s.kind == "prefill"}
    assert {("sglang_fp8", 1024, r, c * 1024) for r in (128, 1024, 8192) for c in (16, 64, 256, 768)} <= prefill
    assert mix.decode_floor_ms(mix.MixShape("decode", "sglang_fp8", 1024, 1, 1, 786432)) > 0


def test_run_mix_records_a_tiny_shape_on_the_cpu(tmp_path):
    shape = mix.MixShape("prefill", "sglang_fp8", 512, 1, 2, 2600)
    seen = []
    records = mix.run_mix([shape], device="cpu", candidates=("legacy",), iters=1, host_calls=1,
                          progress=lambda i, n, s: seen.append((i, n, s.label)), on_record=seen.append)
    (rec,) = records
    assert "error" not in rec, rec.get("error")
    assert seen[0] == (0, 1, shape.label) and seen[1] is rec
    assert rec["matches_legacy"] is True and rec["route"] in ("legacy", "fused", "reference")
    assert rec["candidates"].keys() == {"legacy"} and rec["ours_ms"] > 0 and rec["host_us"] > 0
    assert "sglang_ms" not in rec and rec["timing"] == "eager"  # SGLang's path not timed: no key
    json.dumps(records)  # the record is what the JSON file holds
