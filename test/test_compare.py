"""Comparing outputs (:mod:`indexer_topk.compare`): the bitwise rule between kernels and the
tolerant rule against the fp64 reference, on hand-built results and one real workload."""

import pytest
import torch

from indexer_topk import compare
import dataclasses

from indexer_topk.contract import HEAD_DIM, PAGE_SIZE, IndexerTopKResult, order_keys
from indexer_topk.reference import reference_indexer_topk, reference_scores, reference_with_next_values
from indexer_topk.workload import make_workload


def result(values, raw, counts, page=None):
    """An IndexerTopKResult from per-row lists; physical = page * 64 + raw (page 7 by default)."""
    v = torch.tensor(values, dtype=torch.float32)
    r = torch.tensor(raw, dtype=torch.int32)
    pg = 7 if page is None else page
    p = torch.where(r >= 0, r + pg * 64, torch.full_like(r, -1))
    return IndexerTopKResult(v, r, p, torch.tensor(counts, dtype=torch.int32))


NEG = float("-inf")


def test_identical_results_match():
    a = result([[3.0, 2.0, 1.0], [5.0, NEG, NEG]], [[4, 0, 9], [2, -1, -1]], [3, 1])
    c = compare.compare_to_reference(a, a)
    assert c.ok and c.summary() == "ok"
    assert compare.bitwise_equal(a, a)


def test_values_within_tolerance_match_and_beyond_do_not():
    e = result([[1000.0, 2.0]], [[1, 0]], [2])
    near = result([[1000.0 * (1 + 5e-6), 2.0]], [[1, 0]], [2])
    far = result([[1000.0 * (1 + 5e-5), 2.0]], [[1, 0]], [2])
    assert compare.compare_to_reference(near, e).ok
    assert not compare.bitwise_equal(near, e)
    c = compare.compare_to_reference(far, e)
    assert not c.ok and c.value_rows == [0] and "values" in c.summary()


def test_reordered_near_ties_inside_the_topk_match():
    e = result([[3.0, 2.0 + 1e-6, 2.0, 1.0]], [[0, 1, 2, 3]], [4])
    a = result([[3.0, 2.0 + 1e-6, 2.0, 1.0]], [[0, 2, 1, 3]], [4])
    assert compare.compare_to_reference(a, e).ok


def scored_row(scores, topk=2):
    """A one-row sglang_fp8 workload whose position ``j`` scores ``scores[j]`` (to fp32 rounding):
    every key is the same, and each key's fp32 scale is multiplied to give its score."""
    w = make_workload("sglang_fp8", context_tokens=[4 * len(scores)], rows_per_request=[1], topk=topk, seed=3,
                      pattern="equal")
    assert int(w.seq_lens[0]) == len(scores)
    base = reference_scores(*w.args(), layout=w.layout, weight_scale=w.weight_scale)[0].double()
    k_cache = w.k_cache.clone()
    key_scales = k_cache.view(k_cache.shape[0], -1).view(torch.float32)[:, PAGE_SIZE * HEAD_DIM // 4 :]
    for j, target in enumerate(scores):
        page, off = int(w.page_table[0, j // PAGE_SIZE]), j % PAGE_SIZE
        key_scales[page, off] = float(key_scales[page, off]) * (target / float(base[j]))
    return dataclasses.replace(w, k_cache=k_cache)


def listing(w, raw, values):
    """A result for the one-row workload ``w`` listing positions ``raw`` with ``values``."""
    return result([values], [raw], [len(raw)], page=int(w.page_table[0, 0]))


# position:    0    1    2    3    4    5
TIED_ROW = [1.0, 7.0, 0.5, 5.0, 5.0, 0.1]  # top 2: 1 and 3; the cut 5.0 ties with position 4


def test_boundary_near_tie_is_accepted_with_the_next_value_and_the_inputs():
    # Reference: k-th score 5.0 at position 3; position 4 ties with it.
    w = scored_row(TIED_ROW)
    expected, next_values = reference_with_next_values(*w.args(), **w.kwargs())
    assert expected.raw_indices.tolist() == [[1, 3]] and float(next_values[0]) == pytest.approx(5.0)
    swapped = listing(w, [1, 4], expected.values[0].tolist())
    c = compare.compare_to_reference(swapped, expected, next_values=next_values, inputs=w)
    assert c.ok and c.near_tie_rows == [0] and "near-tie" in c.summary()
    # Without the (k+1)-th value, with a clear gap, or without the inputs to score the listed
    # position, it is a wrong selection.
    assert compare.compare_to_reference(swapped, expected, inputs=w).set_rows == [0]
    c = compare.compare_to_reference(swapped, expected, next_values=torch.tensor([1.5]), inputs=w)
    assert not c.ok and c.set_rows == [0] and "[4]" in c.messages[0] and "[3]" in c.messages[0]
    c = compare.compare_to_reference(swapped, expected, next_values=next_values)
    assert not c.ok and c.set_rows == [0] and "inputs" in c.messages[0]


def test_boundary_near_tie_checks_each_listed_positions_own_score():
    """In a row whose k-th and (k+1)-th reference scores tie at 5.0, a kernel that lists
    position 5 (true score 0.1) with the cut's value is wrong, as is one that leaves out
    position 1 (score 7.0) for the tied position 4, or lists position 4 with a wrong score."""
    w = scored_row(TIED_ROW)
    expected, next_values = reference_with_next_values(*w.args(), **w.kwargs())
    values = expected.values[0].tolist()
    far = compare.compare_to_reference(listing(w, [1, 5], values), expected, next_values=next_values, inputs=w)
    assert not far.ok and far.set_rows == [0] and far.near_tie_rows == []
    assert "position 5" in far.messages[0] and "0.1" in far.messages[0]
    dropped = compare.compare_to_reference(listing(w, [3, 4], values), expected, next_values=next_values, inputs=w)
    assert not dropped.ok and dropped.set_rows == [0] and "position 1" in dropped.messages[0]
    # position 4 listed first, with position 1's score: the sorted values still agree
    claimed = compare.compare_to_reference(listing(w, [4, 1], values), expected, next_values=next_values, inputs=w)
    assert not claimed.ok and claimed.set_rows == [0] and "position 4 listed with" in claimed.messages[0]


def test_boundary_near_tie_still_needs_valid_positions():
    w = scored_row(TIED_ROW)
    expected, next_values = reference_with_next_values(*w.args(), **w.kwargs())
    values = expected.values[0].tolist()
    out_of_range = listing(w, [1, 40], values)
    repeated = listing(w, [1, 1], values)
    assert not compare.compare_to_reference(out_of_range, expected, next_values=next_values, inputs=w).ok
    assert not compare.compare_to_reference(repeated, expected, next_values=next_values, inputs=w).ok


def test_inputs_must_be_indexer_inputs():
    e = result([[3.0, 2.0]], [[1, 5]], [2])
    with pytest.raises(ValueError, match="^inputs: "):
        compare.compare_to_reference(e, e, inputs=(1, 2))


def test_nan_matches_nan_only():
    e = result([[float("nan"), float("nan")]], [[0, 1]], [2])
    same = result([[float("nan"), float("nan")]], [[0, 1]], [2])
    number = result([[1.0, float("nan")]], [[0, 1]], [2])
    assert compare.compare_to_reference(same, e).ok
    assert compare.bitwise_equal(same, e)
    assert compare.compare_to_reference(number, e).value_rows == [0]
    # A NaN boundary (all-NaN row) counts as a near-tie; a number there does not.
    w = scored_row([float("nan")] * 3 + [1.0])
    e, next_values = reference_with_next_values(*w.args(), **w.kwargs())
    assert e.raw_indices.tolist() == [[3, 0]] and bool(torch.isnan(next_values[0]))
    moved = listing(w, [3, 2], e.values[0].tolist())
    assert compare.compare_to_reference(moved, e, next_values=next_values, inputs=w).ok


def test_bitwise_equal_separates_signed_zeros():
    a = result([[0.0]], [[0]], [1])
    b = result([[-0.0]], [[0]], [1])
    assert compare.compare_to_reference(a, b).ok
    assert not compare.bitwise_equal(a, b)


def test_count_padding_and_physical_mismatches():
    e = result([[3.0, NEG]], [[4, -1]], [1])
    c = compare.compare_to_reference(result([[3.0, 2.0]], [[4, 0]], [2]), e)
    assert c.count_rows == [0] and not c.ok
    c = compare.compare_to_reference(result([[3.0, NEG]], [[4, 0]], [1]), e)
    assert c.padding_rows == [0] and not c.ok
    c = compare.compare_to_reference(result([[3.0, NEG]], [[4, -1]], [1], page=9), e)
    assert c.physical_rows == [0] and not c.ok
    # Against the page table: page 7 holds positions 0..63 of the row.
    pt = torch.tensor([[7, 2]], dtype=torch.int32)
    assert compare.compare_to_reference(e, e, page_table=pt).ok
    assert not compare.compare_to_reference(e, e, page_table=torch.tensor([[3, 2]], dtype=torch.int32)).ok


def test_reference_next_values_are_the_next_best_scores():
    w = make_workload("sglang_mxfp4", context_tokens=[2300, 1000], rows_per_request=[2, 1], topk=512, seed=5)
    expected, next_values = reference_with_next_values(*w.args(), **w.kwargs())
    assert compare.bitwise_equal(expected, reference_indexer_topk(*w.args(), **w.kwargs()))
    scores = reference_scores(*w.args(), layout=w.layout, weight_scale=w.weight_scale)
    for r in range(w.rows):
        n = int(w.seq_lens[r])
        if n <= w.topk:
            assert next_values[r] == NEG
            continue
        pos = torch.arange(n)
        keys = order_keys(scores[r, :n], pos)
        kth_next = int(keys.argsort(descending=True)[w.topk])
        assert torch.equal(next_values[r].view(torch.int32), scores[r, kth_next].view(torch.int32))
    assert compare.compare_to_reference(expected, expected, next_values=next_values, seq_lens=w.seq_lens, page_table=w.page_table).ok


def test_comparison_rule_text_states_the_tolerance():
    text = compare.comparison_rule(1e-5, 1e-6)
    assert "1e-05" in text and "1e-06" in text and "near-tie" in text


def test_fp8_gpu_tolerance_scales_with_the_row():
    """On a GPU the FP8 rule adds 2e-3 of the row's largest score; elsewhere fp32 rounding."""
    from indexer_topk.compare import compare_to_reference, mma_tolerance

    vals = torch.tensor([[3.0, 0.02017], [3.0, 0.02017]])
    raw = torch.tensor([[5, 9], [5, 9]], dtype=torch.int32)
    exp = IndexerTopKResult(vals, raw, raw, torch.tensor([2, 2], dtype=torch.int32))
    got = IndexerTopKResult(torch.tensor([[3.001, 0.02040], [3.0, 0.02040 + 0.01]]), raw, raw, exp.counts)
    cpu = mma_tolerance("sglang_fp8", "cpu", exp)
    assert not compare_to_reference(got, exp, **cpu).ok
    assert mma_tolerance("sglang_mxfp4", "cuda", exp) == cpu
    cmp = compare_to_reference(got, exp, **mma_tolerance("sglang_fp8", "cuda", exp))
    assert cmp.value_rows == [1]  # row 0 within 2e-3 * 3.0 of the reference; row 1 is 1e-2 off


def test_tolerance_overrides_replace_the_rule():
    """A caller's rtol replaces the layout's rule; its atol is the floor of the FP8 per-row tolerance."""
    from indexer_topk.compare import comparison_rule, mma_tolerance

    vals = torch.tensor([[3.0, 0.5], [1e-6, 0.0]])
    raw = torch.tensor([[5, 9], [5, 9]], dtype=torch.int32)
    exp = IndexerTopKResult(vals, raw, raw, torch.tensor([2, 2], dtype=torch.int32))
    assert mma_tolerance("sglang_fp8", "cuda", exp, rtol=0.1, atol=0.5) == {"rtol": 0.1, "atol": 0.5}
    assert mma_tolerance("sglang_mxfp4", "cpu", exp, atol=0.25) == {"rtol": compare.DEFAULT_RTOL, "atol": 0.25}
    per_row = mma_tolerance("sglang_fp8", "cuda", exp, atol=1e-3)["atol"]
    assert per_row.tolist() == pytest.approx([compare.FP8_MMA_RTOL * 3.0, 1e-3])
    assert "sglang_fp8 on a GPU" in comparison_rule(device="cuda")
    assert "sglang_fp8 on a GPU" not in comparison_rule(1e-3, device="cuda") + comparison_rule(device="cpu")




@pytest.mark.parametrize("bad, field", [
    (dict(rtol=None), "rtol"), (dict(atol=None), "atol"),
    (dict(atol=torch.full((3,), 1e-6)), "atol"),  # one per row of two rows
    (dict(atol=torch.full((2, 1), 1e-6)), "atol"),  # neither per row nor per slot
    (dict(atol=torch.full((2, 2, 1), 1e-6)), "atol"),
])
def test_tolerances_it_cannot_apply_are_refused_by_name(bad, field):
    """``None`` (``mma_tolerance``'s "not given", not a tolerance) and per-row tolerances of
    another length than the rows: a ``ValueError`` naming the argument, not a traceback from
    the arithmetic."""
    vals = torch.tensor([[3.0, 0.5], [1.0, 0.0]])
    raw = torch.tensor([[5, 9], [5, 9]], dtype=torch.int32)
    exp = IndexerTopKResult(vals, raw, raw, torch.tensor([2, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match=f"^{field}: "):
        compare.compare_to_reference(exp, exp, **bad)
    assert compare.compare_to_reference(exp, exp, atol=torch.full((2,), 1e-6)).ok
    assert compare.compare_to_reference(exp, exp, atol=torch.full((2, 2), 1e-6)).ok  # one per slot


@pytest.mark.parametrize("topk", [0, -1, 2.5, True, "512"])
def test_reference_refuses_a_topk_that_is_not_a_positive_int(topk):
    w = make_workload("sglang_fp8", context_tokens=[300], rows_per_request=[1], topk=512, seed=3, device="cpu")
    with pytest.raises(ValueError, match="^topk: "):
        reference_indexer_topk(*w.args(), **{**w.kwargs(), "topk": topk})


def test_a_page_table_without_columns_compares():
    """A valid call whose page table has no columns (every row empty): its outputs compare equal
    to themselves, where the physical-index check indexed a column that is not there."""
    w = make_workload("sglang_fp8", context_tokens=[2048], rows_per_request=[2], topk=512, seed=5, device="cpu")
    w = dataclasses.replace(w, page_table=torch.empty((2, 0), dtype=torch.int32),
                            seq_lens=torch.zeros(2, dtype=torch.int32))
    e = reference_indexer_topk(*w.args(), **w.kwargs())
    assert compare.compare_to_reference(e, e, inputs=w).ok


def _cancelling(layout, excess=1e-2, seed=1, mirror=False, device="cpu", tokens=4096, rows=3, topk=512):
    """A workload at weight_scale 1 whose heads 32-63 take the negated weights of heads 0-31
    (times ``1 + excess``): each score is a small remainder of terms far larger than itself;
    with ``mirror`` their queries too, so that the scores are ``excess`` of the first half's."""
    w = make_workload(layout, context_tokens=[tokens], rows_per_request=rows, topk=topk, seed=seed, weight_scale=1.0,
                      device=device)
    wt, q = w.weights.clone(), w.q.clone()
    wt[:, 32:] = -wt[:, :32] * (1 + excess)
    if mirror:
        q[:, 32:] = q[:, :32]
    return dataclasses.replace(w, weights=wt, q=q)


def _fp32_at(w, exp):
    """What an exact fp32 kernel lists: the reference's positions, each scored in fp32 arithmetic
    (dequantised values, fp32 dots, an fp32 sum over heads) rather than in fp64."""
    from indexer_topk.formats import dequantize_query, read_k_cache

    raw = exp.raw_indices.long().clamp(min=0)
    slots = torch.gather(w.page_table.long(), 1, raw // PAGE_SIZE) * PAGE_SIZE + raw % PAGE_SIZE
    k, ks = read_k_cache(w.layout, w.k_cache, w.k_scale, slots)  # [rows, topk, 128]
    q = dequantize_query(w.layout, w.q, w.q_scale)
    s = (torch.relu(torch.einsum("rbd,rhd->rbh", k, q)) * w.weights.float()[:, None, :]).sum(-1) * ks
    s = torch.where(exp.raw_indices >= 0, s * w.weight_scale, exp.values)
    return IndexerTopKResult(s, exp.raw_indices, exp.physical_indices, exp.counts)


@pytest.mark.parametrize("layout", ["sglang_fp8", "sglang_mxfp4", "aiter_mxfp4"])
def test_rows_whose_heads_cancel_are_judged_by_their_terms(layout):
    """fp32 rounding scales with the terms summed, not with the score they leave: on rows whose
    heads cancel an exact fp32 computation misses the default rtol, and the per-slot tolerance
    from the inputs accepts it; twice that tolerance is still a mismatch."""
    w = _cancelling(layout)
    exp, next_values = reference_with_next_values(*w.args(), **w.kwargs())
    got = _fp32_at(w, exp)
    assert not torch.equal(got.values, exp.values)
    assert compare.compare_to_reference(got, exp, next_values=next_values, inputs=w).value_rows
    tol = compare.mma_tolerance(layout, "cpu", exp, inputs=w)
    assert tol["rtol"] == compare.DEFAULT_RTOL and tol["atol"].shape == exp.values.shape
    cmp = compare.compare_to_reference(got, exp, next_values=next_values, inputs=w, **tol)
    assert cmp.ok, cmp.summary()
    magnitudes = compare.slot_magnitudes(exp, w)
    assert bool((magnitudes[:, 0] > 5 * exp.values[:, 0].double().abs()).all())  # they do cancel
    off = IndexerTopKResult(got.values.clone(), *got[1:])
    off.values[1, 7] = float(exp.values[1, 7].double() + 2 * (tol["atol"][1, 7] + compare.DEFAULT_RTOL * exp.values[1, 7].abs()))
    assert compare.compare_to_reference(off, exp, next_values=next_values, inputs=w, **tol).value_rows == [1]
    assert "ulps" in compare.comparison_rule(magnitudes=True) and "ulps" not in compare.comparison_rule()


def _sign_cleared(w):
    """``w`` with every sign of its stored values cleared (queries, keys, weights, weight_scale):
    every dot is then at least 0, so a score is its own absolute-term sum."""
    from indexer_topk.contract import Layout

    cache, q = w.k_cache.clone(), w.q.clone()
    if w.layout is Layout.SGLANG_FP8:
        cache[:, : PAGE_SIZE * HEAD_DIM] &= 0x7F  # the e4m3 key bytes; their fp32 scales are positive
        q = (q.view(torch.uint8) & 0x7F).view(q.dtype)
    else:  # sglang_mxfp4: the e2m1 nibbles' sign bits, in the keys' payload and the query
        cache[:, : PAGE_SIZE * HEAD_DIM // 2] &= 0x77
        q &= 0x77
    return dataclasses.replace(w, q=q, k_cache=cache, weights=w.weights.abs(), weight_scale=abs(w.weight_scale))


@pytest.mark.parametrize("layout", ["sglang_fp8", "sglang_mxfp4"])
def test_magnitudes_are_scores_of_absolute_values_over_the_heads_relu_keeps(layout):
    """reference_magnitudes equals the reference's score of the call with every sign cleared
    (then relu changes nothing), to fp32 rounding; heads whose dots are negative add nothing,
    so with half the heads' queries negated the magnitudes are the other half's scores."""
    from indexer_topk.reference import reference_magnitudes

    w = _sign_cleared(make_workload(layout, context_tokens=[1024, 640], rows_per_request=2, seed=3, weight_scale=-0.5))
    rows = torch.arange(w.rows)
    positions = torch.stack([torch.arange(-2, 300), torch.arange(100, 402)] * 2)
    inside = (positions >= 0) & (positions < w.seq_lens[:, None].long())

    def scores(v):
        s = torch.stack([reference_scores(*v.args(), layout=v.layout, weight_scale=v.weight_scale,
                                          rows=rows[r : r + 1], start=0, stop=402)[0] for r in range(v.rows)])
        s = torch.gather(torch.where(torch.isfinite(s), s, 0.0).double(), 1, positions.clamp(min=0))
        return torch.where(inside, s, 0.0)

    def magnitudes(v):
        return reference_magnitudes(*v.args(), layout=v.layout, weight_scale=v.weight_scale, rows=rows,
                                    positions=positions)

    assert bool((scores(w) > 0).any())
    torch.testing.assert_close(magnitudes(w), scores(w), rtol=1e-6, atol=0.0)
    negated = w.q.clone()
    if w.layout.value == "sglang_fp8":
        negated[:, 32:] = (negated[:, 32:].view(torch.uint8) | 0x80).view(negated.dtype)
    else:
        negated[:, 32:] |= 0x88
    half = w.weights.clone()
    half[:, 32:] = 0
    torch.testing.assert_close(magnitudes(dataclasses.replace(w, q=negated)),
                               scores(dataclasses.replace(w, weights=half)), rtol=1e-6, atol=0.0)


def test_a_row_is_judged_at_its_own_widest_tolerance():
    """Two rows, one with scores a thousand times the other's, whose heads cancel to 1e-5 of
    their terms: its tolerance stops at its own widest (1e-2 of its own best score), not the
    call's, so a selection from the bottom of that row is still a mismatch."""
    w = _cancelling("sglang_fp8", excess=1e-5, mirror=True)
    wt = w.weights.clone()
    wt[0] = w.weights[0].abs() * 1000  # row 0: large scores, no cancellation
    w = dataclasses.replace(w, weights=wt)
    exp, next_values = reference_with_next_values(*w.args(), **w.kwargs())
    tol = compare.mma_tolerance("sglang_fp8", "cpu", exp, inputs=w)
    best = exp.values.double().abs().amax(dim=1)
    assert bool((tol["atol"] <= compare.MAX_RELATIVE_TOLERANCE * best[:, None] + 1e-12).all())
    assert float(tol["atol"][1].max()) == pytest.approx(compare.MAX_RELATIVE_TOLERANCE * float(best[1]))
    n = w.topk
    every = reference_indexer_topk(*w.args(), **{**w.kwargs(), "topk": int(w.seq_lens[1])})
    bottom = IndexerTopKResult(*(t.clone() for t in exp))
    for t, src in zip(bottom[:3], every[:3]):
        t[1] = src[1, -n:]  # row 1's worst n positions, none of them the reference's
    assert compare.compare_to_reference(bottom, exp, next_values=next_values, inputs=w, **tol).set_rows == [1]


def test_cancellation_and_empty_calls_need_no_error():
    """Heads that cancel to 1e-6 of their terms would need a tolerance wider than any selection
    can be judged by: a row's tolerance stops at its widest, with no error raised; NaN rows add
    nothing; a call with no page reads none."""
    w = _cancelling("sglang_fp8", excess=1e-6, mirror=True)
    exp = reference_indexer_topk(*w.args(), **w.kwargs())
    tol = compare.mma_tolerance("sglang_fp8", "cpu", exp, inputs=w)
    limit = compare.MAX_RELATIVE_TOLERANCE * exp.values.double().abs().amax(dim=1)
    assert torch.allclose(tol["atol"].amax(dim=1), limit)
    assert compare.compare_to_reference(exp, exp, inputs=w, **tol).ok
    nan = make_workload("sglang_fp8", context_tokens=[1024], rows_per_request=2, pattern="nan_rows")
    nan_exp = reference_indexer_topk(*nan.args(), **nan.kwargs())
    assert bool(torch.isfinite(compare.mma_tolerance("sglang_fp8", "cpu", nan_exp, inputs=nan)["atol"]).all())
    for layout in ("sglang_fp8", "aiter_mxfp4"):
        empty = make_workload(layout, context_tokens=[0, 0], rows_per_request=1)
        empty = dataclasses.replace(empty, k_cache=empty.k_cache[:0],
                                    k_scale=None if empty.k_scale is None else empty.k_scale[:0],
                                    page_table=empty.page_table[:, :0])
        e = reference_indexer_topk(*empty.args(), **empty.kwargs())
        assert float(compare.mma_tolerance(layout, "cpu", e, inputs=empty)["atol"].max()) == compare.DEFAULT_ATOL


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["sglang_fp8", "sglang_mxfp4", "aiter_mxfp4"])
def test_gpu_kernels_on_rows_whose_heads_cancel(layout, device):
    """On the GPU's MMAs, rows whose heads cancel (scores 5-30 times smaller than their terms):
    legacy and fused agree bit for bit and hold to the reference under mma_tolerance with the
    inputs (Hopper's fp8 accumulator is the one whose margin is not measured elsewhere)."""
    from kernel_cases import assert_bitwise

    import indexer_topk

    w = _cancelling(layout, device=device, tokens=65536, rows=8, topk=1024)
    exp, next_values = reference_with_next_values(*w.args(), **w.kwargs())
    legacy = indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="legacy")
    fused = indexer_topk.indexer_topk(*w.args(), **w.kwargs(), backend="fused")
    assert_bitwise(fused, legacy, "fused vs legacy")
    tol = compare.mma_tolerance(layout, device, exp, inputs=w)
    cmp = compare.compare_to_reference(legacy, exp, next_values=next_values, inputs=w, **tol)
    assert cmp.ok, f"{cmp.summary()}; " + "; ".join(cmp.messages)
