"""SGLang's DSv4 indexer on a CUDA device, with the kernels SGLang's NVIDIA path runs.

What serves where sgl-kernel and SGLang's JIT kernels would (``open_sglang_cuda``):

* DeepGEMM's ``fp8_paged_mqa_logits`` / ``fp8_fp4_paged_mqa_logits`` / ``fp8_mqa_logits`` and
  ``get_paged_mqa_logits_metadata``: the real ``deep_gemm`` package the SGLang CUDA anchor kit
  builds (DeepGEMM v2.6.1, whose paged-logits kernel is byte-identical to SGLang 0.5.23's pin).
  SGLang's own JIT schedule builder (taken above 11,673 rows) is replaced by DeepGEMM's, which
  computes the same schedule.
* ``plan_topk_v2`` / ``topk_transform_paged_v2``: SGLang's ``topk_v2.cuh``, unmodified, built
  by the kit as a torch extension; SGLang's wrappers only bind it through tvm-ffi.
* SGLang's server configuration, which its logits budget reads (``mem_fraction_static``): a
  fixed value (``MEM_FRACTION_STATIC``), as a launched server would have published.
* The query quantisers behind ``fused_q_indexer_rope_hadamard{,_fp4}_quant`` stay the doubles
  of ``kernels.py`` (they need SGLang's tvm-ffi JIT): both routes consume the same quantised
  query, so a double there cannot favour either.

Everything else on the path is SGLang's Python, run as released.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import torch

from indexer_topk.bench.mix import load_anchor_kit

from .environment import SGLang, open_sglang
from .kernels import Calls, Patcher, _QuantModule, spy


# The fraction of GPU memory SGLang's server reserves for weights and caches; the logits budget
# of a prefill's row chunking is sized from what it leaves.
MEM_FRACTION_STATIC = 0.85


def install_cuda_kernels(sg: SGLang, patcher: Patcher, calls: Calls, kit: Path) -> None:
    """Bind SGLang's indexer to DeepGEMM and ``topk_v2`` (see the module docstring)."""
    deep_gemm, _, topk = load_anchor_kit(str(kit))

    def plan_topk_v2(lens):
        calls["topk_v2.plan"] += 1
        return topk.plan(lens)

    def topk_transform_paged_v2(logits, lens, table, out, page_size, plan, raw_indices=None):
        calls["topk_v2.transform_paged"] += 1
        topk.transform(logits, lens, table, out, page_size, plan, raw_indices)

    for module in (sg.dsv4_ops, sg.indexer):
        patcher.setattr(module, "plan_topk_v2", plan_topk_v2)
    patcher.setattr(sg.indexer, "topk_transform_paged_v2", topk_transform_paged_v2)
    patcher.setattr(sg.dsv4_ops, "get_paged_mqa_logits_metadata", deep_gemm.get_paged_mqa_logits_metadata)
    patcher.setattr(sg.norm_rope, "_jit_main_q_indexer_rope_hadamard_quant_module",
                    lambda dtype: _QuantModule(False, calls))
    patcher.setattr(sg.norm_rope, "_jit_main_q_indexer_rope_hadamard_fp4_quant_module",
                    lambda dtype: _QuantModule(True, calls))
    import sglang.srt.layers.attention.mqa_logits_utils as logits_utils

    patcher.setattr(logits_utils, "get_schedule", lambda: SimpleNamespace(mem_fraction_static=MEM_FRACTION_STATIC))
    for name in ("fp8_paged_mqa_logits", "fp8_fp4_paged_mqa_logits", "fp8_mqa_logits"):
        spy(patcher, calls, deep_gemm, name, f"deep_gemm.{name}")


def open_sglang_cuda(paths: Sequence[Path], kit: Path) -> SGLang:
    """:func:`environment.open_sglang` on a CUDA device, with the real kernels of ``kit``.

    The import doubles shadow the packages SGLang imports for its server only, even where the
    machine has them (their installed versions are not the ones SGLang 0.5.23 pins), and stand
    for any other package missing here; ``sg.stubbed`` lists what they stood for.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("open_sglang_cuda needs a CUDA device")
    sg = open_sglang(paths, kernels=lambda sg: install_cuda_kernels(sg, sg.patcher, sg.calls, kit),
                     shadow_installed=True, stub_missing=True)
    return sg
