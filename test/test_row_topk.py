"""The one-read row select (kernels/row_topk.py) against the other ways of the legacy select stage.

``legacy_select`` takes it by default from 128 rows; these tests force it (``KTH_SEARCH =
"rows"``) on small matrices, with a small tile and sample under the interpreter so that rows
span many tiles, and compare every output bit for bit with the ``torch`` way (torch.topk's
k-th key, then the select pass), on the patterns a sampled gate and a bounded pool can get
wrong: scores rising or falling along the row, ties everywhere, spikes exactly where the sample
reads (its gate lets too few keys in, so the row is scanned again), NaN keys, and lengths
around ``topk``, zero and past the matrix. Outputs are poisoned first, so every slot must be
written. The legacy path end to end is checked against the fp64 reference with it as well.
"""

import pytest
import torch
import triton
import triton.language as tl

from indexer_topk.backends import legacy as legacy_backend
from indexer_topk.contract import KEY_NAN, KEY_NONE, allocate_result, ordered_score_bits
from indexer_topk.guards import poisoned_result, unwritten_slots
from indexer_topk.kernels.row_topk import finalize_row_binned

from kernel_cases import assert_contract, assert_matches_reference, build, pattern_cases, reference_result, run_legacy

TOPK = 512


def force_way(monkeypatch, device, way: str, **cpu_settings):
    """``legacy_select`` takes ``way`` for the test; on a CPU the module settings given too
    (small enough for the interpreter)."""
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", way)
    if device == "cpu":
        for name, value in cpu_settings.items():
            monkeypatch.setattr(legacy_backend, name, value)
    return legacy_backend


@pytest.fixture
def rows_way(monkeypatch, device):
    """The row select with a tile and sample small enough to give many tiles to a short row."""
    return force_way(monkeypatch, device, "rows", ROWS_TILE=1024, ROWS_SAMPLE=512)


def page_table_for(rows: int, width: int, device):
    """A page table naming distinct pages, last page first (no position's page is its own)."""
    return torch.arange(rows * (width // 64), dtype=torch.int32, device=device).view(rows, -1).flip(1).contiguous()


def key_matrix(pattern: str, lens, width: int, device, seed: int = 0):
    """int32 order keys ``[len(lens), width]`` as the score stage leaves them (``KEY_NONE``
    past each row's length)."""
    gen = torch.Generator().manual_seed(seed)
    rows = len(lens)
    pos = torch.arange(width)
    if pattern == "random":
        keys = torch.randint(-(2**31) + 2, 2**31 - 1, (rows, width), generator=gen, dtype=torch.int32)
    elif pattern == "scores":  # the keys of fp32 scores spread as an indexer's are
        keys = ordered_score_bits(torch.randn((rows, width), generator=gen) * 8)
    elif pattern == "increasing":
        keys = (pos * 3 - 5000).to(torch.int32).repeat(rows, 1)
    elif pattern == "decreasing":
        keys = (-pos).to(torch.int32).repeat(rows, 1)
    elif pattern == "ties":
        keys = torch.randint(0, 3, (rows, width), generator=gen, dtype=torch.int32)
    elif pattern == "nan":  # NaN keys (below every number) among a few numbers
        keys = torch.full((rows, width), KEY_NAN, dtype=torch.int32)
        keys[:, ::7] = torch.randint(0, 100, (rows, width), generator=gen, dtype=torch.int32)[:, ::7]
    elif pattern == "spikes":  # the keys the sample reads beat every other key, each a new best:
        # the sampled gates let fewer than topk in, so the row is scanned again, then without one
        keys = torch.randint(0, 1000, (rows, width), generator=gen, dtype=torch.int32)
        sample = legacy_backend.ROWS_SAMPLE
        for r, n in enumerate(lens):
            if n > sample:
                keys[r, (torch.arange(sample) * n) // sample] = 10**6 + torch.arange(sample, dtype=torch.int32)
    else:
        raise ValueError(pattern)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    keys[pos[None, :] >= lens_t[:, None].clamp(min=0).long()] = KEY_NONE
    return keys.to(device), lens_t.to(device)


def select(keys, lens, topk, way, monkeypatch):
    rows, width = keys.shape
    out = poisoned_result(rows, topk, keys.device)
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", way)
    legacy_backend.legacy_select(keys, lens, page_table_for(rows, width, keys.device), topk=topk, out=out)
    return out


def assert_same_bits(got, want):
    for name, a, b in zip(got._fields, got, want):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), name


@pytest.mark.parametrize("pattern", ["random", "scores", "increasing", "decreasing", "ties", "nan", "spikes"])
def test_rows_equal_torch_way(pattern, rows_way, monkeypatch, device):
    """Rows of many tiles, one tile, exactly topk and fewer: the same four outputs, every slot."""
    width = 4160
    lens = [width, width - 1, 1100, TOPK + 1, TOPK, TOPK - 1, 1, 0]
    keys, lens_t = key_matrix(pattern, lens, width, device)
    got = select(keys, lens_t, TOPK, "rows", monkeypatch)
    assert unwritten_slots(got) == []
    assert_same_bits(got, select(keys, lens_t, TOPK, "torch", monkeypatch))


def test_rows_lengths_past_the_matrix(rows_way, monkeypatch, device):
    """Unchecked lengths below zero or past the matrix's width read no further than the row: the
    row select gives what the torch way gives (both clamp to the row)."""
    width = 1280
    keys, _ = key_matrix("random", [width] * 3, width, device, seed=3)
    lens = torch.tensor([-5, width + 999, 2**31 - 1], dtype=torch.int32, device=device)
    got = select(keys, lens, TOPK, "rows", monkeypatch)
    assert unwritten_slots(got) == []
    assert got.counts.tolist() == [0, TOPK, TOPK]
    assert_same_bits(got, select(keys, lens, TOPK, "torch", monkeypatch))


def test_rows_topk_1024_and_more_rows_than_programs(rows_way, monkeypatch, device):
    """topk 1024 over more rows than the persistent grid has programs (each program takes
    several rows in turn and reuses its pool)."""
    width = 2560
    lens = [width - 13 * i for i in range(11)]
    keys, lens_t = key_matrix("random", lens, width, device, seed=5)
    got = select(keys, lens_t, 1024, "rows", monkeypatch)
    assert unwritten_slots(got) == []
    assert_same_bits(got, select(keys, lens_t, 1024, "torch", monkeypatch))


@pytest.mark.parametrize("topk", [512, 1024])
def test_rows_write_only_their_outputs(topk, rows_way, monkeypatch, device):
    """Output rows beside the selected ones (``row_start``) and the key matrix stay untouched,
    also where rows longer than the tile are at most ``2 * topk`` keys (the pools' size)."""
    width = 2048
    keys, lens = key_matrix("ties", [width, 700], width, device, seed=7)
    before = keys.clone()
    out = allocate_result(5, topk, device)
    for t in out:
        t.view(torch.int32).fill_(0x5A5A5A5A)
    page_table = torch.zeros((5, width // 64), dtype=torch.int32, device=device)
    full_lens = torch.tensor([0, 0, width, 700, 0], dtype=torch.int32, device=device)
    legacy_backend.legacy_select(keys, full_lens, page_table, topk=topk, out=out, row_start=2)
    assert torch.equal(keys, before)
    for t in out:
        rows = t.view(torch.int32)
        for r in (0, 1, 4):
            assert bool((rows[r] == 0x5A5A5A5A).all())
        assert not bool((rows[2:4] == 0x5A5A5A5A).any())


def expected_order(keys, lens, topk):
    """Each row's selection as plain torch orders it: the best ``min(n, topk)`` keys, keys
    descending then positions ascending (a stable sort), ascending positions for rows of at
    most ``topk``."""
    out = []
    for row, n in zip(keys.cpu(), lens.cpu().tolist()):
        order = torch.sort(row[:n], descending=True, stable=True).indices[:topk]
        out.append((order.sort().values if n <= topk else order).tolist())
    return out


def assert_expected_order(got, keys, lens, topk):
    """Every slot of ``got`` as :func:`expected_order` has it: positions, keys, counts, padding."""
    assert unwritten_slots(got) == []
    for r, want in enumerate(expected_order(keys, lens, topk)):
        n = len(want)
        assert got.counts[r].item() == n
        assert got.raw_indices[r, :n].tolist() == want, r
        assert torch.equal(ordered_score_bits(got.values[r, :n]).cpu(), keys[r].cpu()[want]), r
        assert bool((got.raw_indices[r, n:] == -1).all())


def order_case(device):
    """Rows of distinct keys, and rows where one pair of equal keys (at reversed positions, at the
    top, inside, at the k-th) or many equal keys enter the selection: keys and lengths."""
    width = 1600
    rows = 8
    gen = torch.Generator().manual_seed(11)
    keys = torch.randperm(2**20, generator=gen)[: rows * width].view(rows, width).to(torch.int32) - 2**19
    top = keys.max().item()
    keys[1, 1500], keys[1, 3] = top + 5, top + 5  # the best key twice, far apart
    keys[2, 900], keys[2, 40] = top + 1, top + 1
    keys[2, 41] = top + 2
    srt = keys[3].sort(descending=True).values
    keys[3, (keys[3] == srt[TOPK // 2]).nonzero()[0]] = srt[TOPK // 2 + 1]  # a tie inside
    kth = keys[4].sort(descending=True).values[TOPK - 1]
    keys[4, 7] = kth  # a second key equal to the k-th, earlier: it takes the k-th's slot
    keys[5, ::3] = 12345  # many equal keys
    keys[6] = -keys[6]  # negative keys, distinct
    lens = torch.tensor([width, width, width - 1, width, width, width, TOPK + 1, TOPK], dtype=torch.int32)
    keys[torch.arange(width)[None, :] >= lens[:, None].long()] = KEY_NONE
    return keys.to(device), lens.to(device)


@pytest.mark.parametrize("way", ["rows", "torch"])
def test_selection_order_against_plain_torch(way, rows_way, monkeypatch, device):
    """The finish (:func:`.select.finalize_row`, which every way shares, so comparing ways cannot
    check it) against plain torch's stable order, every slot, on :func:`order_case`'s rows."""
    keys, lens = order_case(device)
    assert_expected_order(select(keys, lens, TOPK, way, monkeypatch), keys, lens, TOPK)


@pytest.mark.gpu
@pytest.mark.parametrize("topk", [512, 1024])
@pytest.mark.parametrize("way", ["rows", "split"])
def test_selection_order_gpu(way, topk, monkeypatch, device):
    """:func:`test_selection_order_against_plain_torch` with the shipped tile and sample at
    prefill-chunk widths (4,096 and 16,384 keys): indexer-like scores, every fourth row given
    equal keys at its top and another a plateau at or inside its k-th key."""
    rows, width = 264, 16384
    gen = torch.Generator().manual_seed(topk)
    keys = ordered_score_bits(torch.randn((rows, width), generator=gen) * 8)
    keys[::4, 100:4000:37] = keys[::4].max(dim=1, keepdim=True).values  # equal keys at the top
    lens = torch.tensor([width, 4096, width - 5, 4096 + 3] * (rows // 4), dtype=torch.int32)
    # a plateau of 800 keys equal to the row's 200th best: the k-th key of topk 512, inside 1024's
    keys[1::4, 9:4000:5] = keys[1::4, :4096].sort(dim=1, descending=True).values[:, 199:200]
    keys[torch.arange(width)[None, :] >= lens[:, None].long()] = KEY_NONE
    keys, lens = keys.to(device), lens.to(device)
    assert_expected_order(select(keys, lens, topk, way, monkeypatch), keys, lens, topk)


@pytest.mark.parametrize("case", pattern_cases()[:4] + [c for c in pattern_cases() if "increasing" in c.name], ids=str)
def test_legacy_with_rows_matches_reference(case, rows_way, device):
    """The legacy path end to end with the row select agrees with the fp64 reference (run here,
    not taken from the shared cache of default legacy results)."""
    wl = build(case, device)
    res = run_legacy(wl)
    assert_contract(res, wl)
    assert_matches_reference(res, wl, reference_result(case, device))


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["random", "scores", "increasing", "ties", "spikes"])
@pytest.mark.parametrize("topk", [512, 1024, 2048])
def test_rows_equal_torch_way_gpu(pattern, topk, monkeypatch, device):
    """DeepSeek-V4 widths on the GPU, the shipped tile and sample: 196,608-key rows (768K
    tokens), 16,384 and one tile, beside lengths around topk."""
    width = 196608
    lens = [width, width - 1, 16384, 4096, 4095, topk + 1, topk, topk - 1, 1, 0] * 13
    keys, lens_t = key_matrix(pattern, lens, width, device, seed=topk)
    got = select(keys, lens_t, topk, "rows", monkeypatch)
    assert unwritten_slots(got) == []
    assert_same_bits(got, select(keys, lens_t, topk, "torch", monkeypatch))


def _no_sort(monkeypatch):
    """Make the sorting network of :func:`indexer_topk.kernels.select.finalize_row` raise (under
    the interpreter its kernels call the module's names at run time)."""
    from indexer_topk.kernels import select as select_kernels

    def no_sort(x, descending):
        raise AssertionError("sorted by the network")

    monkeypatch.setattr(select_kernels, "sort1d", no_sort)


@pytest.mark.parametrize("topk", [512, 1024])
def test_rows_order_by_bins_without_the_network(topk, rows_way, monkeypatch, device):
    """On fp32 scores spread as an indexer's, every long row's selection is ordered by bins
    (the network is never called) and the bits are the torch way's, over more rows than the
    persistent grid has programs, so that each program's histogram serves several rows and must
    be left cleared by each."""
    if device != "cpu":
        pytest.skip("the network is replaced under the interpreter only")
    monkeypatch.setattr(legacy_backend, "ROWS_ORDER_BINS", 4096)  # off as shipped
    monkeypatch.setattr(legacy_backend, "ROWS_PROGRAMS_PER_SM", 1)
    monkeypatch.setattr(legacy_backend, "device_sm_count", lambda dev: 2)
    width = 2560
    lens = [width, width - 1, 1100, topk + 1, width - 7, 2000, topk + 3]
    keys, lens_t = key_matrix("scores", lens, width, device, seed=11)
    want = select(keys, lens_t, topk, "torch", monkeypatch)
    _no_sort(monkeypatch)
    got = select(keys, lens_t, topk, "rows", monkeypatch)
    assert unwritten_slots(got) == []
    assert_same_bits(got, want)


@pytest.mark.parametrize("pattern", ["ties", "crowded"])
def test_rows_order_falls_back_to_the_network(pattern, rows_way, monkeypatch, device):
    """Where a bin would hold more than ``ROWS_ORDER_MAXSEG`` of the selection (equal keys; one
    score far above the rest, which crowds the others into the lowest bins) the selection is
    sorted by the network instead, with the same bits as without bins."""
    if device != "cpu":
        pytest.skip("the network is replaced under the interpreter only")
    width = 2048
    keys, lens_t = key_matrix("scores" if pattern == "crowded" else pattern, [width, width], width, device, seed=2)
    if pattern == "crowded":
        keys[:, 77] = ordered_score_bits(torch.tensor([1e30]))
    monkeypatch.setattr(legacy_backend, "ROWS_ORDER_BINS", 0)
    want = select(keys, lens_t, TOPK, "rows", monkeypatch)
    monkeypatch.setattr(legacy_backend, "ROWS_ORDER_BINS", 4096)
    got = select(keys, lens_t, TOPK, "rows", monkeypatch)
    assert_same_bits(got, want)
    _no_sort(monkeypatch)
    with pytest.raises(Exception, match="sorted by the network"):
        select(keys, lens_t, TOPK, "rows", monkeypatch)


@pytest.mark.parametrize("bins,maxseg", [(4096, 16), (64, 16), (4096, 1), (16, 64)])
def test_rows_order_bins_settings_keep_the_bits(bins, maxseg, rows_way, monkeypatch, device):
    """Any number of bins and any run bound give the torch way's bits, by bins or by the
    network: few bins or a bound of one send rows to the network, a bound past the bins' fill
    keeps them on the bins with long runs to rank."""
    monkeypatch.setattr(legacy_backend, "ROWS_ORDER_BINS", bins)
    monkeypatch.setattr(legacy_backend, "ROWS_ORDER_MAXSEG", maxseg)
    width = 2560
    lens = [width, 1500, TOPK + 1, TOPK, 3]
    keys, lens_t = key_matrix("scores", lens, width, device, seed=bins + maxseg)
    got = select(keys, lens_t, TOPK, "rows", monkeypatch)
    assert unwritten_slots(got) == []
    assert_same_bits(got, select(keys, lens_t, TOPK, "torch", monkeypatch))


def hostile_order_rows(width: int, seed: int = 0):
    """int32 order keys ``[10, width]``, every row ``width`` long, whose selections (the best
    ``TOPK``) give the bins' arithmetic no ordinary range: +inf at the top, -inf / NaN /
    ``KEY_NONE`` filling the selection's low end (the range's low end has no number), scores
    near the fp32 limits (the range overflows), tiny scores around signed zeros (the scale
    overflows), every key equal, only zeros of both signs and a few ones, every key -inf, and
    one score far above normal ones."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn((10, width), generator=gen) * 8
    idx = torch.randperm(width, generator=gen)
    few = idx[:300]  # the finite keys of rows 1-3, fewer than TOPK
    scores[0, idx[:5]] = float("inf")
    scores[1] = float("-inf")
    scores[1, few] = torch.randn(300, generator=gen)
    scores[3] = scores[2]
    scores[4] = (torch.rand(width, generator=gen) * 2 - 1) * 3.4e38
    scores[5] = torch.randn(width, generator=gen) * 1e-35
    scores[5, idx[:40]] = 0.0
    scores[5, idx[40:80]] = -0.0
    scores[6] = 1.5
    scores[7] = torch.where(torch.rand(width, generator=gen) < 0.5, 0.0, -0.0)
    scores[7, idx[:7]] = 1.0
    scores[8] = float("-inf")
    scores[9, 77] = 1e30
    keys = ordered_score_bits(scores)
    keys[2] = KEY_NAN
    keys[2, few] = ordered_score_bits(scores[2, few])
    keys[3] = KEY_NONE  # a length past the scored positions: "no entry" keys inside the row
    keys[3, few] = ordered_score_bits(scores[3, few])
    return keys


@pytest.mark.parametrize("maxseg", [16, TOPK])
def test_rows_order_by_bins_on_hostile_keys(maxseg, rows_way, monkeypatch, device):
    """Selections whose bins have no ordinary range (:func:`hostile_order_rows`) keep the torch
    way's bits, every slot written, all rows taken in turn by one program (each must leave its
    histogram cleared for the next, also after a row the bins could not order). With a run bound
    of ``TOPK`` no bin can overflow it, so every row is ordered by the bins' ranks alone, a
    whole selection in one bin included (the network must not be called)."""
    if maxseg == TOPK and device != "cpu":
        pytest.skip("the network is replaced under the interpreter only")
    monkeypatch.setattr(legacy_backend, "ROWS_ORDER_BINS", 4096)
    monkeypatch.setattr(legacy_backend, "ROWS_ORDER_MAXSEG", maxseg)
    monkeypatch.setattr(legacy_backend, "ROWS_PROGRAMS_PER_SM", 1)
    monkeypatch.setattr(legacy_backend, "device_sm_count", lambda dev: 1)
    width = 1536
    keys = hostile_order_rows(width, seed=maxseg).to(device)
    lens = torch.full((keys.shape[0],), width, dtype=torch.int32, device=device)
    want = select(keys, lens, TOPK, "torch", monkeypatch)
    if maxseg == TOPK:
        _no_sort(monkeypatch)
    got = select(keys, lens, TOPK, "rows", monkeypatch)
    assert unwritten_slots(got) == []
    assert_same_bits(got, want)


def test_selection_order_by_bins_against_plain_torch(rows_way, monkeypatch, device):
    """:func:`order_case`'s rows ordered by the bins alone (a run bound of ``TOPK``, the network
    never called): ranks inside a bin by key, then by position, where equal keys are at the top,
    inside and at the k-th."""
    if device != "cpu":
        pytest.skip("the network is replaced under the interpreter only")
    monkeypatch.setattr(legacy_backend, "ROWS_ORDER_BINS", 64)
    monkeypatch.setattr(legacy_backend, "ROWS_ORDER_MAXSEG", TOPK)
    _no_sort(monkeypatch)
    keys, lens = order_case(device)
    assert_expected_order(select(keys, lens, TOPK, "rows", monkeypatch), keys, lens, TOPK)


@triton.jit
def _finalize_binned_kernel(rows, count, seq_len, pt, out_phys, out_cnt, hist, TOPK: tl.constexpr, BINS: tl.constexpr,
                            MAXSEG: tl.constexpr):
    """:func:`.row_topk.finalize_row_binned` as the row select calls it, the selection read from
    the output rows: ``rows`` int32 ``[6, TOPK]``, keys in row 1 and positions in row 4 (the others
    guards); ``out_phys`` ``[3, TOPK]`` and ``out_cnt`` ``[3]``, their middle entry written."""
    key_row = rows + 1 * TOPK
    pos_row = rows + 4 * TOPK
    finalize_row_binned(key_row, pos_row, count, seq_len, pt, key_row, pos_row, out_phys + TOPK, out_cnt + 1, hist,
                        TOPK, BINS, MAXSEG)


@pytest.mark.parametrize("count", [-5, 0, 40, 64, 64 + 100, 2**31 - 1])
def test_finalize_row_binned_unchecked_counts(count, device):
    """Counts below zero, below ``TOPK`` and past it, with a row longer than ``TOPK``: the bins
    write what :func:`.select.finalize_row` writes (``BINS = 0``), nothing outside the output
    row (guard rows either side), and leave the histogram zero. The bins order every such row
    (a run bound of ``TOPK``): under the interpreter the network must not be called."""
    topk, bins = 64, 128
    gen = torch.Generator().manual_seed(count % 1000)
    keys = ordered_score_bits(torch.randn(topk, generator=gen))
    pos = torch.randperm(4096, generator=gen)[:topk].sort().values.to(torch.int32)
    pt = torch.arange(64, dtype=torch.int32).flip(0).to(device)

    def run(b, monkeypatch):
        rows = torch.full((6, topk), 0x5A5A5A5A, dtype=torch.int32)
        rows[1], rows[4] = keys, pos
        rows = rows.to(device)
        phys = torch.full((3, topk), 0x5A5A5A5A, dtype=torch.int32, device=device)
        cnt = torch.full((3,), 0x5A5A5A5A, dtype=torch.int32, device=device)
        hist = torch.zeros(max(b, 1), dtype=torch.int32, device=device)
        if b and device == "cpu":
            _no_sort(monkeypatch)
        _finalize_binned_kernel[(1,)](rows, count, 4096, pt, phys, cnt, hist, TOPK=topk, BINS=b, MAXSEG=topk)
        assert not bool(hist.any()), "the histogram left dirty"
        return rows.cpu(), phys.cpu(), cnt.cpu()

    want = run(0, None)
    with pytest.MonkeyPatch.context() as mp:
        got = run(bins, mp)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    rows, phys, cnt = got
    for t, guards in ((rows, (0, 2, 3, 5)), (phys, (0, 2))):
        assert bool((t[list(guards)] == 0x5A5A5A5A).all()), "a write outside the output row"
    assert cnt[0].item() == cnt[2].item() == 0x5A5A5A5A
