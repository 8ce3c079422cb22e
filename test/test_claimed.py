"""The claimed-slot helpers of stream mode 2 (``kernels/claimed.py``) on buffers in arbitrary
order: under the interpreter the fused kernel's atomics claim slots in lane order, so claim
order there equals position order; these tests feed the cut and the reordering shuffled
buffers directly, with many equal keys."""

import pytest
import torch
import triton
import triton.language as tl

from indexer_topk.backends import fused as fused_backend
from indexer_topk.kernels.claimed import cut_claimed, order_by_position

import kernel_cases as kc


@triton.jit
def _cut_kernel(key_ptr, pos_ptr, cnt_ptr, gate_ptr, count, gate, TOPK: tl.constexpr, CAP: tl.constexpr):
    tl.store(gate_ptr, cut_claimed(key_ptr, pos_ptr, cnt_ptr, count, gate, TOPK, CAP))


@triton.jit
def _order_kernel(key_ptr, pos_ptr, count, TOPK: tl.constexpr):
    order_by_position(key_ptr, pos_ptr, count, TOPK)


def _buffer(count, cap, keys_from, seed):
    g = torch.Generator().manual_seed(seed)
    if keys_from == "ties":
        keys = torch.randint(-4, 5, (count,), generator=g, dtype=torch.int32)
    else:  # the whole int32 range: every radix pass runs
        keys = torch.randint(-(2**31), 2**31 - 1, (count,), generator=g, dtype=torch.int64).to(torch.int32)
    pos = torch.randperm(50_000, generator=g)[:count].to(torch.int32)
    key_buf = torch.full((cap,), kc.INDEX_SENTINEL, dtype=torch.int32)
    pos_buf = torch.full((cap,), kc.INDEX_SENTINEL, dtype=torch.int32)
    key_buf[:count], pos_buf[:count] = keys, pos
    return key_buf, pos_buf


def _best(keys, pos, k):
    """The top k (key, position) pairs: higher key first, then the lower position."""
    order = sorted(zip(keys.tolist(), pos.tolist()), key=lambda e: (-e[0], e[1]))
    return order[:k]


@pytest.mark.parametrize("keys_from", ["ties", "full_range"])
@pytest.mark.parametrize("count", [65, 200, 256])
def test_cut_of_a_shuffled_buffer(count, keys_from):
    topk, cap, old_gate = 64, 256, -(2**31)  # the lowest gate: the cut alone raises it
    key_buf, pos_buf = _buffer(count, cap, keys_from, seed=count)
    keys, pos = key_buf[:count].clone(), pos_buf[:count].clone()
    counter = torch.tensor([count], dtype=torch.int32)
    gate = torch.zeros(1, dtype=torch.int32)
    _cut_kernel[(1,)](key_buf, pos_buf, counter, gate, count, old_gate, TOPK=topk, CAP=cap)
    best = _best(keys, pos, topk)
    assert sorted(zip(key_buf[:topk].tolist(), pos_buf[:topk].tolist())) == sorted(best)
    assert int(counter) == topk
    # the gate rises above every dropped key (none of them could have entered later either) and
    # never past the k-th key plus one (a later, higher position needs to beat the k-th strictly)
    kth = best[-1][0]
    dropped = set(zip(keys.tolist(), pos.tolist())) - set(best)
    assert max(key for key, _ in dropped) < int(gate) <= kth + 1
    # a gate already above the cut's stays: gates only rise
    key_buf, pos_buf = _buffer(count, cap, keys_from, seed=count)
    counter.fill_(count)
    _cut_kernel[(1,)](key_buf, pos_buf, counter, gate, count, kth + 1, TOPK=topk, CAP=cap)
    assert int(gate) == kth + 1


@pytest.mark.parametrize("count", [0, 1, 37, 64])
def test_order_by_position_of_a_shuffled_buffer(count):
    topk = 64
    key_buf, pos_buf = _buffer(count, topk, "ties", seed=100 + count)
    pairs = sorted(zip(pos_buf[:count].tolist(), key_buf[:count].tolist()))
    _order_kernel[(1,)](key_buf, pos_buf, count, TOPK=topk)
    assert list(zip(pos_buf[:count].tolist(), key_buf[:count].tolist())) == pairs
    assert bool((key_buf[count:] == kc.INDEX_SENTINEL).all()) and bool((pos_buf[count:] == kc.INDEX_SENTINEL).all())


def test_claimed_mode_refuses_a_triton_without_atomic_return_broadcast(monkeypatch):
    """On a GPU Triton older than 3.5, stream mode 2 raises before any kernel runs."""
    wl = kc.build(kc.edge_length_case("sglang_fp8"), "cpu")
    monkeypatch.setattr(fused_backend, "interpreting", lambda: False)
    monkeypatch.setattr(fused_backend, "TRITON_VERSION", (3, 4))
    monkeypatch.setattr(fused_backend, "fused_topk_kernel", None)  # any launch would fail loudly
    with pytest.raises(ValueError, match="stream_mode: 2 needs Triton >= 3.5"):
        kc.run_fused(wl, stream_mode=2)
