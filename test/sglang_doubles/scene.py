"""One DSv4 C4 indexer call as SGLang makes it, on SGLang's real classes.

:func:`build_scene` writes a paged index-K cache for a few requests, builds SGLang's own
``PagedIndexerMetadata`` for their query rows (one row per token, each with its causal C4
length and its request's page-table row, pages scattered), and instantiates:

* a backend whose class is SGLang's ``C4IndexerBackendMixin`` + ``CompressorBackendMixin``
  (constructed through their real ``__init__``, where the plugin freezes its policy) with
  SGLang's torch top-k transform selected;
* a ``C4Indexer`` (SGLang's class, its weights replaced by fixed projections) whose real
  ``compute_q`` / ``compute_weights`` run and call the quantisation-kernel doubles;
* the per-forward metadata, output buffers and forward batch the backend reads.

Only the index-K pool, the compressor write (the cache is pre-filled) and the forward batch
are plain doubles.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional, Sequence, Tuple

import torch

from indexer_topk.formats import allocate_k_cache, write_k_cache

from .kernels import Patcher

DSV4_WEIGHT_SCALE = 128**-0.5 * 64**-0.5


@dataclass(frozen=True)
class SceneSpec:
    """What to build.

    layout : "aiter_mxfp4" (HIP FP4 branch), "sglang_mxfp4" / "sglang_fp8" (CUDA paged branch)
    contexts : tokens each request has seen after this step
    extend : new tokens of each request in this step (decode: 1 each)
    mode : SGLang ForwardMode name, "EXTEND", "DECODE", "TARGET_VERIFY", ...
    keys : "random" (exact-logits doubles) or "gapped" (a score gap at the top-k boundary,
           for SGLang's own bf16 torch logits)
    spare_rows : extra rows in SGLang's output buffers beyond the query rows
    raw_indices : SGLang asks for raw indices too (``c4_sparse_raw_indices``)
    chunk_rows : force SGLang's legacy path to score this many rows per chunk
    device : where the tensors live ("cuda" runs SGLang's real CUDA kernels, see ``cuda.py``)
    topk_backend : SGLang's ``DSATopKBackend`` value: "torch" (its torch transform) or
                   "sgl-kernel" (``topk_v2``, with the plan SGLang builds per forward batch)
    """

    layout: str
    topk: int = 512
    contexts: Tuple[int, ...] = (2900, 2404, 300)
    extend: Tuple[int, ...] = (11, 7, 4)
    mode: str = "EXTEND"
    keys: str = "random"
    seed: int = 0
    spare_rows: int = 3
    raw_indices: bool = False
    chunk_rows: Optional[int] = None
    use_prefill_cuda_graph: bool = False
    sglang_torch_logits: bool = False
    device: str = "cpu"
    topk_backend: str = "torch"


class _Projection:
    """Fixed rows standing in for a ReplicatedLinear: ``(out[:len(x)], None)``, as SGLang's returns."""

    def __init__(self, out: torch.Tensor):
        self.out = out

    def __call__(self, x):
        return self.out[: x.shape[0]], None


class _Pool:
    """The index-K side of ``DeepSeekV4TokenToKVPool`` for one C4 layer."""

    def __init__(self, layout: str, k_cache: torch.Tensor, k_scale: Optional[torch.Tensor]):
        if layout == "aiter_mxfp4":
            self.payload = k_cache.view(torch.float4_e2m1fn_x2)  # as SGLang's HIP pool stores it
            self.scale = k_scale
            self.with_scale = None
        else:
            self.payload = self.scale = None
            self.with_scale = k_cache
        self.layer_mapping = {0: SimpleNamespace(compress_layer_id=0)}

    def get_index_k_fp4_payload_buffer(self, layer_id):
        return self.payload

    def get_index_k_fp4_scale_buffer(self, layer_id):
        return self.scale

    def get_index_k_with_scale_buffer(self, layer_id):
        return self.with_scale

    def get_index_k_scale_buffer(self, layer_id, seq_len_tensor, page_indices, seq_len_sum, max_seq_len):
        """FP8 keys and scale bytes of one request's first ``seq_len_sum`` positions (non-paged path)."""
        dev = self.with_scale.device
        pos = torch.arange(seq_len_sum, device=dev)
        pages = page_indices[0].long()[pos // 64][:, None]
        off = (pos % 64)[:, None]
        keys = self.with_scale[pages, off * 128 + torch.arange(128, device=dev)]
        scales = self.with_scale[pages, 64 * 128 + off * 4 + torch.arange(4, device=dev)]
        return keys, scales


def _backend_class(sg):
    cls = getattr(sg, "_scene_backend_class", None)
    if cls is None:
        class SceneBackend(sg.indexer.C4IndexerBackendMixin, sg.compressor_v2.CompressorBackendMixin):
            def __init__(self, pool, calls, topk_backend="torch"):
                super().__init__()
                self.token_to_kv_pool = pool
                self.hisparse_coordinator = None
                self.dsa_topk_backend = sg.dsa_topk_backend.DSATopKBackend(topk_backend)
                self._calls = calls

            def forward_indexer_compressor(self, *, x, forward_batch, layer_id, compressor):
                self._calls["forward_indexer_compressor"] += 1  # the cache is written up front

        sg._scene_backend_class = cls = SceneBackend
    return cls


def _gapped_keys(n4: int, hot: int, visible: int, u: torch.Tensor, gen) -> torch.Tensor:
    """Keys where ``hot`` positions, drawn from the ``visible`` ones every long row sees, score
    far above the rest: each row longer than ``hot`` selects exactly them, however the scores
    are rounded."""
    keys = 0.05 * torch.randn((n4, 128), generator=gen)
    hot = min(hot, n4)
    chosen = torch.randperm(max(visible, hot), generator=gen)[:hot]
    strength = 2.0 + torch.rand((hot, 1), generator=gen)
    keys[chosen] += strength * u
    return keys


class Scene:
    """The objects of one call; :meth:`forward` runs it and returns SGLang's outputs."""

    def __init__(self, sg, spec: SceneSpec):
        self.sg, self.spec = sg, spec

    def forward(self, *, original: bool = False):
        """Run ``forward_c4_indexer`` (the hooked one, or SGLang's own with ``original``).

        Returns ``(page_indices, raw_indices)`` copies of SGLang's output buffers.
        """
        core = self.metadata.core_metadata
        core.c4_sparse_page_indices.fill_(-1)
        if core.c4_sparse_raw_indices is not None:
            core.c4_sparse_raw_indices.fill_(-1)
        self.call(original=original)
        return self.outputs()

    def call(self, *, original: bool = False) -> None:
        """One ``forward_c4_indexer`` call and nothing else (what a timer or a graph records)."""
        fn = type(self.backend).forward_c4_indexer
        if original:
            fn = getattr(fn, "__wrapped__", fn)
        with self.platform():
            fn(self.backend, x=self.x, q_lora=self.q_lora, c4_indexer=self.c4_indexer,
               forward_batch=self.forward_batch)

    def outputs(self):
        """Copies of SGLang's output buffers: ``(page_indices, raw_indices or None)``."""
        core = self.metadata.core_metadata
        raw = core.c4_sparse_raw_indices
        return core.c4_sparse_page_indices.clone(), None if raw is None else raw.clone()

    @contextlib.contextmanager
    def platform(self):
        """SGLang sees a HIP device for the AITER layout, and the requested logits/budget knobs."""
        p = Patcher()
        sg, spec = self.sg, self.spec
        if spec.layout == "aiter_mxfp4":
            for module in (sg.indexer, sg.metadata):
                p.setattr(module, "is_hip", lambda: True)
            # A fresh pool per scene, budget-sized; chunk_rows shrinks the budget to force chunks.
            width = sg.fp4_hip._guarded_pages(self.page_table_width) * 64
            rows = spec.chunk_rows or 4096
            p.setattr(sg.fp4_hip, "_LOGITS_BUDGET_ELEMS", rows * width)
            p.setattr(sg.fp4_hip, "_LOGITS_POOL", {})
        if spec.chunk_rows and spec.layout != "aiter_mxfp4":
            p.setattr(sg.metadata, "plan_indexer_row_chunks", lambda **_: spec.chunk_rows)
        stack = contextlib.ExitStack()
        if spec.sglang_torch_logits:
            stack.enter_context(sg.indexer.envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.override(True))
        try:
            with stack:
                yield
        finally:
            p.undo()


def build_scene(sg, spec: SceneSpec) -> Scene:
    """Build the call ``spec`` describes (see the module docstring)."""
    if len(spec.contexts) != len(spec.extend):
        raise ValueError("contexts and extend must have one entry per request")
    scene = Scene(sg, spec)
    gen = torch.Generator().manual_seed(spec.seed)
    layout, topk = spec.layout, spec.topk
    fp4 = layout != "sglang_fp8"

    n4 = [t // 4 for t in spec.contexts]
    pages = [max(1, math.ceil(n / 64)) for n in n4]
    total_pages = sum(pages) + 3
    perm = torch.randperm(total_pages, generator=gen).tolist()
    page_lists, cursor = [], 0
    for n in pages:
        page_lists.append(perm[cursor: cursor + n])
        cursor += n
    width = max(pages)
    scene.page_table_width = width

    k_cache, k_scale = allocate_k_cache(layout, total_pages)
    u = torch.nn.functional.normalize(torch.randn(128, generator=gen), dim=0)
    for i, n in enumerate(n4):
        if n == 0:
            continue
        if spec.keys == "gapped":
            first_row_len = (spec.contexts[i] - spec.extend[i] + 1) // 4
            keys = _gapped_keys(n, topk, min(first_row_len, n), u, gen)
        else:
            keys = torch.randn((n, 128), generator=gen)
        pos = torch.arange(n)
        slots = torch.tensor(page_lists[i])[pos // 64] * 64 + pos % 64
        write_k_cache(layout, keys, slots, k_cache, k_scale)

    rows_pt, rows_len, rows_pos = [], [], []
    for i, (t, e) in enumerate(zip(spec.contexts, spec.extend)):
        padded = page_lists[i] + [0] * (width - len(page_lists[i]))
        for p in range(t - e, t):
            rows_pt.append(padded)
            rows_len.append((p + 1) // 4)
            rows_pos.append(p)
    rows = len(rows_len)
    page_table = torch.tensor(rows_pt, dtype=torch.int32)
    c4_lens = torch.tensor(rows_len, dtype=torch.int32)
    positions = torch.tensor(rows_pos, dtype=torch.int64)

    if spec.keys == "gapped":
        q = u.expand(rows, 64, 128) + 0.05 * torch.randn((rows, 64, 128), generator=gen)
        w = 0.5 + torch.rand((rows, 64), generator=gen)
    else:
        q = torch.randn((rows, 64, 128), generator=gen)
        w = torch.randn((rows, 64), generator=gen)
    q_proj = q.reshape(rows, 64 * 128).to(torch.bfloat16)
    w_proj = w.to(torch.bfloat16)

    dev = torch.device(spec.device)
    k_cache = k_cache.to(dev)
    k_scale = None if k_scale is None else k_scale.to(dev)
    page_table, c4_lens, positions = page_table.to(dev), c4_lens.to(dev), positions.to(dev)
    q_proj, w_proj = q_proj.to(dev), w_proj.to(dev)

    scene.calls = sg.calls
    with scene.platform():
        backend_cls = _backend_class(sg)
        scene.backend = backend = backend_cls(_Pool(layout, k_cache, k_scale), sg.calls, spec.topk_backend)
        indexer_metadata = sg.metadata.PagedIndexerMetadata(
            page_size=256, compressed_page_size=64, page_table=page_table, compressed_seq_lens=c4_lens,
            use_topk_v2=spec.topk_backend == "sgl-kernel", use_prefill_cuda_graph=spec.use_prefill_cuda_graph,
            compress_ratio=4,
        )
    capacity = rows + spec.spare_rows
    core = SimpleNamespace(
        positions=positions,
        c4_sparse_page_indices=torch.full((capacity, topk), -1, dtype=torch.int32, device=dev),
        c4_sparse_raw_indices=(torch.full((capacity, topk), -1, dtype=torch.int32, device=dev)
                               if spec.raw_indices else None),
    )
    scene.metadata = backend.forward_metadata = SimpleNamespace(
        indexer_metadata=indexer_metadata, core_metadata=core, fp4_q_positions=None,
        fp4_decode_workspace=None, fp4_prefill_workspace=None,
    )

    c4 = sg.indexer.C4Indexer.__new__(sg.indexer.C4Indexer)
    torch.nn.Module.__init__(c4)
    c4.layer_id, c4.n_heads, c4.n_local_heads, c4.head_dim = 0, 64, 64, 128
    c4.rope_head_dim, c4.index_topk, c4.use_fp4_indexer = 64, topk, fp4
    c4.softmax_scale = 128**-0.5
    c4.weight_scale = DSV4_WEIGHT_SCALE
    c4.wq_b, c4.weights_proj = _Projection(q_proj), _Projection(w_proj)
    c4.compressor = SimpleNamespace(fp4_cos=torch.zeros(1, device=dev), fp4_sin=torch.zeros(1, device=dev))
    c4.freqs_cis = torch.ones(8, 32, dtype=torch.complex64, device=dev)
    c4.rotary_emb, c4.alt_streams = None, None
    scene.c4_indexer = c4

    mode = getattr(sg.forward_batch_info.ForwardMode, spec.mode)
    scene.forward_batch = SimpleNamespace(
        forward_mode=mode, _original_forward_mode=None, tbo_parent_token_range=None,
        batch_size=len(spec.contexts), seq_lens=torch.tensor(spec.contexts, device=dev),
        seq_lens_cpu=torch.tensor(spec.contexts), extend_seq_lens=torch.tensor(spec.extend, device=dev),
        extend_seq_lens_cpu=list(spec.extend), extend_start_loc=None, extend_num_tokens=rows,
        req_pool_indices=torch.arange(len(spec.contexts), device=dev),
    )
    scene.x = torch.zeros((rows, 32), dtype=torch.bfloat16, device=dev)
    scene.q_lora = torch.zeros((rows, 16), dtype=torch.bfloat16, device=dev)
    scene.rows, scene.c4_lens = rows, c4_lens
    return scene


def same_selection(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal as per-row sets (SGLang's top-k leaves the order unspecified; -1 pads either way)."""
    return torch.equal(a.sort(dim=1).values, b.sort(dim=1).values)


def rows_differing(a: torch.Tensor, b: torch.Tensor) -> Sequence[int]:
    diff = (a.sort(dim=1).values != b.sort(dim=1).values).any(dim=1)
    return diff.nonzero().flatten().tolist()
