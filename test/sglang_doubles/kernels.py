"""Doubles of the GPU-only kernels on SGLang's DSv4 indexer path, built from our reference.

Each double stands for one CUDA/HIP extension (or the SGLang adapter that only wraps one)
and computes what the kernel computes on the data the test writes:

* ``aiter.rope_rotate_activation`` (HIP query quantiser) and SGLang's JIT query kernels
  behind ``fused_q_indexer_rope_hadamard{,_fp4}_quant``: quantise the query to the layout
  the kernel writes, folding ``weight_scale`` (and FP8's query scale) into the weights as the
  CUDA kernels do. RoPE and the Hadamard rotation are left out: both routes consume the same
  quantised query, and the test compares the routes, not the rotation.
* ``aiter_fp4_paged_mqa_logits`` (SGLang's adapter over AITER's FlyDSL logits kernels) and
  DeepGEMM's ``fp8_paged_mqa_logits`` / ``fp8_fp4_paged_mqa_logits``: the FP32
  ``[rows, width]`` logits, from :func:`indexer_topk.reference.reference_scores`. The HIP
  double takes its buffer from SGLang's real pooled allocator ``_alloc_logits``.
* DeepGEMM's and SGLang's JIT schedule-metadata builders: opaque placeholders.
* ``torch.cuda.is_current_stream_capturing`` on a torch built without CUDA (where it raises):
  False, unless a test sets ``capturing[0]`` to simulate a capture.

Every call is counted in :class:`Calls`, so a test can assert which ran.
"""

from __future__ import annotations

import sys
import types
from collections import Counter
from typing import Any, Callable, List, Tuple

import torch

from indexer_topk.formats import pack_ue8m0_int32, quantize_fp8, quantize_mxfp4, quantize_query
from indexer_topk.reference import reference_scores


class Calls(Counter):
    """How many times each double (and each spied SGLang function) ran."""

    LOGITS = ("aiter_fp4_paged_mqa_logits", "deep_gemm.fp8_paged_mqa_logits", "deep_gemm.fp8_fp4_paged_mqa_logits",
              "deep_gemm.fp8_mqa_logits", "indexer.fp8_paged_mqa_logits_torch")

    def logits_calls(self) -> int:
        """Calls of any logits kernel (each one writes an FP32 ``[rows, width]`` matrix)."""
        return sum(self[k] for k in self.LOGITS)


class Patcher:
    """setattr / sys.modules entries with undo, usable outside pytest (subprocesses)."""

    _MISSING = object()

    def __init__(self):
        self._undo: List[Tuple[Any, str, Any]] = []

    def setattr(self, obj, name: str, value) -> None:
        self._undo.append((obj, name, getattr(obj, name, self._MISSING)))
        setattr(obj, name, value)

    def setmodule(self, name: str, module) -> None:
        self._undo.append((sys.modules, name, sys.modules.get(name, self._MISSING)))
        sys.modules[name] = module

    def undo(self) -> None:
        while self._undo:
            obj, name, old = self._undo.pop()
            if obj is sys.modules:
                if old is self._MISSING:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = old
            elif old is self._MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


def _scores(layout, q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, weight_scale, width):
    s = reference_scores(
        q, q_scale, k_cache, k_scale, weights, page_table.to(torch.int32), seq_lens.reshape(-1).to(torch.int32),
        layout=layout, weight_scale=weight_scale, start=0, stop=width,
    )
    return s


def _aiter_module(calls: Calls) -> types.ModuleType:
    aiter = types.ModuleType("aiter")
    aiter.__path__ = []
    aiter.dtypes = types.SimpleNamespace(fp4x2=torch.float4_e2m1fn_x2)

    def rope_rotate_activation(q_out, q, cos, sin, positions, *, rope_dim, out_scale, group_size,
                               shuffle_scale, do_rotate_act):
        calls["aiter.rope_rotate_activation"] += 1
        rows = q.shape[0]
        pack = quantize_query(q.float(), torch.zeros(rows, q.shape[1]), "aiter_mxfp4")
        q_out.view(torch.uint8).copy_(pack.q)
        out_scale.copy_(pack.q_scale)

    aiter.rope_rotate_activation = rope_rotate_activation
    return aiter


def _deep_gemm_module(calls: Calls) -> types.ModuleType:
    dg = types.ModuleType("deep_gemm")

    def fp8_paged_mqa_logits(q, kv, weights, seq_lens, page_table, schedule, max_seq_len, clean_logits):
        calls["deep_gemm.fp8_paged_mqa_logits"] += 1
        calls["logits_rows"] += q.shape[0]
        cache = kv.view(kv.shape[0], -1).view(torch.uint8)
        return _scores("sglang_fp8", q[:, 0], None, cache, None, weights, page_table, seq_lens, 1.0, max_seq_len)

    def fp8_fp4_paged_mqa_logits(q, kv, weights, seq_lens, page_table, schedule, max_seq_len, clean_logits):
        calls["deep_gemm.fp8_fp4_paged_mqa_logits"] += 1
        calls["logits_rows"] += q[0].shape[0]
        q_fp4, q_sf = q
        cache = kv.view(kv.shape[0], -1).view(torch.uint8)
        return _scores("sglang_mxfp4", q_fp4[:, 0].view(torch.uint8), q_sf[:, 0], cache, None, weights,
                       page_table, seq_lens, 1.0, max_seq_len)

    def fp8_mqa_logits(q, kv, weights, ks, ke, clean_logits=False, max_seqlen_k=None):
        # Non-paged: rows score a gathered key list over [ks, ke).
        calls["deep_gemm.fp8_mqa_logits"] += 1
        calls["logits_rows"] += q.shape[0]
        k, k_scale = kv
        dots = torch.einsum("rhd,nd->rnh", q.double(), k.double())
        s = (torch.relu(dots) * weights.double()[:, None, :]).sum(-1) * k_scale.double()[None, :]
        out = torch.full((q.shape[0], max_seqlen_k), float("-inf"), dtype=torch.float32)
        cols = torch.arange(k.shape[0])
        valid = (cols[None, :] >= ks[:, None]) & (cols[None, :] < ke[:, None])
        out[:, : k.shape[0]] = torch.where(valid, s, torch.full_like(s, float("-inf"))).float()
        return out

    def get_paged_mqa_logits_metadata(seq_lens, page_size, num_sms):
        calls["schedule_metadata"] += 1
        return torch.zeros((num_sms + 1, 2), dtype=torch.int32)

    dg.fp8_paged_mqa_logits = fp8_paged_mqa_logits
    dg.fp8_fp4_paged_mqa_logits = fp8_fp4_paged_mqa_logits
    dg.fp8_mqa_logits = fp8_mqa_logits
    dg.get_paged_mqa_logits_metadata = get_paged_mqa_logits_metadata
    dg.get_num_sms = lambda: 8
    return dg


class _QuantModule:
    """Stands for the compiled module SGLang's ``_jit_main_q_indexer_rope_hadamard*`` return."""

    def __init__(self, fp4: bool, calls: Calls):
        self.fp4, self.calls = fp4, calls

    def forward(self, q_input, *outs):
        q = q_input.float()
        if self.fp4:
            q_fp4, q_sf, weight, weights_out, weight_scale = outs[:5]
            self.calls["jit.q_indexer_fp4_quant"] += 1
            packed, exps = quantize_mxfp4(q)
            q_fp4.view(torch.uint8).copy_(packed)
            q_sf.copy_(pack_ue8m0_int32(exps))
            weights_out[..., 0] = weight.float() * weight_scale
        else:
            q_fp8, weight, weights_out, weight_scale = outs[:4]
            self.calls["jit.q_indexer_fp8_quant"] += 1
            q8, scale = quantize_fp8(q)
            q_fp8.copy_(q8)
            weights_out[..., 0] = weight.float() * weight_scale * scale


def install_kernel_doubles(sg, patcher: Patcher, calls: Calls) -> None:
    """Replace the GPU-only kernels reachable from ``forward_c4_indexer``; ``sg`` holds SGLang's modules."""
    sg.capturing = [False]
    if not torch.cuda.is_available():
        patcher.setattr(torch.cuda, "is_current_stream_capturing", lambda: sg.capturing[0])
    patcher.setmodule("aiter", _aiter_module(calls))
    patcher.setmodule("deep_gemm", _deep_gemm_module(calls))
    patcher.setattr(sg.norm_rope, "_jit_main_q_indexer_rope_hadamard_quant_module",
                    lambda dtype: _QuantModule(False, calls))
    patcher.setattr(sg.norm_rope, "_jit_main_q_indexer_rope_hadamard_fp4_quant_module",
                    lambda dtype: _QuantModule(True, calls))
    patcher.setattr(sg.dsv4_ops, "get_paged_mqa_logits_metadata",
                    sys.modules["deep_gemm"].get_paged_mqa_logits_metadata)

    real_alloc = sg.fp4_hip._alloc_logits

    def alloc_logits(num_tokens, max_seq_len, device, is_decode):
        calls["fp4_hip._alloc_logits"] += 1
        return real_alloc(num_tokens, max_seq_len, device, is_decode)

    patcher.setattr(sg.fp4_hip, "_alloc_logits", alloc_logits)

    def aiter_fp4_paged_mqa_logits(*, q_fp4, q_scale, k_payload, k_scale, weights, page_table, c4_seq_lens,
                                   weight_scale, is_decode, decode_workspace=None, prefill_workspace=None,
                                   **_):
        calls["aiter_fp4_paged_mqa_logits"] += 1
        calls["logits_rows"] += q_fp4.shape[0]
        # The FlyDSL kernels score a page table padded to a multiple of four 64-slot pages.
        width = sg.fp4_hip._guarded_pages(page_table.shape[1]) * 64
        logits = sg.fp4_hip._alloc_logits(q_fp4.shape[0], width, q_fp4.device, is_decode)
        logits.copy_(_scores("aiter_mxfp4", q_fp4.view(torch.uint8), q_scale.view(torch.uint8),
                             k_payload.view(torch.uint8), k_scale.view(torch.uint8), weights, page_table,
                             c4_seq_lens, weight_scale, width))
        return logits

    spy(patcher, calls, sg.indexer, "fp8_paged_mqa_logits_torch", "indexer.fp8_paged_mqa_logits_torch")

    # The indexer module imported the adapter by name; replace both bindings.
    patcher.setattr(sg.fp4_hip, "aiter_fp4_paged_mqa_logits", aiter_fp4_paged_mqa_logits)
    patcher.setattr(sg.indexer, "aiter_fp4_paged_mqa_logits", aiter_fp4_paged_mqa_logits)


def spy(patcher: Patcher, calls: Calls, obj, name: str, key: str) -> None:
    """Count calls of ``obj.name`` (a real SGLang function) under ``key``, then run it."""
    real: Callable = getattr(obj, name)

    def counted(*args, **kwargs):
        calls[key] += 1
        return real(*args, **kwargs)

    patcher.setattr(obj, name, counted)
