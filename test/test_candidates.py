"""The candidate-buffer helpers (``kernels/candidates.py``) on buffers in arbitrary order.

Under the interpreter the fused kernel's atomics claim slots in lane order, so these tests feed
the cut and the reordering shuffled, tie-heavy buffers directly: the cut must keep the best
``TOPK`` by (key, position) whatever the storage order, and its gate must let in exactly the
entries that beat the ``TOPK``-th.
"""

import pytest
import torch
import triton
import triton.language as tl

from indexer_topk.kernels.candidates import beats_gate, cut, order_by_position

import kernel_cases as kc


@triton.jit
def _cut_kernel(key_ptr, pos_ptr, gate_ptr, count, TOPK: tl.constexpr, TILE: tl.constexpr):
    gk, gp = cut(key_ptr, pos_ptr, count, TOPK, TILE)
    tl.store(gate_ptr, gk)
    tl.store(gate_ptr + 1, gp)


@triton.jit
def _beats_kernel(key_ptr, pos_ptr, out_ptr, gate_key, gate_pos, N: tl.constexpr):
    offs = tl.arange(0, N)
    key = tl.load(key_ptr + offs)
    pos = tl.load(pos_ptr + offs)
    tl.store(out_ptr + offs, beats_gate(key, pos, gate_key, gate_pos).to(tl.int32))


@triton.jit
def _order_kernel(key_ptr, pos_ptr, count, TOPK: tl.constexpr):
    order_by_position(key_ptr, pos_ptr, count, TOPK)


def _buffer(count, cap, keys_from, seed):
    g = torch.Generator().manual_seed(seed)
    if keys_from == "ties":
        keys = torch.randint(-4, 5, (count,), generator=g, dtype=torch.int32)
    else:  # the whole int32 range: every radix pass runs
        keys = torch.randint(-(2**31) + 1, 2**31 - 1, (count,), generator=g, dtype=torch.int64).to(torch.int32)
    pos = torch.randperm(50_000, generator=g)[:count].to(torch.int32)
    key_buf = torch.full((cap,), kc.INDEX_SENTINEL, dtype=torch.int32)
    pos_buf = torch.full((cap,), kc.INDEX_SENTINEL, dtype=torch.int32)
    key_buf[:count], pos_buf[:count] = keys, pos
    return key_buf, pos_buf


def _order(entries):
    """The contract's order: higher key first, then the lower position."""
    return sorted(entries, key=lambda e: (-e[0], e[1]))


@pytest.mark.parametrize("keys_from", ["ties", "full_range"])
@pytest.mark.parametrize("count", [65, 200, 256])
def test_cut_of_a_shuffled_buffer(count, keys_from):
    topk, tile = 64, 256
    key_buf, pos_buf = _buffer(count, tile, keys_from, seed=count)
    entries = list(zip(key_buf[:count].tolist(), pos_buf[:count].tolist()))
    gate = torch.zeros(2, dtype=torch.int32)
    _cut_kernel[(1,)](key_buf, pos_buf, gate, count, TOPK=topk, TILE=tile)
    best = _order(entries)[:topk]
    assert sorted(zip(key_buf[:topk].tolist(), pos_buf[:topk].tolist())) == sorted(best)
    # the gate is the topk-th entry itself: every dropped entry fails it, every kept one but
    # the gate meets it, and a newcomer passes exactly when it beats the topk-th
    assert tuple(gate.tolist()) == best[-1]
    keys = torch.tensor([e[0] for e in entries], dtype=torch.int32)
    pos = torch.tensor([e[1] for e in entries], dtype=torch.int32)
    padded = count if count & (count - 1) == 0 else 1 << count.bit_length()
    kp = torch.cat([keys, torch.full((padded - count,), -(2**31), dtype=torch.int32)])
    pp = torch.cat([pos, torch.zeros(padded - count, dtype=torch.int32)])
    passes = torch.zeros(padded, dtype=torch.int32)
    _beats_kernel[(1,)](kp, pp, passes, int(gate[0]), int(gate[1]), N=padded)
    want = [1 if e in best[:-1] else 0 for e in entries]
    assert passes[:count].tolist() == want


@pytest.mark.parametrize("count", [0, 1, 37, 64])
def test_order_by_position_of_a_shuffled_buffer(count):
    topk = 64
    key_buf, pos_buf = _buffer(count, topk, "ties", seed=100 + count)
    pairs = sorted(zip(pos_buf[:count].tolist(), key_buf[:count].tolist()))
    _order_kernel[(1,)](key_buf, pos_buf, count, TOPK=topk)
    assert list(zip(pos_buf[:count].tolist(), key_buf[:count].tolist())) == pairs
    assert bool((key_buf[count:] == kc.INDEX_SENTINEL).all()) and bool((pos_buf[count:] == kc.INDEX_SENTINEL).all())
