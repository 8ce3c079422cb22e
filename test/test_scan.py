"""The position-order prefix sums of the select kernels (:func:`indexer_topk.kernels.common.exclusive_sum`
and :func:`indexer_topk.kernels.row_topk.bit_length`), against torch.

``exclusive_sum`` takes wide tiles as rows of ``SCAN_RUN`` and narrow ones as a plain scan: both
are checked at every width around the switch, on flags (what the kernels scan: which keys are
taken, which equal the k-th) and on counts of any size, the int32 range's ends included.
"""

import pytest
import torch
import triton
import triton.language as tl

from indexer_topk.kernels.common import SCAN_ROWS_MIN, SCAN_RUN, exclusive_sum
from indexer_topk.kernels.row_topk import bit_length


@triton.jit
def _scan_kernel(x, out, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out + offs, exclusive_sum(tl.load(x + offs)))


@triton.jit
def _bit_length_kernel(x, out, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out + offs, bit_length(tl.load(x + offs)))


def _exclusive(x: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sums in int32 arithmetic (wrapping, as the kernel's adds do)."""
    wide = torch.cumsum(x.to(torch.int64), 0) - x.to(torch.int64)
    return ((wide + 2**31) % 2**32 - 2**31).to(torch.int32)


ROWS_MIN, RUN = SCAN_ROWS_MIN.value, SCAN_RUN.value
WIDTHS = sorted({16, ROWS_MIN // 2, ROWS_MIN, 2 * ROWS_MIN, 4096})


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("values", ["flags", "sparse", "counts", "extremes"])
def test_exclusive_sum_matches_torch(n, values, device):
    gen = torch.Generator().manual_seed(n * 31 + len(values))
    if values == "flags":
        x = (torch.rand(n, generator=gen) < 0.5).to(torch.int32)
    elif values == "sparse":  # one set flag in a run at most, the runs' totals mostly zero
        x = torch.zeros(n, dtype=torch.int32)
        x[torch.randint(0, n, (max(1, n // (4 * RUN)),), generator=gen)] = 1
    elif values == "counts":
        x = torch.randint(-1000, 1000, (n,), generator=gen, dtype=torch.int32)
    else:  # the int32 range's ends: the sums wrap as int32 adds do
        x = torch.full((n,), 2**31 - 1, dtype=torch.int32)
        x[1::2] = -(2**31)
    out = torch.full((n,), -7, dtype=torch.int32, device=device)
    _scan_kernel[(1,)](x.to(device), out, N=n)
    assert torch.equal(out.cpu(), _exclusive(x))


def test_bit_length_matches_python(device):
    edges = [0, 1, 2, 3, 4, 7, 8, 2**23, 2**24 - 1, 2**24, 2**24 + 1, 2**30, 2**31 - 1, -1, -(2**31), 123456789]
    gen = torch.Generator().manual_seed(5)
    x = torch.cat([torch.tensor(edges, dtype=torch.int32),
                   torch.randint(-(2**31), 2**31 - 1, (128 - len(edges),), generator=gen, dtype=torch.int32)])
    out = torch.full((128,), -7, dtype=torch.int32, device=device)
    _bit_length_kernel[(1,)](x.to(device), out, N=128)
    want = [32 if v < 0 else int(v).bit_length() for v in x.tolist()]
    assert out.cpu().tolist() == want
