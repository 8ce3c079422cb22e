"""The prefix sums of the select kernels (:func:`indexer_topk.kernels.common.exclusive_sum` in
position order, :func:`~indexer_topk.kernels.common.exclusive_sum_strided` in strided order) and
:func:`indexer_topk.kernels.row_topk.bit_length`, against torch.

``exclusive_sum`` takes wide tiles as rows of ``SCAN_RUN`` and narrow ones as a plain scan: both
are checked at every width around the switch, on flags (what the kernels scan: which keys are
taken, which equal the k-th) and on counts of any size, the int32 range's ends included. The
strided sums are checked the same way, and as slots: a compaction by them fills every slot once.
"""

import pytest
import torch
import triton
import triton.language as tl

from indexer_topk.kernels.common import SCAN_ROWS_MIN, SCAN_RUN, SCAN_STRIDE, exclusive_sum, exclusive_sum_strided
from indexer_topk.kernels.row_topk import bit_length


@triton.jit
def _scan_kernel(x, out, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out + offs, exclusive_sum(tl.load(x + offs)))


@triton.jit
def _strided_kernel(x, out, N: tl.constexpr, STRIDE: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out + offs, exclusive_sum_strided(tl.load(x + offs), STRIDE))


@triton.jit
def _bit_length_kernel(x, out, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out + offs, bit_length(tl.load(x + offs)))


def _exclusive(x: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sums in int32 arithmetic (wrapping, as the kernel's adds do)."""
    wide = torch.cumsum(x.to(torch.int64), 0) - x.to(torch.int64)
    return ((wide + 2**31) % 2**32 - 2**31).to(torch.int32)


def _strided_order(n: int, stride: int) -> torch.Tensor:
    """The entries of a tile of ``n`` in strided order: ``t, t + stride, ...`` for each ``t``."""
    if n % stride or n <= stride:  # the kernel scans such tiles in storage order
        return torch.arange(n)
    return torch.arange(n).reshape(n // stride, stride).t().reshape(-1)


ROWS_MIN, RUN, STRIDE = SCAN_ROWS_MIN.value, SCAN_RUN.value, SCAN_STRIDE.value
WIDTHS = sorted({16, ROWS_MIN // 2, ROWS_MIN, 2 * ROWS_MIN, 4096})
STRIDED_WIDTHS = sorted({16, STRIDE, 2 * STRIDE, 4 * STRIDE, 4096})


def _values(kind: str, n: int, seed: int) -> torch.Tensor:
    """``n`` int32 values of a kind the kernels scan (or a sum's edge), from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "flags":
        x = (torch.rand(n, generator=gen) < 0.5).to(torch.int32)
    elif kind == "sparse":  # one set flag in a run at most, the runs' totals mostly zero
        x = torch.zeros(n, dtype=torch.int32)
        x[torch.randint(0, n, (max(1, n // (4 * RUN)),), generator=gen)] = 1
    elif kind == "counts":
        x = torch.randint(-1000, 1000, (n,), generator=gen, dtype=torch.int32)
    else:  # the int32 range's ends: the sums wrap as int32 adds do
        x = torch.full((n,), 2**31 - 1, dtype=torch.int32)
        x[1::2] = -(2**31)
    return x


def _launch(kernel, x: torch.Tensor, device, **constexprs) -> torch.Tensor:
    """``kernel``'s one-tile output for ``x``, every slot poisoned before."""
    out = torch.full(x.shape, -7, dtype=torch.int32, device=device)
    kernel[(1,)](x.to(device), out, N=x.numel(), **constexprs)
    return out.cpu()


@pytest.mark.parametrize("n", STRIDED_WIDTHS)
@pytest.mark.parametrize("values", ["flags", "sparse", "counts", "extremes"])
def test_exclusive_sum_strided_matches_torch(n, values, device):
    """Each entry's sum is that of the entries before it in strided order."""
    x = _values(values, n, n * 17 + len(values))
    order = _strided_order(n, STRIDE)
    want = torch.empty(n, dtype=torch.int32)
    want[order] = _exclusive(x[order])
    assert torch.equal(_launch(_strided_kernel, x, device, STRIDE=STRIDE), want)


# the split select's gathering passes its program's thread count: 128 at 4 warps; 512 at 16
@pytest.mark.parametrize("n,stride", [(256, 128), (1024, 128), (1024, 512), (1024, 1024), (512, 64), (128, 256)])
def test_exclusive_sum_strided_at_other_strides(n, stride, device):
    """``STRIDE`` other than the default: strided order where the tile is two strides or more,
    storage order where it is one stride or less."""
    x = _values("flags", n, n + stride)
    order = _strided_order(n, stride)
    want = torch.empty(n, dtype=torch.int32)
    want[order] = _exclusive(x[order])
    assert torch.equal(_launch(_strided_kernel, x, device, STRIDE=stride), want)


def test_exclusive_sum_strided_slots_fill_each_once(device):
    """As a compaction's slots (what :func:`~indexer_topk.kernels.row_topk.append` with ``STRIDED``
    uses them for): the flagged entries land on ``0 .. count - 1``, one each."""
    n = 4096
    x = _values("flags", n, 3)
    slots = _launch(_strided_kernel, x, device, STRIDE=STRIDE)[x.bool()]
    assert torch.equal(torch.sort(slots).values, torch.arange(int(x.sum()), dtype=torch.int32))


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("values", ["flags", "sparse", "counts", "extremes"])
def test_exclusive_sum_matches_torch(n, values, device):
    """Each entry's sum is that of the entries before it in storage order."""
    x = _values(values, n, n * 31 + len(values))
    assert torch.equal(_launch(_scan_kernel, x, device), _exclusive(x))


def test_bit_length_matches_python(device):
    edges = [0, 1, 2, 3, 4, 7, 8, 2**23, 2**24 - 1, 2**24, 2**24 + 1, 2**30, 2**31 - 1, -1, -(2**31), 123456789]
    gen = torch.Generator().manual_seed(5)
    x = torch.cat([torch.tensor(edges, dtype=torch.int32),
                   torch.randint(-(2**31), 2**31 - 1, (128 - len(edges),), generator=gen, dtype=torch.int32)])
    out = torch.full((128,), -7, dtype=torch.int32, device=device)
    _bit_length_kernel[(1,)](x.to(device), out, N=128)
    want = [32 if v < 0 else int(v).bit_length() for v in x.tolist()]
    assert out.cpu().tolist() == want
