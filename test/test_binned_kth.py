"""The k-th search by one histogram of the tile and a search inside one bin
(:func:`indexer_topk.kernels.row_topk.binned_kth`), against a sort in torch.

A one-tile kernel takes each tile's best ``k`` by :func:`binned_kth` and
:func:`.select.take_mask`, as the row select does, and writes which keys it took and the gate a
later key would have to reach. Each case is checked against the best ``k`` of a stable sort
(higher keys first, then lower positions) on data chosen to reach each of the search's ways: the
k-th key's bin searched on its own (normal scores), taken whole (a cluster of exactly ``k`` keys
far above the rest), and too full for the scratch (a small ``CAND``, ties, a plateau, a range
stretched past what fp32 holds by two outliers), and on the values that have no fp32 difference
(NaN, infinities, signed zeros, subnormals).
"""

import pytest
import torch
import triton
import triton.language as tl

from indexer_topk.contract import KEY_NAN, ordered_score_bits
from indexer_topk.kernels.row_topk import binned_kth
from indexer_topk.kernels.select import next_gate, take_mask

TILE = 256


@triton.jit
def _take_kernel(keys, n, k, buf, out, TILE: tl.constexpr, CAND: tl.constexpr, BINS: tl.constexpr):
    offs = tl.arange(0, TILE)
    valid = offs < n
    key = tl.load(keys + offs, mask=valid, other=0)
    t, shift, need, whole = binned_kth(key, valid, k, buf, CAND, BINS)
    take, _eq = take_mask(key, valid, t, shift, need, 0, whole)
    tl.store(out + offs, take.to(tl.int32))
    tl.store(out + TILE, next_gate(t, shift))


def take(keys: torch.Tensor, k: int, bins: int, cand: int):
    """The kernel's taken mask over ``keys`` (int32 order keys, fewer than ``TILE``), its gate and
    whether it wrote its scratch (a bin's keys searched on their own)."""
    n = keys.numel()
    dev = keys.device
    src = torch.zeros(TILE, dtype=torch.int32, device=dev)
    src[:n] = keys
    buf = torch.full((cand + 8,), -7, dtype=torch.int32, device=dev)
    out = torch.full((TILE + 1,), -3, dtype=torch.int32, device=dev)
    _take_kernel[(1,)](src, n, k, buf, out, TILE=TILE, CAND=cand, BINS=bins)
    assert torch.all(buf[cand:] == -7), "wrote past its CAND keys of scratch"
    return out[:n].bool().cpu(), int(out[TILE]), bool(torch.any(buf[:cand] != -7))


def best_k(keys: torch.Tensor, k: int):
    """The contract's best ``k``: higher keys first, then lower positions; and the k-th key."""
    order = torch.sort(keys.cpu().long(), descending=True, stable=True).indices
    want = torch.zeros(keys.numel(), dtype=torch.bool)
    want[order[:k]] = True
    return want, int(keys.cpu()[order[k - 1]])


def scores(values) -> torch.Tensor:
    return ordered_score_bits(torch.as_tensor(values, dtype=torch.float32))


def cases():
    gen = torch.Generator().manual_seed(5)
    normal = torch.randn(200, generator=gen) * 8
    cluster = torch.cat([torch.rand(64, generator=gen), 100 + torch.rand(136, generator=gen)])
    plateau = torch.where(torch.rand(200, generator=gen) < 0.7, 0.0, torch.randn(200, generator=gen))
    outliers = torch.randn(200, generator=gen)
    outliers[[3, 77]] = torch.tensor([-3e38, 3e38])
    sink = torch.randn(200, generator=gen)
    sink[0] = 1e30
    special = torch.randn(200, generator=gen)
    special[::9] = float("nan")
    special[1::13] = float("inf")
    special[2::17] = float("-inf")
    special[3::5] = 0.0
    special[4::5] = -0.0
    subnormal = torch.randint(0, 50, (200,), generator=gen).to(torch.int32).view(torch.float32)
    # (name, keys, k, bins, CAND, whether the k-th's bin is searched on its own: None, either way)
    yield "normal, one bin searched", scores(normal), 64, 32, 64, True
    yield "normal, k near the top", scores(normal), 5, 32, 64, None
    yield "normal, k one short of n", scores(normal), 199, 32, 64, None
    yield "normal, 256 bins", scores(normal), 100, 256, 64, None
    yield "normal, 2 bins", scores(normal), 100, 2, 128, True
    yield "normal, bin past the scratch", scores(normal), 64, 4, 16, False
    yield "cluster of k, bin taken whole", scores(cluster), 136, 32, 64, False
    yield "cluster, k inside it", scores(cluster), 100, 32, 64, None
    yield "plateau of zeros", scores(plateau), 100, 32, 64, None
    yield "two outliers past fp32's range", scores(outliers), 50, 32, 64, False
    yield "one sink far above", scores(sink), 50, 32, 64, False
    yield "NaN, infinities, signed zeros", scores(special), 120, 32, 64, None
    yield "subnormals", scores(subnormal), 90, 32, 64, None
    yield "every key equal", scores(torch.full((200,), 1.5)), 77, 32, 64, False
    yield "keys that are no scores", torch.arange(-100, 100, dtype=torch.int32) * 7 + 3, 60, 32, 64, None
    yield "NaN keys only", torch.full((200,), KEY_NAN, dtype=torch.int32), 30, 32, 64, False


@pytest.mark.parametrize("name,keys,k,bins,cand,searched", list(cases()), ids=[c[0] for c in cases()])
def test_binned_kth_takes_the_best_k(name, keys, k, bins, cand, searched, device):
    got, gate, wrote = take(keys.to(device), k, bins, cand)
    want, kth = best_k(keys, k)
    assert torch.equal(got, want), f"{name}: {int((got != want).sum())} keys taken or left wrongly"
    if searched is not None:  # the way the search went: the one-bin search is what makes it fast
        assert wrote == searched, f"{name}: the k-th's bin {'not ' if searched else ''}searched on its own"
    # a later key above the k-th must reach the gate, and no key the tile left out does
    assert gate <= kth + 1, f"{name}: gate {gate} above the k-th key {kth} + 1"
    if not want.all():
        assert int(keys[~want].max()) < gate, f"{name}: gate {gate} lets in a key the tile left out"
