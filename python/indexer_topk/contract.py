"""The operator contract: constants, layouts, the result type and input validation.

Every backend computes, for each query row ``r`` and each C4 position ``j < seq_lens[r]``::

    score[r, j] = weight_scale * sum_h weights[r, h] * relu(q[r, h, :] . k[j, :])
    score[r, j] *= k_scale[j]                      # sglang_fp8 only

and returns the ``topk`` best positions under one total order (:func:`order_keys`): higher
score first, equal scores broken by the lower position, NaN below every number, +0 above -0.
With ``order="position"`` (:func:`check_order`) each row's selection is laid out in ascending
positions instead: the same entries, the same bits, in another place.

The fp32 range. The kernels form, in fp32 and before ``weight_scale``, each head's dot
``q . k``, the head sum ``S = sum_h weights * relu(q . k)`` and, for sglang_fp8, ``S * k_scale``;
the reference computes in fp64. The contract covers inputs whose bound on those intermediates,
``max(D, sum_h |weights[r, h]| * D * max(1, K))``, is at most ``2**127`` (about
1.7e38, half of fp32's largest number, leaving room for the rounding of fp32 sums) for every
row with positions to score, where ``D`` is the largest ``|q . k|`` the stored values allow
(sglang_fp8: ``128 * 448**2``, e4m3's largest magnitude squared; MXFP4: ``128 * 6**2 *
2**(eq - 127) * 2**(ek - 127)`` with ``eq`` the row's largest query block exponent and ``ek``
the largest key block exponent of the pages the call uses) and ``K`` the largest ``|k_scale|``
of those pages (sglang_fp8; 1 otherwise). Non-finite weights, scales and exponents (255) are
left out of the bound: they give the same non-finite scores everywhere. Beyond the bound a
kernel may give ``inf`` where the exact score is finite, so the value checks
(:func:`check_score_range`, ``check_values=True``) and the reference refuse such inputs with
``ValueError``; ``weight_scale`` is applied last and does not enter the bound. For DeepSeek-V4
(weights of order 1, FP8 key scales of 1e-2 .. 1e2, block exponents near 127) the bound is
below 1e12, far inside the range.

NaN scores rank below every number here. SGLang's torch top-k (``torch.topk``) ranks NaN above
every number, so a row holding NaN scores (e.g. from a NaN FP8 key scale) may select other
positions here than there.
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence, Tuple

import torch

from .errors import value_words

HEADS = 64
HEAD_DIM = 128
PAGE_SIZE = 64  # C4 positions per page
MX_GROUP = 32  # MXFP4: one ue8m0 exponent per 32 values
SUPPORTED_TOPK = (512, 1024, 2048)
# How a row's selected positions are laid out in the outputs (:func:`check_order`).
ORDER_SCORE = "score"
ORDER_POSITION = "position"
ORDERS = (ORDER_SCORE, ORDER_POSITION)

# The payload bytes of one key slot, per layout's page row (scales follow the payload).
SGLANG_MXFP4_SLOT_BYTES = 64 + 4
SGLANG_FP8_SLOT_BYTES = 128 + 4

CANONICAL_NAN_BITS = 0x7FC00000
NEG_INF_BITS = -8388608  # 0xFF800000, the fp32 bits of -inf
WORKSPACE_ALIGN = 16  # the kernels view scratch as int32 / fp32 arrays

# The int32 order keys of :func:`ordered_score_bits`, shared with the kernels
# (``kernels/common.py``): every NaN has one key, just below -inf's; the lowest int32 is no
# score's key and marks "no entry" (a key matrix's padding past a row's length).
KEY_NONE = -(2**31)
KEY_NAN = -(2**31) + 1

FP32_MAX = torch.finfo(torch.float32).max
FP32_TINY = torch.finfo(torch.float32).tiny  # the smallest normal fp32

# The contract's fp32 range (module docstring): the bound on a row's fp32 intermediates, at most
# half of fp32's largest number. E4M3_MAX / E2M1_MAX: the largest magnitudes of an element.
SCORE_RANGE = 2.0**127
E4M3_MAX = 448.0
E2M1_MAX = 6.0
UE8M0_NONFINITE = 255  # the exponent byte that dequantises to inf


class Layout(str, enum.Enum):
    """How the quantised query and the paged C4 index-K cache are stored.

    ``aiter_mxfp4``
        AITER FlyDSL layout (ROCm). ``q`` uint8 ``[rows, 64, 64]`` (two e2m1 per byte, even
        element in the low nibble), ``q_scale`` uint8 ``[rows, 1, 4, 16, 4]`` (head ``h``,
        32-wide chunk ``c`` at ``[r, 0, c, h % 16, h // 16]``), ``k_cache`` uint8
        ``[pages, 1, 4, 64, 16]`` (chunk, slot, 16 bytes), ``k_scale`` uint8 ``[pages, 1, 4, 64]``
        (slot ``s`` of chunk ``c`` at ``(s % 16) * 4 + s // 16``), ``weights`` bf16.
    ``sglang_mxfp4``
        SGLang's CUDA FP4 layout. ``q`` uint8 ``[rows, 64, 64]``, ``q_scale`` int32 ``[rows, 64]``
        (four ue8m0 bytes, chunk 0 in the low byte), ``k_cache`` uint8 ``[pages, 64 * 68]``:
        64 slots x 64 payload bytes, then 64 slots x 4 scale bytes; ``k_scale`` None;
        ``weights`` fp32.
    ``sglang_fp8``
        SGLang's FP8 layout. ``q`` float8_e4m3fn ``[rows, 64, 128]`` with its scale folded into
        ``weights`` (``q_scale`` None); ``k_cache`` uint8 ``[pages, 64 * 132]``: 64 slots x 128
        e4m3 bytes, then 64 fp32 scales; ``k_scale`` None; ``weights`` fp32.

    In every layout the values must keep the kernels' fp32 intermediates in range: for each row
    with positions to score, ``max(D, sum_h |weights[r, h]| * D * max(1, K)) <= 2**127``, ``D``
    the largest ``|q . k|`` the layout's stored values allow (sglang_fp8: ``128 * 448**2``; MXFP4:
    ``128 * 36 * 2**(eq - 127) * 2**(ek - 127)`` from the largest query and key block exponents)
    and ``K`` the largest sglang_fp8 key scale of the pages the call uses (see the module
    docstring; :func:`check_score_range` checks it where values are checked).
    """

    AITER_MXFP4 = "aiter_mxfp4"
    SGLANG_MXFP4 = "sglang_mxfp4"
    SGLANG_FP8 = "sglang_fp8"

    @property
    def is_mxfp4(self) -> bool:
        return self is not Layout.SGLANG_FP8


class IndexerTopKResult(NamedTuple):
    """Outputs of one indexer top-k call; all ``[rows, topk]`` except ``counts`` ``[rows]``.

    values : float32
        Scores of the selected positions, best first (in ascending positions with
        ``order="position"``); ``-inf`` past ``counts``.
    raw_indices : int32
        Logical C4 positions; ``-1`` past ``counts``.
    physical_indices : int32
        ``page_table[r, raw >> 6] * 64 + (raw & 63)``; ``-1`` past ``counts``.
    counts : int32
        ``min(seq_lens[r], topk)``.
    """

    values: torch.Tensor
    raw_indices: torch.Tensor
    physical_indices: torch.Tensor
    counts: torch.Tensor


def is_count(n, minimum: int = 0) -> bool:
    """Whether ``n`` is an integer (a numpy one too; not a bool) of at least ``minimum``."""
    return not isinstance(n, bool) and hasattr(n, "__index__") and n >= minimum


def allocate_result(rows: int, topk: int, device) -> IndexerTopKResult:
    """Empty output tensors of the right shapes and dtypes (contents undefined): ``values``
    float32 ``[rows, topk]``, ``raw_indices`` and ``physical_indices`` int32 ``[rows, topk]``,
    ``counts`` int32 ``[rows]``."""
    if not torch.compiler.is_compiling():  # (a traced size is symbolic: torch.empty checks it)
        for name, n in (("rows", rows), ("topk", topk)):
            if not is_count(n):
                raise ValueError(f"{name}: expected a non-negative int, got {n!r}")
    return _allocate_result(rows, topk, device)


def _allocate_result(rows: int, topk: int, device) -> IndexerTopKResult:
    """:func:`allocate_result` for sizes already checked (a known call's)."""
    return IndexerTopKResult(
        torch.empty((rows, topk), dtype=torch.float32, device=device),
        torch.empty((rows, topk), dtype=torch.int32, device=device),
        torch.empty((rows, topk), dtype=torch.int32, device=device),
        torch.empty((rows,), dtype=torch.int32, device=device),
    )


def by_position(result: IndexerTopKResult) -> IndexerTopKResult:
    """``result``'s rows laid out in ascending positions, unused slots (position ``-1``) last, in
    new tensors: what ``order="position"`` returns for the entries ``order="score"`` returned.
    The values keep their bits (NaN payloads included)."""
    raw = result.raw_indices
    slots = torch.argsort(torch.where(raw < 0, torch.iinfo(torch.int32).max, raw), dim=1, stable=True)
    values = result.values.view(torch.int32).gather(1, slots).view(torch.float32)
    return IndexerTopKResult(values, raw.gather(1, slots), result.physical_indices.gather(1, slots),
                             result.counts.clone())


def parse_layout(layout) -> Layout:
    try:
        return Layout(layout)
    except ValueError:
        choices = ", ".join(repr(x.value) for x in Layout)
        raise ValueError(f"layout: unsupported layout {layout!r}; expected one of {choices}") from None


# ---------------------------------------------------------------------------------------------
# The total order
# ---------------------------------------------------------------------------------------------

def ordered_score_bits(values: torch.Tensor) -> torch.Tensor:
    """Map fp32 scores to int32 keys whose signed order is the contract's score order.

    Non-negative floats keep their bit pattern; negative floats have their low 31 bits flipped,
    so ``-0 < +0`` and larger magnitudes sort lower; every NaN maps to :data:`KEY_NAN`, below
    ``-inf``. No score maps to :data:`KEY_NONE`. The kernels use the same encoding.
    """
    bits = values.to(torch.float32).contiguous().view(torch.int32)
    keys = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return torch.where(torch.isnan(values), torch.full_like(keys, KEY_NAN), keys)


def scores_from_ordered_bits(keys: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`ordered_score_bits`: :data:`KEY_NAN` comes back as the canonical quiet
    NaN, and :data:`KEY_NONE` (no entry) as ``-inf``, the contract's padding value."""
    keys = keys.to(torch.int32)
    bits = torch.where(keys < 0, keys ^ 0x7FFFFFFF, keys)
    bits = torch.where(keys == KEY_NAN, torch.full_like(bits, CANONICAL_NAN_BITS), bits)
    bits = torch.where(keys == KEY_NONE, torch.full_like(bits, NEG_INF_BITS), bits)
    return bits.view(torch.float32)


def order_keys(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int64 keys whose descending order is the contract's total order.

    ``key = ordered_score_bits(value) * 2**32 + (2**32 - 1 - position)``: the score decides,
    and among equal scores the lower position has the larger key.
    """
    hi = ordered_score_bits(values).to(torch.int64)
    return hi * (1 << 32) + ((1 << 32) - 1 - positions.to(torch.int64))


def canonicalize_scores(values: torch.Tensor) -> torch.Tensor:
    """fp32 scores with every NaN replaced by the canonical quiet NaN (bit-exact otherwise)."""
    return scores_from_ordered_bits(ordered_score_bits(values))


# ---------------------------------------------------------------------------------------------
# The inputs of one call
# ---------------------------------------------------------------------------------------------

INPUT_NAMES = ("q", "q_scale", "k_cache", "k_scale", "weights", "page_table", "seq_lens")


@dataclass(frozen=True, eq=False)
class IndexerInputs:
    """The inputs of one call, in the form every backend receives them.

    The seven tensors of :func:`indexer_topk.indexer_topk` (``q_scale`` / ``k_scale`` ``None``
    where the layout keeps its scales elsewhere), the parsed :class:`Layout`, ``topk`` and
    ``weight_scale``. :func:`validate_inputs` builds it after checking every argument (and
    rounds ``weight_scale`` to the fp32 value the kernels multiply by, as the reference does
    too); :meth:`of` builds one without checks (tests and
    benchmarks that call a backend directly, e.g. with a ``topk`` the public API does not
    take), and backends trust what they are given.
    """

    q: torch.Tensor
    q_scale: Optional[torch.Tensor]
    k_cache: torch.Tensor
    k_scale: Optional[torch.Tensor]
    weights: torch.Tensor
    page_table: torch.Tensor
    seq_lens: torch.Tensor
    layout: Layout
    topk: int
    weight_scale: float = 1.0
    order: str = ORDER_SCORE

    def __post_init__(self):
        # backends read the order as a flag: a misspelt one would quietly give best first
        check_order(self.order)

    @classmethod
    def of(cls, tensors: Sequence, *, topk: int, layout, weight_scale: float = 1.0,
           order: str = ORDER_SCORE) -> "IndexerInputs":
        """Unchecked inputs from the seven tensors in call order (``Workload.args()``)."""
        return cls(*tensors, layout=parse_layout(layout), topk=int(topk), weight_scale=float(weight_scale),
                   order=order)

    @property
    def tensors(self) -> Tuple[Optional[torch.Tensor], ...]:
        """The seven tensors in call order, for functions that take them positionally."""
        return tuple(getattr(self, name) for name in INPUT_NAMES)

    @property
    def rows(self) -> int:
        return self.q.shape[0]

    @property
    def device(self) -> torch.device:
        return self.q.device


def as_inputs(inputs, *, topk=None, layout=None, weight_scale=None, order=None) -> IndexerInputs:
    """A backend's first argument as :class:`IndexerInputs`.

    Backends take an :class:`IndexerInputs`; for callers that hold the seven tensors as a
    tuple (the benchmark scripts) they also take the tuple with ``topk``, ``layout`` and
    ``weight_scale`` keywords, made into unchecked inputs by :meth:`IndexerInputs.of`.
    """
    if isinstance(inputs, IndexerInputs):
        if topk is not None or layout is not None or weight_scale is not None or order is not None:
            raise TypeError("topk, layout, weight_scale and order come with the IndexerInputs; pass them only with "
                            "a tuple")
        return inputs
    if topk is None or layout is None:
        raise TypeError("a tuple of input tensors needs topk= and layout=")
    return IndexerInputs.of(inputs, topk=topk, layout=layout, weight_scale=1.0 if weight_scale is None else weight_scale,
                            order=ORDER_SCORE if order is None else order)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

def _expect_tensor(name, t, dtype, shape, device):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if t.dim() != len(shape):  # (the expected shape would take its sizes from the wrong dimensions)
        raise ValueError(f"{name}: expected {len(shape)} dimensions, got {t.dim()} (shape {list(t.shape)})")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")
    _expect_plain(name, t)


def _expect_plain(name, t) -> None:
    """A negated or conjugated view (``x.conj().imag``) holds its values in memory un-negated
    and applies the sign lazily; the kernels read and write memory as it is, so it is refused."""
    if t.is_neg() or t.is_conj():
        raise ValueError(f"{name}: a negated or conjugated view (the kernels read memory as stored); pass "
                         f"{name.split('.')[-1]}.resolve_neg().resolve_conj()")


def _expect_none(name, t, layout):
    if t is not None:
        raise ValueError(f"{name}: must be None for layout {layout.value!r}")


def storage_span(t: Optional[torch.Tensor]) -> Optional[Tuple[int, int]]:
    """``(first byte, one past the last byte)`` of ``t``'s elements; ``None`` when there are none."""
    if t is None or t.numel() == 0:
        return None
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = storage_span(a), storage_span(b)
    if sa is None or sb is None:
        return False
    return sa[0] < sb[1] and sb[0] < sa[1]


def expected_shapes(layout: Layout, rows: int, num_pages: int):
    """The (dtype, shape) each input must have, for this layout; ``None`` where it must be None."""
    if layout is Layout.AITER_MXFP4:
        return {
            "q": (torch.uint8, (rows, HEADS, HEAD_DIM // 2)),
            "q_scale": (torch.uint8, (rows, 1, 4, 16, 4)),
            "k_cache": (torch.uint8, (num_pages, 1, 4, PAGE_SIZE, 16)),
            "k_scale": (torch.uint8, (num_pages, 1, 4, PAGE_SIZE)),
            "weights": (torch.bfloat16, (rows, HEADS)),
        }
    if layout is Layout.SGLANG_MXFP4:
        return {
            "q": (torch.uint8, (rows, HEADS, HEAD_DIM // 2)),
            "q_scale": (torch.int32, (rows, HEADS)),
            "k_cache": (torch.uint8, (num_pages, PAGE_SIZE * SGLANG_MXFP4_SLOT_BYTES)),
            "k_scale": None,
            "weights": (torch.float32, (rows, HEADS)),
        }
    return {
        "q": (torch.float8_e4m3fn, (rows, HEADS, HEAD_DIM)),
        "q_scale": None,
        "k_cache": (torch.uint8, (num_pages, PAGE_SIZE * SGLANG_FP8_SLOT_BYTES)),
        "k_scale": None,
        "weights": (torch.float32, (rows, HEADS)),
    }


def check_topk(topk) -> int:
    if isinstance(topk, bool) or not isinstance(topk, int) or topk not in SUPPORTED_TOPK:
        raise ValueError(f"topk: unsupported value {topk!r}; expected one of {SUPPORTED_TOPK}")
    return topk


def check_order(order) -> str:
    """``order`` as given, or ``ValueError`` naming it: ``"score"`` (each row best first, equal
    scores by the lower position; a row of at most ``topk`` positions in ascending positions) or
    ``"position"`` (every row's selection in ascending positions: the same entries, no sort)."""
    if type(order) is not str or order not in ORDERS:  # a str subclass could compare equal and key apart
        raise ValueError(f"order: expected one of {ORDERS}, got {order!r}")
    return order


def _check_out(out, inputs: IndexerInputs) -> Optional[IndexerTopKResult]:
    """``out`` as an :class:`IndexerTopKResult` (a plain 4-tuple is accepted), checked."""
    if out is None:
        return None
    if not isinstance(out, IndexerTopKResult):
        if isinstance(out, tuple) and len(out) == 4:
            out = IndexerTopKResult(*out)
        else:
            raise ValueError("out: expected an IndexerTopKResult of four tensors")
    rows, topk, device = inputs.rows, inputs.topk, inputs.device
    for field, dtype, shape in (
        ("values", torch.float32, (rows, topk)),
        ("raw_indices", torch.int32, (rows, topk)),
        ("physical_indices", torch.int32, (rows, topk)),
        ("counts", torch.int32, (rows,)),
    ):
        _expect_tensor(f"out.{field}", getattr(out, field), dtype, shape, device)
    return out


def _check_out_aliasing(out: Optional[IndexerTopKResult], inputs: IndexerInputs) -> None:
    """No output shares a byte with an input or with another output."""
    if out is None:
        return
    outs = list(out)
    given = [t for t in inputs.tensors if t is not None]
    for i, o in enumerate(outs):
        for t in given:
            if _overlaps(o, t):
                raise ValueError(f"out.{out._fields[i]}: aliases an input tensor")
        for j in range(i + 1, len(outs)):
            if _overlaps(o, outs[j]):
                raise ValueError(f"out.{out._fields[i]}: aliases out.{out._fields[j]}")


@torch.no_grad()  # reads values only: weights that require grad are read as numbers
def _check_values(inputs: IndexerInputs) -> None:
    """The checks that read tensor contents (they synchronise with the device)."""
    seq_lens, page_table = inputs.seq_lens, inputs.page_table
    max_pages = page_table.shape[1]
    num_pages = inputs.k_cache.shape[0]
    lo = int(seq_lens.min())
    hi = int(seq_lens.max())
    if lo < 0:
        raise ValueError(f"seq_lens: negative length {lo}")
    if hi > max_pages * PAGE_SIZE:
        raise ValueError(f"seq_lens: length {hi} exceeds the page table ({max_pages} pages x {PAGE_SIZE})")
    if hi > 0:
        used = torch.arange(max_pages, device=inputs.device)[None, :] * PAGE_SIZE < seq_lens[:, None].long()
        bad = used & ((page_table < 0) | (page_table >= num_pages))
        if bool(bad.any()):
            r, p = (int(x) for x in bad.nonzero()[0])
            raise ValueError(
                f"page_table: row {r} page {p} holds id {int(page_table[r, p])}, "
                f"outside the cache of {num_pages} pages"
            )
    check_score_range(inputs)


def _finite_abs(values: torch.Tensor) -> torch.Tensor:
    """float64 ``|values|`` with every non-finite value as 0."""
    v = values.double().abs()
    return torch.where(torch.isfinite(v), v, torch.zeros_like(v))


def _finite_abs_sum(weights: torch.Tensor) -> torch.Tensor:
    """float64 ``[rows]``: each row's ``sum_h |weights|`` over its finite weights."""
    return _finite_abs(weights).sum(dim=1)


def _largest_exponent(exponents: torch.Tensor, dim=None) -> torch.Tensor:
    """float64 largest finite ue8m0 exponent byte (below 255), -inf where there is none."""
    e = exponents.to(torch.float64)
    e = torch.where(e < UE8M0_NONFINITE, e, torch.full_like(e, float("-inf")))
    if dim is None:
        return e.max() if e.numel() else e.new_full((), float("-inf"))
    return e.amax(dim=dim) if e.shape[dim] else e.new_full(e.shape[:dim] + e.shape[dim + 1 :], float("-inf"))


def score_bounds(inputs: IndexerInputs):
    """Each row's bound on its fp32 intermediates (float64 ``[rows]``, 0 for a row without
    positions to score) and a function saying, for a row, how its bound was formed (the
    module docstring states the bound)."""
    # Reads the weights, the query exponents and the scales of the cache pages the rows use. An
    # unchecked length is bounded by the page table and an unchecked page id outside the cache
    # left out (where values are checked, the checks refusing those run first).
    layout, k_cache, page_table = inputs.layout, inputs.k_cache, inputs.page_table
    rows, num_pages = inputs.rows, k_cache.shape[0]
    dev = k_cache.device
    lens = inputs.seq_lens.long().clamp(min=0, max=page_table.shape[1] * PAGE_SIZE)
    used = torch.arange(page_table.shape[1], device=dev)[None, :] * PAGE_SIZE < lens[:, None]
    pages = page_table.long()[used]
    pages = pages[(pages >= 0) & (pages < num_pages)].unique()
    weight_sum = _finite_abs_sum(inputs.weights)
    if layout is Layout.SGLANG_FP8:
        key_scales = k_cache[pages, PAGE_SIZE * HEAD_DIM :].contiguous().view(torch.float32)
        dot = torch.full((rows,), HEAD_DIM * E4M3_MAX**2, dtype=torch.float64, device=dev)
        key_scale = float(_finite_abs(key_scales).max()) if key_scales.numel() else 0.0
        def how(r):
            return f"largest |q . k| {HEAD_DIM * E4M3_MAX**2:.4g} (e4m3), largest key scale {key_scale:.4g}"
    else:
        if layout is Layout.SGLANG_MXFP4:
            q_exp = inputs.q_scale.contiguous().view(torch.uint8).reshape(rows, HEADS * 4)
            k_exp = k_cache[pages, PAGE_SIZE * (HEAD_DIM // 2) :]
        else:
            q_exp = inputs.q_scale.reshape(rows, HEADS * 4)
            k_exp = inputs.k_scale[pages]
        eq = _largest_exponent(q_exp, dim=1)
        ek = float(_largest_exponent(k_exp))
        dot = HEAD_DIM * E2M1_MAX**2 * torch.exp2(eq - 127) * 2.0 ** (ek - 127)
        key_scale = 1.0

        def how(r):
            return (f"largest |q . k| {float(dot[r]):.4g} from query block exponent {float(eq[r]):g} and key "
                    f"block exponent {ek:g}")
    bound = torch.maximum(dot, dot * weight_sum * max(1.0, key_scale))
    bound = torch.where(lens > 0, torch.nan_to_num(bound, nan=0.0), torch.zeros_like(bound))
    return bound, how


@torch.no_grad()  # reads values only: weights that require grad are read as numbers
def check_score_range(inputs: IndexerInputs) -> None:
    """``ValueError`` where a row's inputs are beyond the contract's fp32 range (module
    docstring): the kernels could give ``inf`` where the exact score is finite."""
    if inputs.rows == 0:
        return
    bound, how = score_bounds(inputs)
    worst = int(bound.argmax())
    if float(bound[worst]) <= SCORE_RANGE:
        return
    names = "weights, k_cache" if inputs.layout is Layout.SGLANG_FP8 else "weights, q_scale, k_cache"
    weights = float(_finite_abs_sum(inputs.weights[worst : worst + 1]))
    raise ValueError(
        f"{names}: row {worst}'s scores are beyond the fp32 range the kernels compute in: their fp32 "
        f"intermediates (before weight_scale) may reach {float(bound[worst]):.4g} (sum_h |weights| {weights:.4g}, "
        f"{how(worst)}), above 2**127 = {SCORE_RANGE:.4g}; scale the weights or the key scales down and weight_scale up"
    )


def check_metadata(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, *, topk, layout, weight_scale=1.0,
                   out=None, check_values: bool = False, addresses: bool = False,
                   order: str = ORDER_SCORE) -> Tuple[IndexerInputs, Optional[IndexerTopKResult]]:
    """The checks of :func:`validate_inputs` that read neither data nor addresses, in its order:
    scalar arguments, each tensor's dtype, shape, device and contiguity, ``out``'s shapes. They
    hold for fake and meta tensors too, so the operators' fake implementations refuse under
    ``torch.compile`` what the call would refuse when it runs. Raises ``ValueError`` naming the
    argument; returns what :func:`validate_inputs` does. ``addresses``: tensors with data, as a
    call runs them (a meta ``q`` is refused, the FP8 cache's alignment read from its address)."""
    layout = parse_layout(layout)
    check_topk(topk)
    scale = _fp32_weight_scale(weight_scale)
    check_order(order)
    if not isinstance(check_values, bool):
        raise ValueError(f"check_values: expected True or False, got {check_values!r}")
    if not isinstance(q, torch.Tensor) or q.dim() < 1:
        raise ValueError("q: expected a torch.Tensor with a leading rows dimension")
    device = q.device
    if addresses and device.type == "meta":
        # every other tensor is held to q's device, so this rejects them all
        raise ValueError("q: a meta tensor has no data to read; pass tensors on a GPU (or the CPU)")
    rows = q.shape[0]
    if not isinstance(k_cache, torch.Tensor) or k_cache.dim() < 1:
        raise ValueError("k_cache: expected a torch.Tensor with a leading pages dimension")
    spec = expected_shapes(layout, rows, k_cache.shape[0])
    named = {"q": q, "q_scale": q_scale, "k_cache": k_cache, "k_scale": k_scale, "weights": weights}
    for name, t in named.items():
        if spec[name] is None:
            _expect_none(name, t, layout)
        else:
            dtype, shape = spec[name]
            _expect_tensor(name, t, dtype, shape, device)
    if addresses and layout is Layout.SGLANG_FP8 and (k_cache.storage_offset() % 4 or k_cache.data_ptr() % 4):
        raise ValueError(
            "k_cache: must start on a 4-byte boundary (the FP8 layout's per-key scales are read as "
            f"float32); it starts at byte offset {k_cache.storage_offset()} of its storage"
        )
    if not isinstance(page_table, torch.Tensor) or page_table.dim() != 2:
        raise ValueError("page_table: expected an int32 tensor [rows, max_pages]")
    _expect_tensor("page_table", page_table, torch.int32, (rows, page_table.shape[1]), device)
    _expect_tensor("seq_lens", seq_lens, torch.int32, (rows,), device)
    inputs = IndexerInputs(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, layout, topk, scale, order)
    return inputs, _check_out(out, inputs)


def validate_inputs(
    q,
    q_scale,
    k_cache,
    k_scale,
    weights,
    page_table,
    seq_lens,
    *,
    topk,
    layout,
    weight_scale=1.0,
    out=None,
    workspace=None,
    check_values: bool = True,
    order: str = ORDER_SCORE,
) -> Tuple[IndexerInputs, Optional[IndexerTopKResult]]:
    """Check every argument of :func:`indexer_topk.indexer_topk`; raise ``ValueError`` naming it.

    Returns the :class:`IndexerInputs` the backends receive and ``out`` as an
    :class:`IndexerTopKResult` (a plain 4-tuple is accepted).

    Shape, dtype, device, alignment, aliasing and layout checks read only metadata.
    ``check_values`` adds the checks that read tensor contents (``seq_lens`` within
    ``[0, page_table.shape[1] * 64]``, every page id a row uses inside the cache, and the
    weights, block exponents and key scales within the kernels' fp32 range,
    :func:`check_score_range`); they synchronise with the device, so graph-captured and decode
    callers turn them off. A
    ``workspace`` tensor is checked here for everything but its size, which depends on the
    backend (:func:`check_workspace`).
    """
    inputs, out = check_metadata(q, q_scale, k_cache, k_scale, weights, page_table, seq_lens, topk=topk,
                                 layout=layout, weight_scale=weight_scale, out=out, check_values=check_values,
                                 addresses=True, order=order)
    _check_out_aliasing(out, inputs)
    _check_workspace_aliasing(workspace, inputs, out)
    if check_values and inputs.rows > 0:
        _check_values(inputs)
    return inputs, out


def _fp32_weight_scale(weight_scale) -> float:
    """``weight_scale`` as the fp32 value the kernels multiply by (as a Python float).

    Values fp32 cannot hold are rejected rather than rounded: past its range they would
    become inf (NaN scores in the kernels), and below its smallest normal they would keep too
    few bits (a subnormal) or none; every backend, the reference included, then uses the same
    rounded value.
    """
    if isinstance(weight_scale, (bool, torch.Tensor)) or not isinstance(weight_scale, (int, float)):
        raise ValueError(f"weight_scale: expected a Python float, got {type(weight_scale).__name__}")
    try:
        value = float(weight_scale)
        rounded = struct.unpack("f", struct.pack("f", value))[0]  # no tensor: this runs on every call
    except OverflowError:
        raise ValueError(f"weight_scale: {value_words(weight_scale)} is beyond fp32's range (at most {FP32_MAX:.7g})") from None
    if not math.isfinite(rounded):
        raise ValueError(f"weight_scale: {value!r} is not a finite fp32 number (at most {FP32_MAX:.7g} in magnitude)")
    if value != 0 and abs(rounded) < FP32_TINY:
        raise ValueError(
            f"weight_scale: {value!r} is below fp32's smallest normal number ({FP32_TINY:.7g}): "
            "the kernels would multiply by a rounded subnormal or by 0"
        )
    return rounded


def _check_workspace_aliasing(workspace, inputs: IndexerInputs, out: Optional[IndexerTopKResult]) -> None:
    """Everything about a caller's workspace but its size: a uint8 tensor on the inputs'
    device, contiguous, aligned, and sharing no byte with an input or an output (the call
    writes it). AITER's own workspace (a tuple of tensors) is left to the aiter backend."""
    if workspace is None:
        return
    if isinstance(workspace, tuple) and workspace and all(isinstance(t, torch.Tensor) for t in workspace):
        return
    if not isinstance(workspace, torch.Tensor):
        raise ValueError(
            f"workspace: expected a uint8 torch.Tensor (or AITER's workspace tuple), got {type(workspace).__name__}"
        )
    check_workspace(workspace, 0, inputs.device)
    for name, t in zip(INPUT_NAMES, inputs.tensors):
        if t is not None and _overlaps(workspace, t):
            raise ValueError(f"workspace: overlaps {name}")
    for field, t in zip(IndexerTopKResult._fields, out or ()):
        if _overlaps(workspace, t):
            raise ValueError(f"workspace: overlaps out.{field}")


def check_workspace(workspace: Optional[torch.Tensor], nbytes: int, device) -> None:
    """A caller-owned workspace must be a contiguous uint8 tensor of at least ``nbytes``."""
    if workspace is None:
        return
    if not isinstance(workspace, torch.Tensor) or workspace.dtype != torch.uint8:
        raise ValueError("workspace: expected a uint8 torch.Tensor")
    if workspace.device != device:
        raise ValueError(f"workspace: expected device {device}, got {workspace.device}")
    if not workspace.is_contiguous():
        raise ValueError("workspace: expected a contiguous tensor")
    if workspace.numel() < nbytes:
        raise ValueError(f"workspace: {workspace.numel()} bytes given, {nbytes} needed")
    if workspace.data_ptr() % WORKSPACE_ALIGN or workspace.storage_offset() % 4:
        # its areas are int32 views, which torch places by the storage offset
        raise ValueError(f"workspace: must start on a {WORKSPACE_ALIGN}-byte boundary (and a 4-byte boundary of "
                         "its storage)")
    _expect_plain("workspace", workspace)
