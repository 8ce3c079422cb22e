"""Host-side launch helpers shared by the Triton backends: argument packing, tile configs, the
bulk-copy descriptor of the FP8 key cache, and the guard every function that launches kernels
goes through."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
from triton.runtime.interpreter import InterpretedFunction

from ..contract import HEAD_DIM, PAGE_SIZE, IndexerInputs, Layout
from ..envs import envs
from ..errors import BackendUnavailable
from ..replay import INTERPRETER_LOCK
from .common import gdc_wait, layout_id, ordered_key
from .geometry import GEOMETRY

try:  # host-side tensor descriptors (bulk tensor copies on Hopper and later)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older Triton: every layout gathers keys with pointer loads
    TensorDescriptor = None

def kernels_interpreted() -> bool:
    """Whether this process's kernels run on the Triton interpreter: Triton decides when a
    kernel module is imported (``TRITON_INTERPRET=1`` then), not at launch."""
    return isinstance(ordered_key, InterpretedFunction)


def check_runnable(device) -> None:
    """:class:`~indexer_topk.errors.BackendUnavailable` saying how to run, for tensors on the CPU
    with kernels compiled for a GPU (Triton would fail deep inside its launcher). The API checks
    the environment before the kernels are imported (:func:`indexer_topk.backends.require_runnable`);
    this checks how they were in fact imported."""
    if torch.device(device).type == "cpu" and not kernels_interpreted():
        raise BackendUnavailable(
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
        with INTERPRETER_LOCK:
            return fn(*args, **kwargs)

    return run


@dataclass(frozen=True)
class TileConfig:
    """Score-tile shape. Legacy and fused kernels must use the same ``rows`` and ``num_warps``
    so that they issue the same MMA and reduction sequence and produce bitwise-equal scores.

    ``rows`` query rows share each key page (one MMA with N = rows * 64); ``*_stages`` are the
    software-pipelining depths of the legacy and the fused scoring loops (1 turns it off).
    """

    rows: int = 2
    num_warps: int = 4
    logits_stages: int = 3
    fused_stages: int = 3
    # Register cap of the fused kernel (None: the compiler's choice). Four warps at up to 255
    # registers still fit two programs on an SM.
    fused_maxnreg: Optional[int] = None


# One config per layout; the score tile's numerics depend only on (rows, num_warps).
TILE_CONFIGS = {
    Layout.SGLANG_FP8: TileConfig(),
    Layout.SGLANG_MXFP4: TileConfig(),
    Layout.AITER_MXFP4: TileConfig(),
}

SELECT_CHUNK = 1024
SELECT_WARPS = 8


def launch_options(maxnreg: Optional[int], interpret: bool) -> dict:
    """Compile options beyond warps and stages: a register cap per thread where one is set
    (none under the interpreter)."""
    return {} if interpret or not maxnreg else {"maxnreg": maxnreg}


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
    kdesc: Optional[object] = None  # TensorDescriptor of the FP8 key pages, or None (pointer loads)

    @property
    def pages(self) -> int:
        return self.kc.shape[0]

    @property
    def tma(self) -> bool:
        return self.kdesc is not None


def pack_args(inputs: IndexerInputs, launch: bool = True) -> KernelArgs:
    """The kernels' view of ``inputs``; ``launch=False`` for views that only feed a compilation
    (benchmark/research/compile_report.py), where no kernel will run on these tensors."""
    if launch:
        check_runnable(inputs.device)
    layout = inputs.layout
    qb = inputs.q.view(torch.uint8)
    qs = inputs.q_scale.view(torch.uint8) if inputs.q_scale is not None else qb
    k_cache = inputs.k_cache
    kf = k_cache.view(torch.float32) if layout is Layout.SGLANG_FP8 else k_cache
    ks = inputs.k_scale if inputs.k_scale is not None else k_cache
    interpret = kernels_interpreted()
    kdesc = None if interpret else key_descriptor(k_cache, layout)
    return KernelArgs(
        qb, qs, inputs.weights, k_cache, kf, ks, inputs.page_table, inputs.seq_lens, layout_id(layout), interpret,
        kdesc,
    )


def bulk_copies_available(device) -> bool:
    """Whether kernels on ``device`` can take a key page with one bulk tensor copy: an NVIDIA
    GPU of compute capability 9.0 or later and a Triton with host tensor descriptors."""
    device = torch.device(device)
    if TensorDescriptor is None or device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def key_descriptor(k_cache: torch.Tensor, layout: Layout):
    """The FP8 key pages as a ``[pages, 64, 128]`` e4m3 tensor descriptor with one page per copy,
    or None where bulk copies are unavailable (other layouts, other devices, an unaligned cache).
    Pages outside the cache read as zeros through a descriptor."""
    if Layout(layout) is not Layout.SGLANG_FP8 or k_cache.shape[0] == 0 or not bulk_copies_available(k_cache.device):
        return None
    if k_cache.data_ptr() % 16:
        return None
    pages = k_cache.shape[0]
    page_bytes = GEOMETRY[Layout.SGLANG_FP8].page_bytes
    view = k_cache.as_strided((pages, PAGE_SIZE, HEAD_DIM), (page_bytes, HEAD_DIM, 1)).view(torch.float8_e4m3fn)
    return TensorDescriptor(view, [pages, PAGE_SIZE, HEAD_DIM], [page_bytes, HEAD_DIM, 1], [1, PAGE_SIZE, HEAD_DIM])


def pdl_launch(device) -> bool:
    """Whether a kernel that follows another of this call's kernels on ``device`` is launched
    with programmatic dependent launch (PDL): it may then start while that kernel finishes (its
    launch and set-up hidden under the other's tail), and waits for it before any memory access
    (:func:`.common.wait_for_producer`). On where :func:`pdl_capable` says the device and Triton
    have it, unless ``INDEXER_TOPK_PDL`` is off. The first kernel of a call never takes it: it
    follows the caller's work, whose kernels this package does not know."""
    return pdl_capable(device) and envs.INDEXER_TOPK_PDL.get()


def pdl_capable(device) -> bool:
    """An NVIDIA GPU of compute capability 9.0 or later, compiled kernels (not the interpreter)
    and a Triton with grid dependency control and the ``launch_pdl`` launch option."""
    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip is not None or kernels_interpreted():
        return False
    return _pdl_capable(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _pdl_capable(index: int) -> bool:
    if gdc_wait is None or torch.cuda.get_device_capability(index)[0] < 9:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


def pdl_options(pdl: bool) -> dict:
    """The launch option of a kernel launched with PDL (none otherwise: a Triton without the
    option, or another backend, never sees it)."""
    return {"launch_pdl": True} if pdl else {}


def device_sm_count(device) -> int:
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return _sm_count(torch.cuda.current_device() if device.index is None else device.index)
    return 4  # interpreter / CPU: a handful of programs exercise the same code paths


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    # read once per device: the properties query is host work on every call otherwise
    return torch.cuda.get_device_properties(index).multi_processor_count
