"""Triton helpers shared by every kernel: the total-order key and the element decoders.

The ordered key is the int32 image of an fp32 score whose signed order is the contract's
score order (see :func:`indexer_topk.contract.ordered_score_bits`); ties between equal keys
are broken by position by the callers, never by the key.
"""

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

try:  # grid dependency control (programmatic dependent launch, sm_90 and later)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # an older Triton: kernels are never launched with PDL (launch.pdl_capable)
    gdc_launch_dependents = gdc_wait = None

# Layout ids, as constexpr kernel arguments.
LAYOUT_AITER_MXFP4 = 0
LAYOUT_SGLANG_MXFP4 = 1
LAYOUT_SGLANG_FP8 = 2

# Constants used inside kernels are constexprs: a literal -2147483648 in a kernel is the
# out-of-range positive 2147483648 negated.
KEY_MIN = tl.constexpr(-2147483648)  # below every score's key: "no entry"
# NaN's key: only bit patterns of negative NaNs map here otherwise, so no number does.
KEY_NAN = tl.constexpr(-2147483647)
COMP_MIN = tl.constexpr(-(2**63))  # below every 64-bit composite (key, position)
INT32_MAX = tl.constexpr(2**31 - 1)
INT64_MAX = tl.constexpr(2**63 - 1)
LOW32 = tl.constexpr(4294967295)
NEG_INF_BITS = tl.constexpr(-8388608)  # 0xFF800000, the fp32 bits of -inf


def layout_id(layout) -> int:
    from ..contract import Layout

    return {
        Layout.AITER_MXFP4: LAYOUT_AITER_MXFP4,
        Layout.SGLANG_MXFP4: LAYOUT_SGLANG_MXFP4,
        Layout.SGLANG_FP8: LAYOUT_SGLANG_FP8,
    }[Layout(layout)]


@triton.jit
def wait_for_producer(PDL: tl.constexpr):
    """A kernel launched with programmatic dependent launch (``PDL``) may start while the kernel
    before it on the stream still runs: every memory access of such a kernel comes after this
    wait, which returns once that kernel has finished and its writes are visible. Without
    ``PDL`` nothing is emitted."""
    if PDL:
        gdc_wait()


@triton.jit
def release_dependents(PDL: tl.constexpr):
    """Let the kernel launched after this one with programmatic dependent launch start now, on
    the SMs this one leaves free, rather than as this one's programs exit; it still waits for
    all of this kernel before reading what it writes (:func:`wait_for_producer`). Without
    ``PDL`` nothing is emitted."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def ordered_key(s):
    """fp32 scores -> int32 keys in score order; NaN -> KEY_NAN, just below -inf.

    KEY_MIN itself is never a score's key: it marks "no entry" (padding in a key matrix).
    """
    bits = s.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return tl.where(s != s, KEY_NAN, key)


@triton.jit
def key_to_score_bits(key):
    """Inverse of :func:`ordered_key` as int32 bits; KEY_NAN -> the canonical NaN."""
    bits = tl.where(key < 0, key ^ 0x7FFFFFFF, key)
    return tl.where(key <= KEY_NAN, 0x7FC00000, bits)


@triton.jit
def e2m1_to_f32(code):
    """e2m1 codes (int32, 0..15; bit 3 is the sign) -> fp32, exactly."""
    m = code & 7
    normal = (((m >> 1) + 126) << 23) | ((m & 1) << 22)
    mag = tl.where(m >= 2, normal, tl.where(m == 1, 126 << 23, 0))
    return (mag | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_to_f32(byte):
    """float8_e4m3fn bytes (int32, 0..255) -> fp32, exactly; 0x7F / 0xFF -> NaN.

    Used under the interpreter, whose own e4m3 cast reads the NaN codes as +-480.
    """
    e = (byte >> 3) & 0xF
    m = byte & 7
    normal = ((e + 120) << 23) | (m << 20)
    mag = tl.where(e == 0, (m.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True), normal)
    bits = tl.where((byte & 0x7F) == 0x7F, 0x7FC00000, mag | ((byte & 0x80) << 24))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def ue8m0_to_f32(e):
    """Biased ue8m0 exponents (int32, 0..255) -> 2**(e - 127) in fp32 (255 -> inf)."""
    bits = tl.where(e >= 255, 0x7F800000, e << 23)
    # e == 0 is 2**-127, a subnormal: bit 22 of the fraction
    return tl.where(e == 0, 0x00400000, bits).to(tl.float32, bitcast=True)


@triton.jit
def pick(vec, r, R: tl.constexpr):
    """Element ``r`` of a small ``[R]`` vector, as a scalar."""
    return tl.sum(tl.where(tl.arange(0, R) == r, vec, 0), axis=0)


# Whether this process's kernels run on the Triton interpreter (Triton decides when a kernel
# is defined, by TRITON_INTERPRET then).
INTERPRETED = tl.constexpr(isinstance(ordered_key, InterpretedFunction))


def index_one_element_scalars() -> bool:
    """Let the interpreter take a scalar as an index where numpy refuses Triton 3.6's way.

    The interpreter holds a kernel's scalar (an integer argument, and what is computed from it)
    as a one-element 1-d numpy array, and a loop bound such as ``range(0, n, CHUNK)`` asks it
    for ``__index__``. Triton 3.6 answers with ``int(array)``, which numpy 2.4 refuses for a
    1-d array (``TypeError: only 0-dimensional arrays can be converted to Python scalars``),
    so every interpreted launch failed there; later Tritons squeeze the array first. Where the
    installed interpreter's ``__index__`` fails on such a scalar, its tensor patch is wrapped to
    index the squeezed value (what later Tritons do); elsewhere nothing changes. Returns
    whether it wrapped. Compiled kernels never pass through here.
    """
    import types
    import warnings

    import numpy as np
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "indexes_one_element_scalars", False):
        return False

    class Capture:
        def __init__(self):
            self.attrs = {}

        def set_attr(self, obj, name, value):
            self.attrs[name] = value

    capture = Capture()
    try:
        patch(type("Tensor", (), {}), capture)
        index = capture.attrs["__index__"]
    except Exception:  # an interpreter that patches tensors otherwise: leave it alone
        return False
    scalar = types.SimpleNamespace(handle=types.SimpleNamespace(data=np.array([7], dtype=np.int32)))
    try:
        with warnings.catch_warnings():
            # numpy before 2.4 only warns that it will refuse: take its warning as the refusal
            warnings.simplefilter("error", DeprecationWarning)
            if index(scalar) == 7:
                return False
    except Exception:
        pass

    def patch_with_index(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(())))

    patch_with_index.indexes_one_element_scalars = True
    interpreter._patch_lang_tensor = patch_with_index
    return True


if INTERPRETED:
    index_one_element_scalars()


# Triton's largest block (TRITON_MAX_TENSOR_NUMEL); the interpreter enforces it too.
MAX_BLOCK = tl.constexpr(1 << 20)


@triton.jit
def sort1d(x, DESCENDING: tl.constexpr):
    """``tl.sort`` of a 1-D tensor. Under the interpreter, where ``tl.sort``'s network of
    small steps costs seconds per call, each element's rank is counted in ``[N, N]``
    comparisons and the elements are placed by rank: the same sorted tensor. Past 1024
    elements ``[N, N]`` exceeds Triton's largest block, so the comparisons are made against
    one piece of ``x`` at a time (``[N, C]`` blocks) and the output is placed a piece at a time."""
    if INTERPRETED:
        N: tl.constexpr = x.shape[0]
        C: tl.constexpr = min(N, MAX_BLOCK // N)
        P: tl.constexpr = N // C
        idx = tl.arange(0, N)
        cidx = tl.arange(0, C)
        prow = tl.arange(0, P)[:, None]
        pieces = tl.reshape(x, [P, C])
        xi = x[:, None]
        rank = tl.zeros([N], dtype=tl.int32)
        for p in tl.static_range(P):
            xj = tl.sum(tl.where(prow == p, pieces, 0), axis=0)[None, :]
            jdx = (cidx + p * C)[None, :]
            if DESCENDING:
                ahead = xj > xi
            else:
                ahead = xj < xi
            ahead = ahead | ((xj == xi) & (jdx < idx[:, None]))
            rank += tl.sum(ahead.to(tl.int32), axis=1)
        out = tl.zeros([P, C], dtype=x.dtype)
        for p in tl.static_range(P):
            piece = tl.sum(tl.where(rank[None, :] == (cidx + p * C)[:, None], x[None, :], 0), axis=1)
            out = tl.where(prow == p, piece[None, :], out)
        return tl.reshape(out, [N])
    else:
        return tl.sort(x, descending=DESCENDING)


# exclusive_sum's rows hold SCAN_RUN entries each (runs of two compiled to fewer instructions and
# more barriers, and measured slower); tiles narrower than SCAN_ROWS_MIN take a plain scan
SCAN_RUN = tl.constexpr(4)
SCAN_ROWS_MIN = tl.constexpr(256)


@triton.jit
def exclusive_sum(x):
    """Exclusive prefix sum of a 1-D int32 tile: ``out[i] = x[0] + ... + x[i - 1]``.

    The same sums as ``tl.cumsum(x, 0) - x``. A wide tile is scanned as ``[N / SCAN_RUN,
    SCAN_RUN]``: each run along its row, then the runs' totals down the column. For sm_90 under
    Triton 3.6, a kernel scanning 4,096 entries with 8 warps compiled to half the instructions of
    ``tl.cumsum`` over the 1-D tile, which also spilled there."""
    N: tl.constexpr = x.shape[0]
    if N >= SCAN_ROWS_MIN:
        rows = tl.reshape(x, [N // SCAN_RUN, SCAN_RUN])
        totals = tl.sum(rows, axis=1)
        before = tl.cumsum(rows, axis=1) - rows + (tl.cumsum(totals, axis=0) - totals)[:, None]
        out = tl.reshape(before, [N])
    else:
        out = tl.cumsum(x, axis=0) - x
    return out


# The row select's programs run 8 warps: a tile loaded one entry a thread lays out entry i in
# thread i mod 256 (exclusive_sum_strided)
SCAN_STRIDE = tl.constexpr(256)
# Appends take strided slots only while at most 1 / DENSE_SHARE of a tile enters: each thread's
# entries land on adjacent slots, so a dense tile's scattered stores cost more than the sum saves
# (measured on the split select's gathering: rising scores lost 9-17% strided at every block)
DENSE_SHARE = tl.constexpr(8)


@triton.jit
def exclusive_sum_strided(x, STRIDE: tl.constexpr = SCAN_STRIDE):
    """Exclusive prefix sums of a 1-D int32 tile in strided order: the tile read as ``STRIDE``
    interleaved sequences (sequence ``t`` holds entries ``t, t + STRIDE, t + 2 * STRIDE, ...``)
    taken one after another. Entry ``i = r * STRIDE + t`` gets the sum of sequences
    ``0 .. t - 1`` and of its own sequence's entries before it.

    For callers that need slots, not an order: a set compacted for a search, or appended to a pool
    whose order is restored later. Triton lays out a tile loaded one entry a thread with entry
    ``i`` in thread ``i mod (32 * num_warps)``, so with 8 warps each sequence lies in one thread's
    registers: a sum along registers and one scan of a total a thread, where a sum in storage
    order scans across threads once per register: ``STRIDE`` is a program's thread count.
    Other layouts give the same sums, at more cost. A tile of one stride, or of a width that is
    not a multiple of it, takes :func:`exclusive_sum`."""
    N: tl.constexpr = x.shape[0]
    if N % STRIDE == 0 and N > STRIDE:
        grid = tl.reshape(x, [N // STRIDE, STRIDE])
        totals = tl.sum(grid, axis=0)
        before = tl.cumsum(grid, axis=0) - grid + (tl.cumsum(totals, axis=0) - totals)[None, :]
        out = tl.reshape(before, [N])
    else:
        out = exclusive_sum(x)
    return out


@triton.jit
def compaction_slots(flags, STRIDED: tl.constexpr = False):
    """Slots of a compaction of the flagged entries (``flags``: 1-D int32 of 0 and 1): by
    :func:`exclusive_sum_strided` with ``STRIDED`` (the set, not its order, matters to the
    reader), else in storage order by :func:`exclusive_sum`."""
    if STRIDED:
        out = exclusive_sum_strided(flags)
    else:
        out = exclusive_sum(flags)
    return out
