"""Fake ``aiter.ops.flydsl`` that resolves exports lazily and fails doing so.

Real AITER maps export names to kernel modules in a module ``__getattr__``; reading the fused
top-k symbol imports its kernel module, which can fail (e.g. FlyDSL's compiler is missing).
"""

SYMBOL = "flydsl_pa_mqa_topk_fp4_prefill"


def __getattr__(name):
    if name == SYMBOL:
        raise ImportError("fake aiter: No module named 'flydsl'")
    raise AttributeError(name)
