"""Host-side launch helpers shared by the Triton backends: argument packing, tile configs, and
the guard every function that launches kernels goes through."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import torch
from triton.runtime.interpreter import InterpretedFunction

from ..contract import IndexerInputs, Layout
from .common import layout_id, ordered_key

# The interpreter patches triton.language's module state for the length of a launch, so two
# interpreted launches at once (threads) break each other; this serialises them process-wide.
_INTERPRETER_LOCK = threading.RLock()


def kernels_interpreted() -> bool:
    """Whether this process's kernels run on the Triton interpreter: Triton decides when a
    kernel module is imported (``TRITON_INTERPRET=1`` then), not at launch."""
    return isinstance(ordered_key, InterpretedFunction)


def check_runnable(device) -> None:
    """``RuntimeError`` saying how to run, for tensors on the CPU with kernels compiled for a
    GPU (Triton would fail deep inside its launcher)."""
    if torch.device(device).type == "cpu" and not kernels_interpreted():
        raise RuntimeError(
            "the Triton backends need a GPU or the Triton interpreter: these tensors are on the CPU and "
            "this process's kernels were built for a GPU. Set TRITON_INTERPRET=1 in the environment before "
            "indexer_topk's kernels are first imported (e.g. before starting Python), or pass tensors on a GPU"
        )


def launches_kernels(fn):
    """Decorator for the host functions that launch this package's kernels: under the
    interpreter, one such call runs at a time in the process (re-entrant: they call each
    other); compiled kernels are launched without a lock."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not kernels_interpreted():
            return fn(*args, **kwargs)
        with _INTERPRETER_LOCK:
            return fn(*args, **kwargs)

    return run


@dataclass(frozen=True)
class TileConfig:
    """Score-tile shape. Legacy and fused kernels must use the same ``block_n`` and ``num_warps``
    so that they issue the same MMA and reduction sequence and produce bitwise-equal scores."""

    block_n: int = 128
    num_warps: int = 4
    logits_stages: int = 3
    # Software-pipelining depth of the fused kernel's scoring loop; 1 turns pipelining off.
    fused_stages: int = 2


# One config per layout; the score tile's numerics depend only on (block_n, num_warps).
# MXFP4 runs the fused loop unpipelined: on the H200 its pipelined loop spills inside the MMA
# span and took 17.0 ms at the reference shape (benchmark/results/history/profile_63d894f.log),
# unpipelined 14.7 ms (benchmark/results/profile_nvidia-h200.log).
TILE_CONFIGS = {
    Layout.SGLANG_FP8: TileConfig(),
    Layout.SGLANG_MXFP4: TileConfig(fused_stages=1),
    Layout.AITER_MXFP4: TileConfig(fused_stages=1),
}

SELECT_CHUNK = 1024
SELECT_WARPS = 8


def tile_config(layout: Layout) -> TileConfig:
    return TILE_CONFIGS[Layout(layout)]


@dataclass
class KernelArgs:
    """Tensors in the form the kernels read them (byte views; dummies where a layout has none)."""

    q: torch.Tensor
    qs: torch.Tensor
    w: torch.Tensor
    kc: torch.Tensor
    kf: torch.Tensor
    ks: torch.Tensor
    page_table: torch.Tensor
    seq_lens: torch.Tensor
    layout: int
    interpret: bool


def pack_args(inputs: IndexerInputs, layout=None) -> KernelArgs:
    """The kernels' view of ``inputs`` (or of the seven tensors and ``layout``, the form
    benchmark/compile_report.py passes)."""
    if not isinstance(inputs, IndexerInputs):
        inputs = IndexerInputs.of(inputs, topk=0, layout=layout)  # no kernel argument depends on topk
    check_runnable(inputs.device)
    layout = inputs.layout
    qb = inputs.q.view(torch.uint8)
    qs = inputs.q_scale.view(torch.uint8) if inputs.q_scale is not None else qb
    k_cache = inputs.k_cache
    kf = k_cache.view(torch.float32) if layout is Layout.SGLANG_FP8 else k_cache
    ks = inputs.k_scale if inputs.k_scale is not None else k_cache
    return KernelArgs(
        qb, qs, inputs.weights, k_cache, kf, ks, inputs.page_table, inputs.seq_lens, layout_id(layout),
        kernels_interpreted(),
    )


def device_sm_count(device) -> int:
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return _sm_count(torch.cuda.current_device() if device.index is None else device.index)
    return 4  # interpreter / CPU: a handful of programs exercise the same code paths


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    # read once per device: the properties query is host work on every call otherwise
    return torch.cuda.get_device_properties(index).multi_processor_count
