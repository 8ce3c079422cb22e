"""Fake ``aiter.ops.flydsl`` of an AITER build without the fused top-k kernel.

It exports the non-fused prefill logits kernel only, as AITER's main branch does.
"""


def flydsl_pa_mqa_logits_fp4_prefill(*args, **kwargs):
    raise AssertionError("fake: the non-fused kernel is never called by indexer_topk")
