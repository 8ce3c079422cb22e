"""The split select (kernels/split_topk.py) against the other ways of the legacy select stage,
and the one-row score tile that decode batches take.

``legacy_select`` takes the split select by default below 128 rows (a decode batch); these tests
force it (``KTH_SEARCH = "split"``) with a small tile and sample under the interpreter, and
compare every output bit for bit with the ``torch`` way on the patterns a sampled gate and an
unordered candidate buffer can get wrong: scores rising or falling along the row, ties at the
k-th key (the buffer's order is the atomics', so equal keys must be ranked by position), ties
everywhere (the buffer overflows), spikes where the sample reads (too few keys reach the gate),
NaN keys, and lengths around ``topk``, the tile, zero and past the matrix. Each test also reads
the rows' candidate counts, so both the candidate path and the one-program fallback are known
to have run. Outputs are poisoned first, so every slot must be written.
"""

import pytest
import torch

from indexer_topk.backends import legacy as legacy_backend
from indexer_topk.contract import KEY_NONE, allocate_result, ordered_score_bits, scores_from_ordered_bits
from indexer_topk.guards import poisoned_result, unwritten_slots
from indexer_topk.kernels.launch import device_sm_count
from indexer_topk.kernels.split_topk import (
    CAND_PER_TOPK, HEADER_FIELDS, HOW_BINS, HOW_TRIMMED, HOW_ROW_SELECT, HOW_SEARCH, finish_rows_kernel, gate_rows_kernel, gather_rows_kernel,
)

from kernel_cases import (
    Case, assert_bitwise, assert_contract, assert_matches_reference, build, mixed_requests_case, pattern_cases,
    reference_result, run_legacy,
)
from test_row_topk import assert_same_bits, force_way, key_matrix, page_table_for, select, set_settings

# the histogram's fp32 steps meet inf and NaN by design (keys of no score, ranges at infinity:
# such steps fall in the first or last bin); the interpreter's numpy warns on each
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

TOPK = 128
GUARD = 4096  # int32 entries past the scratch that no launch may write
SENTINEL = 0x5A5A5A5A


@pytest.fixture
def split_way(monkeypatch, device):
    """The split select with a tile, sample and block small enough for the interpreter."""
    force_way(monkeypatch, device, "split", SPLIT_TILE=1024, SPLIT_SAMPLE=1024, SPLIT_BLOCK=256)
    # the "spikes" keys (test_row_topk.key_matrix) sit where the split select samples
    monkeypatch.setattr(legacy_backend, "ROWS_SAMPLE", legacy_backend.SPLIT_SAMPLE)
    return legacy_backend


@pytest.fixture(params=[0, 64, 4096], ids=lambda b: f"bins{b}")
def split_bins(request, split_way, monkeypatch):
    """:func:`split_way` finishing rows by a radix search and a sort (``0``), or by a histogram
    of 64 bins (coarse: full bins send rows back to the search) or of 4,096."""
    monkeypatch.setattr(legacy_backend, "SPLIT_BINS", request.param)
    return request.param


@pytest.fixture(params=[1, 8], ids=lambda p: f"parts{p}")
def finish_parts(request, monkeypatch):
    """Each row's finish by bins shared by this many programs, whatever the batch and the device
    (the interpreter's handful of SMs would otherwise give most tests one part a row)."""
    monkeypatch.setattr(legacy_backend, "split_finish_parts", lambda rows, topk, sm_count: request.param)
    return request.param


def hows_expected(hows, counts, lens, topk, bins) -> None:
    """Rows selected from their candidates were finished by their bins or by the search (by the
    search alone without bins); rows with more candidates than the registers hold but no more
    than the buffer by their bins, or trimmed first and searched, or by the row select (always
    without bins); the rest took the row select."""
    took = set(took_candidates(counts, lens, topk))
    tile = legacy_backend.SPLIT_TILE
    for r, (how, c, n) in enumerate(zip(hows.tolist(), counts.tolist(), lens.tolist())):
        if r not in took and bins and n > tile and 4 * topk < c <= 8 * topk:
            assert how in (HOW_ROW_SELECT, HOW_TRIMMED + HOW_SEARCH, HOW_BINS), r
        elif r not in took:
            assert how == HOW_ROW_SELECT, r
        elif bins == 0:
            assert how == HOW_SEARCH, r
        else:
            assert how in (HOW_SEARCH, HOW_BINS), r


def split(keys, lens, topk, row_start=0, out=None, scratch=None):
    """The split select on a guarded scratch (``scratch``: ``GUARD`` sentinels past
    :func:`split_scratch_size` entries; ``None``: all sentinels): ``(outputs, candidate counts,
    how each row was finished)``; the scratch's guard band must be untouched."""
    rows, width = keys.shape
    need = legacy_backend.split_scratch_size(rows, topk)
    if scratch is None:
        scratch = torch.full((need + GUARD,), SENTINEL, dtype=torch.int32, device=keys.device)
    if out is None:
        out = poisoned_result(rows, topk, keys.device)
    page_table = page_table_for(row_start + rows, width, keys.device)
    legacy_backend.split_select(keys, lens, page_table, topk=topk, out=out, row_start=row_start, scratch=scratch[:need])
    assert bool((scratch[need:] == SENTINEL).all()), "the split select wrote past its scratch"
    return out, scratch[rows: 2 * rows].cpu(), scratch[3 * rows: 4 * rows].cpu()


def torch_way(keys, lens, topk, monkeypatch):
    """The torch way's outputs (torch.topk's k-th key, then one exact pass per row)."""
    return select(keys, lens, topk, "torch", monkeypatch)


def took_candidates(counts, lens, topk) -> list:
    """Rows selected from their candidates (the others took the one-program fallback)."""
    tile = legacy_backend.SPLIT_TILE
    return [i for i, (c, n) in enumerate(zip(counts.tolist(), lens.tolist())) if n > tile and topk <= c <= 4 * topk]


def tied_keys(lens, width, device, seed=0):
    """Every key value about three times along the row: the k-th key is almost always tied, with
    equal keys on both sides of the cut, while the gate still lets about ``2 * topk`` keys in."""
    gen = torch.Generator().manual_seed(seed)
    keys = ordered_score_bits(torch.stack([torch.randperm(width, generator=gen) // 3 for _ in lens]) * 0.5)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    keys[torch.arange(width)[None, :] >= lens_t[:, None].clamp(min=0).long()] = KEY_NONE
    return keys.to(device), lens_t.to(device)


@pytest.mark.parametrize("parts", [2, 4, 8])
@pytest.mark.parametrize("pattern", ["scores", "increasing"])
def test_split_finish_parts_give_the_same_bits(pattern, parts, split_way, monkeypatch, device):
    """A row's finish by bins shared by 2, 4 or 8 programs, each ranking and writing its share of
    the output slots: every row by its bins, every slot written, the torch way's bits."""
    monkeypatch.setattr(legacy_backend, "SPLIT_BINS", 4096)
    monkeypatch.setattr(legacy_backend, "split_finish_parts", lambda rows, topk, sm_count: parts)
    width = 5120
    lens = [width, width - 1, 4500, 3000, 700]
    keys, lens_t = key_matrix(pattern, lens, width, device, seed=parts)
    got, counts, hows = split(keys, lens_t, TOPK)
    assert unwritten_slots(got) == []
    assert_same_bits(got, torch_way(keys, lens_t, TOPK, monkeypatch))
    if pattern == "scores":  # scores spread over the bins: every long row by them
        assert hows.tolist()[:4] == [HOW_BINS] * 4


def test_split_finish_parts_by_rows():
    """Parts a row: powers of two up to ``SPLIT_FINISH_PARTS`` while the programs fit the SMs and
    each share of ``topk`` slots holds a bin's longest run; one without bins."""
    parts = legacy_backend.split_finish_parts
    most = legacy_backend.SPLIT_FINISH_PARTS
    assert parts(1, 1024, 132) == most
    assert parts(8, 1024, 132) == min(most, 16)
    assert parts(32, 1024, 132) == 4
    assert parts(64, 1024, 132) == 2
    assert parts(67, 1024, 132) == 1 and parts(127, 1024, 132) == 1
    assert parts(1, 32, 132) == 2  # 16-slot shares at most
    assert parts(1, 16, 132) == 1
    for rows in range(1, 300):
        p = parts(rows, 512, 132)
        assert p & (p - 1) == 0 and 1 <= p <= most and (p == 1 or rows * p <= 132)


def test_split_finish_parts_without_bins(monkeypatch):
    monkeypatch.setattr(legacy_backend, "SPLIT_BINS", 0)
    assert legacy_backend.split_finish_parts(1, 1024, 132) == 1


@pytest.mark.parametrize("pattern", ["random", "scores", "increasing", "decreasing", "ties", "nan", "spikes"])
def test_split_equals_torch_way(pattern, split_bins, monkeypatch, device):
    """Rows of many blocks, just past the tile, one tile, exactly topk and fewer: the same four
    outputs, every slot. Random and trending rows take the candidate path; rows of three values
    overflow the buffer and spiked rows let too few in: both take the fallback."""
    width = 5120
    lens = [width, width - 1, 3000, 1025, 1024, 700, TOPK + 1, TOPK, TOPK - 1, 1, 0]
    keys, lens_t = key_matrix(pattern, lens, width, device)
    got, counts, hows = split(keys, lens_t, TOPK)
    assert unwritten_slots(got) == []
    assert_same_bits(got, torch_way(keys, lens_t, TOPK, monkeypatch))
    hows_expected(hows, counts, lens_t, TOPK, split_bins)
    long_rows = [i for i, n in enumerate(lens) if n > legacy_backend.SPLIT_TILE]
    if pattern in ("random", "scores", "increasing", "decreasing"):
        assert took_candidates(counts, lens_t, TOPK) == long_rows
        if split_bins == 4096 and pattern == "scores":  # scores spread over the bins: each row by them
            assert [hows[i] for i in long_rows] == [HOW_BINS] * len(long_rows)
    elif pattern in ("ties", "spikes"):
        # ties: a third of a long row equals its best key, more than the buffer holds; spikes:
        # only the sampled keys reach the gate, fewer than topk
        assert not set(took_candidates(counts, lens_t, TOPK)) & {0, 1, 2}


@pytest.mark.parametrize("topk", [TOPK, 512])
def test_split_ties_at_the_kth_key(topk, split_bins, finish_parts, monkeypatch, device):
    """Keys equal to the k-th on both sides of the cut, in a buffer filled in no particular order:
    the lowest positions among them are taken, as by the torch way."""
    width = 6144
    lens = [width, width - 5, 4000, 2500]
    keys, lens_t = tied_keys(lens, width, device, seed=topk)
    got, counts, hows = split(keys, lens_t, topk)
    assert unwritten_slots(got) == []
    assert took_candidates(counts, lens_t, topk) == [0, 1, 2, 3]
    hows_expected(hows, counts, lens_t, topk, split_bins)
    assert_same_bits(got, torch_way(keys, lens_t, topk, monkeypatch))
    # the k-th key is tied across the cut (equal keys left out) in some row: else this test
    # would check nothing the random pattern does not
    cut = 0
    for r, n in enumerate(lens):
        taken = keys[r, got.raw_indices[r].long()]
        kth = taken.min()
        cut += int((taken == kth).sum()) < int((keys[r, :n] == kth).sum())
    assert cut > 0


def test_split_bins_at_their_edges(split_way, finish_parts, monkeypatch, device):
    """Keys far past the sample's range all land in the histogram's last bin: a few (distinct, or
    equal and ranked by position) are ordered inside its run; more than ``SPLIT_MAXSEG`` send the
    row back to the search. Same bits as the torch way either way."""
    monkeypatch.setattr(legacy_backend, "SPLIT_BINS", 4096)
    width = 5120
    keys, lens_t = key_matrix("scores", [width] * 4, width, device, seed=13)
    sample = legacy_backend.split_sample(width, TOPK)
    sampled = set(((torch.arange(sample) * width) // sample).tolist())
    free = torch.tensor([p for p in range(width) if p not in sampled])
    gen = torch.Generator().manual_seed(13)
    for row, (many, equal) in enumerate([(12, False), (10, True), (40, False), (0, False)]):
        spots = free[torch.randperm(len(free), generator=gen)[:many]].to(device)
        far = 1e6 if equal else 1e6 - torch.arange(many, dtype=torch.float32) * 7
        keys[row, spots] = ordered_score_bits(torch.full((many,), 1.0) * far).to(device)
    got, counts, hows = split(keys, lens_t, TOPK)
    assert unwritten_slots(got) == []
    assert_same_bits(got, torch_way(keys, lens_t, TOPK, monkeypatch))
    assert took_candidates(counts, lens_t, TOPK) == [0, 1, 2, 3]
    assert hows.tolist() == [HOW_BINS, HOW_BINS, HOW_SEARCH, HOW_BINS]


@pytest.mark.parametrize("kind", ["specials", "sprinkled", "tiny", "huge_range"])
def test_split_bins_on_scores_no_range_resolves(kind, split_way, finish_parts, monkeypatch, device):
    """Scores where the histogram's fp32 steps meet infinities, NaN, signed zeros and subnormals,
    or a range wider than fp32 can scale: whatever bins they get, the same bits as the torch way."""
    monkeypatch.setattr(legacy_backend, "SPLIT_BINS", 4096)
    specials = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38])
    gen = torch.Generator().manual_seed(17)
    rows, width = 3, 3008
    if kind == "specials":
        v = specials[torch.randint(0, len(specials), (rows, width), generator=gen)]
    elif kind == "sprinkled":  # a normal row with a few of them
        v = torch.randn((rows, width), generator=gen)
        hit = torch.rand((rows, width), generator=gen) < 0.01
        v[hit] = specials[torch.randint(0, len(specials), (int(hit.sum()),), generator=gen)]
    elif kind == "tiny":  # subnormals only: the range's reciprocal overflows
        v = torch.randint(-50, 50, (rows, width), generator=gen).float() * 1e-44
    else:  # magnitudes from 1e-30 to 1e30
        v = torch.randn((rows, width), generator=gen) * 10.0 ** torch.randint(-30, 30, (rows, width), generator=gen).float()
    keys = ordered_score_bits(v).to(device)
    lens = torch.tensor([width, width - 1, 1500], dtype=torch.int32, device=device)
    keys[1, width - 1:] = KEY_NONE
    keys[2, 1500:] = KEY_NONE
    got, counts, hows = split(keys, lens, TOPK)
    assert unwritten_slots(got) == []
    assert_same_bits(got, torch_way(keys, lens, TOPK, monkeypatch))
    hows_expected(hows, counts, lens.cpu(), TOPK, 4096)


def dipped_scores(lens, width, device, seed=21, dip=4.0, topk=TOPK):
    """The "scores" pattern (standard deviation 8), ``dip`` lower where the split select samples
    each row at ``topk``: its gate lets in more keys than it aims at."""
    keys, lens_t = key_matrix("scores", lens, width, "cpu", seed=seed)
    scores = scores_from_ordered_bits(keys)
    sample = legacy_backend.split_sample(width, topk)
    for r, n in enumerate(lens):
        if n >= sample:
            scores[r, (torch.arange(sample) * n) // sample] -= dip
    keys = ordered_score_bits(scores)
    keys[torch.arange(width)[None, :] >= lens_t[:, None].long()] = KEY_NONE
    return keys.to(device), lens_t.to(device)


def test_split_candidates_past_the_registers(split_bins, finish_parts, monkeypatch, device):
    """Scores half a standard deviation lower where the sample reads: the gate lets in more keys
    than the finishing program holds (``4 * topk``; the buffer holds twice that), while the bins
    from the k-th key's up hold few: with 4,096 bins such rows are finished by them from the
    whole buffer. Two rows also hold a plateau of ``SPLIT_MAXSEG + 4`` equal keys among their
    best: its bin is too full, and those rows are trimmed to the bins from the k-th key's up and
    searched. Without bins the row select serves. Same bits as the torch way, every slot
    written."""
    width = 5120
    lens = [width, 5000, 4097, 3000]
    keys, lens_t = dipped_scores(lens, width, device)
    sample = legacy_backend.split_sample(width, TOPK)
    sampled = set(((torch.arange(sample) * width) // sample).tolist())
    gen = torch.Generator().manual_seed(5)
    for row in (1, 3):  # a plateau at the row's 20th best key, off the sample
        n = lens[row]
        free = torch.tensor([p for p in range(n) if p not in sampled])
        top = keys[row, :n].sort(descending=True).values[20]
        keys[row, free[torch.randperm(len(free), generator=gen)[: legacy_backend.SPLIT_MAXSEG + 4]].to(device)] = top
    got, counts, hows = split(keys, lens_t, TOPK)
    assert unwritten_slots(got) == []
    assert_same_bits(got, torch_way(keys, lens_t, TOPK, monkeypatch))
    assert all(4 * TOPK < c <= 8 * TOPK for c in counts.tolist()), counts  # else no row is past the registers
    hows_expected(hows, counts, lens_t.cpu(), TOPK, split_bins)
    if split_bins == 4096:
        assert hows.tolist() == [HOW_BINS, HOW_TRIMMED + HOW_SEARCH, HOW_BINS, HOW_TRIMMED + HOW_SEARCH], hows
    elif split_bins == 0:
        assert hows.tolist() == [HOW_ROW_SELECT] * len(lens)


def test_split_lengths_past_the_matrix(split_bins, monkeypatch, device):
    """Unchecked lengths below zero or past the matrix's width read no further than the row."""
    width = 2048
    keys, _ = key_matrix("random", [width] * 3, width, device, seed=3)
    lens = torch.tensor([-5, width + 999, 2**31 - 1], dtype=torch.int32, device=device)
    got, _counts, _hows = split(keys, lens, TOPK)
    assert unwritten_slots(got) == []
    assert got.counts.tolist() == [0, TOPK, TOPK]
    assert_same_bits(got, torch_way(keys, lens, TOPK, monkeypatch))


@pytest.mark.parametrize("topk", [512, 1024])
def test_split_writes_only_its_outputs(topk, split_bins, finish_parts, device):
    """Output rows beside the selected ones (``row_start``), the key matrix and the scratch's
    guard band stay untouched, on rows that overflow their buffer and rows that do not."""
    width = 4 * 1024 + 1024
    keys, lens = key_matrix("ties", [width, 700], width, device, seed=7)
    keys[0, : width // 2] = torch.arange(width // 2, dtype=torch.int32, device=device)  # half distinct
    before = keys.clone()
    out = allocate_result(5, topk, device)
    for t in out:
        t.view(torch.int32).fill_(SENTINEL)
    full_lens = torch.tensor([0, 0, width, 700, 0], dtype=torch.int32, device=device)
    split(keys, full_lens[2:4], topk, row_start=0, out=None)  # the scratch guard alone
    rows, _w = keys.shape
    need = legacy_backend.split_scratch_size(rows, topk)
    scratch = torch.full((need + GUARD,), SENTINEL, dtype=torch.int32, device=device)
    legacy_backend.split_select(keys, full_lens, page_table_for(5, width, device), topk=topk, out=out, row_start=2,
                                scratch=scratch[:need])
    assert bool((scratch[need:] == SENTINEL).all())
    assert torch.equal(keys, before)
    for t in out:
        rows_ = t.view(torch.int32)
        for r in (0, 1, 4):
            assert bool((rows_[r] == SENTINEL).all())
        assert not bool((rows_[2:4] == SENTINEL).any())


def test_split_scratch_is_checked(device):
    keys = torch.zeros((2, 256), dtype=torch.int32, device=device)
    lens = torch.tensor([256, 256], dtype=torch.int32, device=device)
    out = allocate_result(2, 64, device)
    need = legacy_backend.split_scratch_size(2, 64)
    for bad in (torch.empty(need - 1, dtype=torch.int32, device=device),
                torch.empty(need, dtype=torch.int64, device=device),
                torch.empty(2 * need, dtype=torch.int32, device=device)[::2],
                torch.empty(need, dtype=torch.int32, device="meta"),
                torch.empty((2, need // 2 - 1), dtype=torch.int32, device=device)):
        with pytest.raises(ValueError, match="scratch"):
            legacy_backend.split_select(keys, lens, page_table_for(2, 256, device), topk=64, out=out, scratch=bad)
    # a contiguous scratch of another shape is carved by entries: the same bits as a flat one
    keys, lens = key_matrix("random", [256, 200], 256, device)
    flat, shaped = allocate_result(2, 64, device), allocate_result(2, 64, device)
    legacy_backend.split_select(keys, lens, page_table_for(2, 256, device), topk=64, out=flat)
    legacy_backend.split_select(keys, lens, page_table_for(2, 256, device), topk=64, out=shaped,
                                scratch=torch.empty((5, -(-need // 5)), dtype=torch.int32, device=device))
    assert_same_bits(shaped, flat)
    wide = torch.zeros((2, 512), dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="contiguous"):  # a column slice: rows are not width apart
        legacy_backend.split_select(wide[:, :256], lens, page_table_for(2, 256, device), topk=64, out=out)


def bins_of(keys, gate, scale, bins):
    """The split select's histogram bins of candidate ``keys`` in torch's fp32 (as the kernels bin)."""
    d = (scores_from_ordered_bits(keys) - scores_from_ordered_bits(gate.view(1))) * scale.view(1).view(torch.float32)
    d = torch.where(d == d, d, torch.where(keys > 0, bins - 1.0, 0.0))
    return d.clamp(0, bins - 1).to(torch.int64)


@pytest.mark.parametrize("parts", [1, 4])
def test_split_finish_ignores_buffer_order(parts, split_bins, monkeypatch, device):
    """The candidate buffer is filled in the atomics' order, which the interpreter (programs in
    grid order) never varies: after the gate and the gathering, shuffle each row's entries, then
    finish: the same bits (keys tied at the k-th across the cut are ranked by position, not by
    buffer slot; with bins, the runs' slots are taken in the atomics' order too). The gathering's
    histogram is checked against the buffer's keys binned here."""
    L = legacy_backend
    topk, width = 128, 5120
    lens = [width, 4000, 2500]
    keys, lens_t = tied_keys(lens, width, device, seed=11)
    rows, bins = len(lens), split_bins
    scratch = torch.zeros(L.split_scratch_size(rows, topk), dtype=torch.int32, device=device)
    gates, counts, scales, hows = scratch[: 4 * rows].view(4, rows)
    cand_end = rows * (4 + CAND_PER_TOPK * topk)
    cand = scratch[4 * rows: cand_end]
    hist = scratch[cand_end:] if bins else cand
    runs = L.split_runs(rows, width, device_sm_count(device))
    gate_rows_kernel[(rows,)](keys, width, lens_t, 0, gates, counts, scales, hist, TOPK=topk, TILE=L.SPLIT_TILE,
                              SAMPLE=L.SPLIT_SAMPLE, BINS=bins, SPREAD=bins // 4, num_warps=L.SPLIT_WARPS)
    gather_rows_kernel[(rows, runs)](keys, width, lens_t, 0, gates, counts, scales, hist, cand, runs, TOPK=topk,
                                     TILE=L.SPLIT_TILE, BLOCK=L.SPLIT_BLOCK, BINS=bins, num_warps=L.SPLIT_GATHER_WARPS)
    assert took_candidates(counts.cpu(), lens_t.cpu(), topk) == [0, 1, 2]
    gen = torch.Generator().manual_seed(0)
    buf = cand.view(rows, CAND_PER_TOPK * topk)[:, : 16 * topk].unflatten(1, (2, 8 * topk))
    for r in range(rows):
        c = int(counts[r])
        buf[r, :, :c] = buf[r, :, :c][:, torch.randperm(c, generator=gen).to(device)].clone()
        if bins:
            b = bins_of(buf[r, 0, :c], gates[r], scales[r], bins)
            assert torch.equal(hist.view(rows, 2, bins)[r, 0], torch.bincount(b, minlength=bins).to(torch.int32))
    out = poisoned_result(rows, topk, device)
    pt = page_table_for(rows, width, device)
    finish_rows_kernel[(rows, parts)](
        keys, width, lens_t, pt, pt.stride(0), out.values.view(torch.int32), out.raw_indices, out.physical_indices,
        out.counts, 0, gates, counts, scales, hows, hist, cand, scratch, TOPK=topk, TILE=L.SPLIT_TILE,
        SAMPLE=L.SPLIT_SAMPLE, BINS=bins, MAXSEG=L.SPLIT_MAXSEG, PARTS=parts, num_warps=L.SPLIT_WARPS,
    )
    hows_expected(hows.cpu(), counts.cpu(), lens_t.cpu(), topk, bins)
    if bins == 4096:  # equal keys share a bin: their run ranks them by position
        assert hows.tolist() == [HOW_BINS] * rows
    assert unwritten_slots(out) == []
    assert_same_bits(out, torch_way(keys, lens_t, topk, monkeypatch))


def sample_rank(n, topk, sample):
    """The rank in the row's sample that the sampled gate aims at (:func:`.row_topk.sample_rank`)."""
    return min((5 * topk * sample) // (2 * n) + 1, sample - 1)


def binned_slack(r):
    """Sampled keys past the aimed rank ``r`` that may reach the binned gate
    (:func:`.split_topk.binned_gate`; more send the row to the search's gate)."""
    return r // 8 + 2


def assert_binned_reach(reach, searched):
    """Each long row's gate (:func:`gates_and_reach`'s ``reach``) reached by at least the aimed
    rank of sampled keys, and, where it is not the search's gate (``searched``), by no more than
    the slack past it."""
    assert all(n >= r for _gate, n, r in reach), reach
    assert all(a == b or a[1] <= a[2] + binned_slack(a[2]) for a, b in zip(reach, searched)), (reach, searched)


def test_split_entrants_at_the_buffer_bounds(split_bins, finish_parts, monkeypatch, device):
    """Rows whose gate entrants number exactly topk - 1, topk, topk + 1, 4 * topk, 4 * topk + 1,
    8 * topk and 8 * topk + 1 (sampled keys distinct and high, extra keys tied with the gate):
    the edges of the candidate path, the trim (its bins cannot trim keys tied at the gate: the
    row select serves) and the buffer, each with the torch way's bits."""
    topk = 128
    width = max(5120, 4 * legacy_backend.SPLIT_SAMPLE)
    sample = legacy_backend.split_sample(width, topk)  # the gate's sample at this width
    assert (5 * topk * sample) // (2 * width) + 1 < topk - 1  # the gate's rank below topk - 1
    targets = [topk - 1, topk, topk + 1, 4 * topk, 4 * topk + 1, 8 * topk, 8 * topk + 1]
    gen = torch.Generator().manual_seed(3)
    keys = torch.randint(-1000, 0, (len(targets), width), generator=gen, dtype=torch.int32)
    spots = (torch.arange(sample) * width) // sample
    r_th = sample_rank(width, topk, sample)
    free = torch.ones(width, dtype=torch.bool)
    free[spots] = False
    free = free.nonzero().flatten()
    for row, target in enumerate(targets):
        vals = 10**6 + torch.randperm(sample, generator=gen).to(torch.int32)
        keys[row, spots] = vals
        gate = int(vals.sort(descending=True).values[r_th - 1])
        keys[row, free[torch.randperm(len(free), generator=gen)[: target - r_th]]] = gate
    keys, lens = keys.to(device), torch.full((len(targets),), width, dtype=torch.int32, device=device)
    got, counts, hows = split(keys, lens, topk)
    assert counts.tolist() == targets
    assert took_candidates(counts, lens.cpu(), topk) == [1, 2, 3]
    hows_expected(hows, counts, lens.cpu(), topk, split_bins)
    assert_same_bits(got, torch_way(keys, lens, topk, monkeypatch))


def test_split_reads_nothing_past_a_row(split_bins, monkeypatch, device):
    """Keys past each row's length set to the best key there is select nothing: the gate's
    sample, the gathering runs and the fallback all stop at the row's length."""
    topk, width = 128, 5120
    lens = [5000, 1500, 1025, 700, 129, 0, -3]
    keys, lens_t = key_matrix("random", lens, width, device, seed=9)
    hostile = keys.clone()
    hostile[keys == KEY_NONE] = 2**31 - 1
    got, _counts, _hows = split(hostile, lens_t, topk)
    assert_same_bits(got, torch_way(keys, lens_t, topk, monkeypatch))


def gates_and_reach(keys, lens, topk, monkeypatch, gate_bins):
    """``(outputs, counts, hows, [(gate, sampled keys reaching it, aimed rank)] of each long row)``
    of the split select with ``SPLIT_GATE_BINS = gate_bins``."""
    monkeypatch.setattr(legacy_backend, "SPLIT_GATE_BINS", gate_bins)
    rows, width = keys.shape
    need = legacy_backend.split_scratch_size(rows, topk)
    scratch = torch.full((need + GUARD,), SENTINEL, dtype=torch.int32, device=keys.device)
    got, counts, hows = split(keys, lens, topk, scratch=scratch)
    gates = scratch[:rows].cpu()
    sample = legacy_backend.split_sample(width, topk)
    reach = []
    for r, n in enumerate(lens.tolist()):
        if n > legacy_backend.SPLIT_TILE:
            sampled = keys[r, (torch.arange(sample, device=keys.device) * n) // sample].cpu()
            reach.append((int(gates[r]), int((sampled >= gates[r]).sum()), sample_rank(n, topk, sample)))
    return got, counts, hows, reach


@pytest.mark.parametrize("pattern,gate_bins", [("scores", 64), ("rising", 64)] + [
    (p, 256) for p in ("random", "scores", "rising", "increasing", "decreasing", "ties", "nan", "spikes")])
def test_split_binned_gate(pattern, gate_bins, split_way, monkeypatch, device):
    """The gate from one histogram of the sample (``SPLIT_GATE_BINS``): the torch way's bits
    whatever it lets in, and a gate that at least the aimed rank ``r`` of sampled keys reach.
    Where the bins resolve the rank (fp32 scores as an indexer's; scores rising evenly along the
    row in 256 bins) it is the binned gate: no more than ``r / 8 + 2`` sampled keys past the rank
    reach it, and it is not the search's (but where a bin's edge meets the rank). Elsewhere a row
    may keep the search's gate: evenly rising scores put about 16 sampled keys in each of 64
    bins, more than the slack past ``r = 65`` unless a bin's edge falls near the rank; the other
    patterns (always) have denormal scores (a range too narrow for fp32 bins), ties, NaN at the
    bottom of the range, or random bits whose range has no finite width."""
    width = 5120
    lens = [width, width - 1, 3000, 1025, 1024, 700, TOPK + 1, TOPK, TOPK - 1, 1, 0]
    if pattern == "rising":
        keys, lens_t = key_matrix("increasing", lens, width, device)
        rising = ordered_score_bits(torch.linspace(-3.0, 5.0, width)).to(device)
        keys = torch.where(keys == KEY_NONE, keys, rising.expand_as(keys))
    else:
        keys, lens_t = key_matrix(pattern, lens, width, device)
    got, counts, hows, reach = gates_and_reach(keys, lens_t, TOPK, monkeypatch, gate_bins)
    assert unwritten_slots(got) == []
    assert_same_bits(got, torch_way(keys, lens_t, TOPK, monkeypatch))
    hows_expected(hows, counts, lens_t, TOPK, legacy_backend.SPLIT_BINS)
    _got, _counts, _hows, searched = gates_and_reach(keys, lens_t, TOPK, monkeypatch, 0)
    assert_binned_reach(reach, searched)
    if pattern == "scores" or (pattern == "rising" and gate_bins == 256):
        assert any(a != b for a, b in zip(reach, searched)), (reach, searched)
        assert took_candidates(counts, lens_t, TOPK) == [i for i, n in enumerate(lens) if n > legacy_backend.SPLIT_TILE]
    elif pattern != "rising":
        assert reach == searched


def test_split_binned_gate_on_crowded_scores(split_way, monkeypatch, device):
    """One sampled score far above the rest squeezes the others into the lowest bins: the bin
    holding the aimed rank holds most of the sample, and the search's gate is taken instead."""
    width = 5120
    lens = [width, 4000]
    keys, lens_t = key_matrix("scores", lens, width, device, seed=4)
    sample = legacy_backend.SPLIT_SAMPLE
    for r, n in enumerate(lens):  # the best sampled key a thousand times the others' range
        keys[r, (7 * n) // sample] = int(ordered_score_bits(torch.tensor([1e6]))[0])
    got, _counts, _hows, reach = gates_and_reach(keys, lens_t, TOPK, monkeypatch, 256)
    _got, _counts, _hows, searched = gates_and_reach(keys, lens_t, TOPK, monkeypatch, 0)
    assert reach == searched
    assert_same_bits(got, torch_way(keys, lens_t, TOPK, monkeypatch))


# ---------------------------------------------------------------------------------------------
# The legacy path end to end: decode rows scored one per tile, selected by the split select
# ---------------------------------------------------------------------------------------------

DECODE_CASES = [mixed_requests_case(layout) for layout in ("sglang_fp8", "sglang_mxfp4", "aiter_mxfp4")]


@pytest.mark.parametrize("case", DECODE_CASES + pattern_cases()[:4], ids=str)
def test_one_row_tiles_give_the_same_bits(case, split_way, device):
    """``rows_per_request=1`` (one row per score tile) gives legacy's default bits, on one-row
    requests and on requests of several rows (the hint only changes the tile), and agrees with
    the fp64 reference."""
    wl = build(case, device)
    one = run_legacy(wl, rows_per_request=1)
    assert_contract(one, wl)
    assert_bitwise(one, run_legacy(wl), "rows_per_request=1 vs the two-row tile")
    assert_matches_reference(one, wl, reference_result(case, device))


def test_score_span_fills_the_device():
    """Few row groups take shorter spans (whole pages) until they fill the programs; many keep
    the longest span; no span is shorter than the floor."""
    span = legacy_backend.score_span
    full = legacy_backend.SCORE_SPAN
    assert span(1, 196608, 132) % 64 == 0
    assert span(1, 196608, 132) * 4 * 132 >= 196608
    assert legacy_backend.SCORE_MIN_SPAN <= span(1, 196608, 132) < full
    assert span(512, 196608, 132) == full
    assert span(1, 64, 132) == legacy_backend.SCORE_MIN_SPAN
    # one-row tiles (decode) go down to their own floor, never past one wave
    assert span(1, 32768, 132, one_row=True) == legacy_backend.SCORE_MIN_SPAN_ONE_ROW < legacy_backend.SCORE_MIN_SPAN
    assert span(8, 32768, 132, one_row=True) == 256 and 8 * (32768 // 256) <= legacy_backend.SCORE_PROGRAMS_PER_SM * 132
    assert span(8, 196608, 132, one_row=True) == span(8, 196608, 132)  # a wave's span above both floors
    # one wave, never a partial second: a decode batch's programs fit the SMs' slots
    wave = legacy_backend.SCORE_PROGRAMS_PER_SM * 132
    for groups, width in ((256, 32768), (64, 32768), (8, 196608), (32, 196608), (100, 30000), (1056, 8192)):
        s = span(groups, width, 132)
        assert groups * -(-width // s) <= max(wave, groups), (groups, width, s)
        assert groups * -(-width // s) > wave // 2 or s == full, (groups, width, s)


def test_select_way_by_rows_and_width():
    """The split select for few rows, and for rows longer than ``SPLIT_MIN_WIDTH`` up to
    ``SPLIT_ROWS_PER_SM`` an SM; the row select from ``ROWS_MIN_ROWS`` rows of shorter rows, and
    for more long rows."""
    way = legacy_backend.select_way
    sms, long_row = 132, legacy_backend.SPLIT_MIN_WIDTH
    most = max(legacy_backend.SPLIT_ROWS_PER_SM * sms, legacy_backend.ROWS_MIN_ROWS)
    assert way(1, 64, sms) == way(legacy_backend.ROWS_MIN_ROWS - 1, 4 * long_row, sms) == "split"
    assert way(legacy_backend.ROWS_MIN_ROWS, long_row, sms) == "rows"
    assert way(legacy_backend.ROWS_MIN_ROWS, long_row + 64, sms) == "split"
    assert way(most, 16 * long_row, sms) == "split"
    assert way(most + 1, 16 * long_row, sms) == "rows"


def test_auto_takes_the_way_select_way_names(monkeypatch, device):
    """``KTH_SEARCH = "auto"`` runs the way :func:`select_way` names, with the torch way's bits."""
    force_way(monkeypatch, device, "auto", SPLIT_TILE=1024, SPLIT_SAMPLE=1024, SPLIT_BLOCK=256, ROWS_TILE=1024,
              ROWS_SAMPLE=512)
    monkeypatch.setattr(legacy_backend, "ROWS_MIN_ROWS", 4)
    monkeypatch.setattr(legacy_backend, "SPLIT_ROWS_PER_SM", 1)
    monkeypatch.setattr(legacy_backend, "SPLIT_MIN_WIDTH", legacy_backend.ROWS_TILE)
    sms, tile = device_sm_count(device), legacy_backend.ROWS_TILE
    split_calls = []
    real_split = legacy_backend.split_select
    monkeypatch.setattr(legacy_backend, "split_select", lambda *a, **k: (split_calls.append(1), real_split(*a, **k)))
    for rows, width, want in ((sms, tile + 64, "split"), (sms + 1, tile + 64, "rows"), (sms, tile, "rows")):
        assert legacy_backend.select_way(rows, width, sms) == want
        keys, lens_t = key_matrix("scores", [width] * rows, width, device, seed=rows)
        split_calls.clear()
        monkeypatch.setattr(legacy_backend, "KTH_SEARCH", "auto")
        out = poisoned_result(rows, TOPK, device)
        legacy_backend.legacy_select(keys, lens_t, page_table_for(rows, width, device), topk=TOPK, out=out)
        assert bool(split_calls) == (want == "split"), (rows, width)
        assert unwritten_slots(out) == []
        assert_same_bits(out, torch_way(keys, lens_t, TOPK, monkeypatch))


def bins_from_kth(keys, n, topk, spread, bins=4096, sample=2048):
    """The keys of the fullest bin from the k-th key's up, the split finish's bins recomputed in
    fp64 for one row of ``n`` keys: the sample's ``r``-th largest as the gate, the sample's range
    from it spread over ``spread`` of ``bins`` bins (:func:`split_topk.open_row`)."""
    s = scores_from_ordered_bits(keys[:n]).double()
    sampled = s[(torch.arange(sample) * n) // sample]
    gate = sampled.sort(descending=True).values[sample_rank(n, topk, sample) - 1]
    b = ((s[s >= gate] - gate) * (spread / (sampled.max() - gate))).floor().clamp(0, bins - 1).long()
    hist = torch.bincount(b, minlength=bins)
    at_or_above = hist.flip(0).cumsum(0).flip(0)
    kth_bin = int((at_or_above >= topk).nonzero().max())
    return int(hist[kth_bin:].max())


def test_split_spread(monkeypatch):
    """``topk`` bins at topk 2048 of 4,096, a quarter (1,024) at 512 and 1024; more halves widen
    it up to half the bins; bins too coarse for the topk and ``SPLIT_SPREAD_HALVES = 0`` keep a
    quarter."""
    spread = legacy_backend.split_spread
    assert legacy_backend.SPLIT_BINS == 4096
    assert [spread(k) for k in (512, 1024, 2048)] == [1024, 1024, 2048]
    monkeypatch.setattr(legacy_backend, "SPLIT_SPREAD_HALVES", 3)
    assert [spread(k) for k in (512, 1024, 2048)] == [1024, 1536, 2048]
    monkeypatch.setattr(legacy_backend, "SPLIT_SPREAD_HALVES", 0)
    assert [spread(k) for k in (512, 1024, 2048)] == [1024, 1024, 1024]
    monkeypatch.setattr(legacy_backend, "SPLIT_SPREAD_HALVES", 2)
    monkeypatch.setattr(legacy_backend, "SPLIT_BINS", 64)
    assert [spread(k) for k in (16, 32, 512)] == [16, 32, 16]


@pytest.mark.parametrize("rows,warps", [(1, 8), (4, 8), (5, 16)])
def test_split_finish_launch_takes_its_warps_by_rows(rows, warps, split_way, monkeypatch, device):
    """The finishing kernel is launched with :func:`split_finish_warps` of the chunk's rows
    (``SPLIT_FEW_WARPS`` up to ``SPLIT_FEW_ROWS``); the other kernels keep theirs (the launches
    are recorded, not run)."""
    monkeypatch.setattr(legacy_backend, "SPLIT_FEW_WARPS", 8)
    monkeypatch.setattr(legacy_backend, "SPLIT_FEW_ROWS", 4)
    monkeypatch.setattr(legacy_backend, "SPLIT_WARPS", 16)
    launched = []
    monkeypatch.setattr(legacy_backend, "launch", lambda kernel, grid, *a, **k: launched.append((kernel, k)))
    keys = torch.zeros((rows, 2048), dtype=torch.int32, device=device)
    lens = torch.full((rows,), 2048, dtype=torch.int32, device=device)
    split(keys, lens, TOPK)
    assert [k["num_warps"] for kernel, k in launched if kernel is finish_rows_kernel] == [warps]
    assert [k["num_warps"] for kernel, k in launched if kernel is gate_rows_kernel] == [legacy_backend.SPLIT_GATE_WARPS]


def test_split_select_refuses_a_warps_setting_before_its_first_kernel(split_way, monkeypatch, device):
    """Called on its own (a caller's decode step, as legacy_select does), the split select refuses
    a finish warps setting Triton cannot take before its gate and gathering kernels launch, not
    at the finish after them."""
    monkeypatch.setattr(legacy_backend, "SPLIT_FEW_WARPS", 12)
    launched = []
    monkeypatch.setattr(legacy_backend, "launch", lambda kernel, grid, *a, **k: launched.append(kernel))
    keys = torch.zeros((2, 2048), dtype=torch.int32, device=device)
    lens = torch.full((2,), 2048, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"legacy\.SPLIT_FEW_WARPS: "):
        legacy_backend.split_select(keys, lens, page_table_for(2, 2048, device), topk=TOPK,
                                    out=allocate_result(2, TOPK, device))
    assert launched == []


def test_split_sample_by_width(monkeypatch):
    """The gate kernel's sample: ``SPLIT_SAMPLE_SHORT`` keys where a row's best topk hold at
    least ``SPLIT_SAMPLE_HITS`` of them on average (128K tokens at topk 1024, 256K at the edge),
    ``SPLIT_SAMPLE`` past that (768K), never more than ``SPLIT_SAMPLE``; ``None`` turns it off."""
    sample = legacy_backend.split_sample
    assert (legacy_backend.SPLIT_SAMPLE, legacy_backend.SPLIT_SAMPLE_SHORT, legacy_backend.SPLIT_SAMPLE_HITS) == (
        2048, 1024, 16)
    assert [sample(w, 1024) for w in (4097, 32768, 65536, 65537, 196608)] == [1024, 1024, 1024, 2048, 2048]
    assert [sample(w, 512) for w in (32768, 32769)] == [1024, 2048]
    assert [sample(w, 2048) for w in (131072, 131073, 196608)] == [1024, 2048, 2048]
    monkeypatch.setattr(legacy_backend, "SPLIT_SAMPLE_SHORT", None)
    assert sample(4097, 1024) == 2048
    monkeypatch.setattr(legacy_backend, "SPLIT_SAMPLE_SHORT", 4096)
    assert sample(4097, 1024) == 2048


def test_split_gate_from_the_short_sample(split_way, monkeypatch, device):
    """Where ``split_sample`` names the short sample, the gate kernel samples that many keys: each
    long row's gate is the aimed rank's key of the short sample (the search's gate), which is not
    the longer sample's, and the bits are the torch way's."""
    # on a GPU too: four rows past the tile, the short sample
    set_settings(monkeypatch, SPLIT_TILE=1024, SPLIT_SAMPLE=1024, SPLIT_SAMPLE_SHORT=256, SPLIT_SAMPLE_HITS=4)
    width = 5120
    assert legacy_backend.split_sample(width, TOPK) == 256
    lens = [width, 4500, 3000, 1500]
    keys, lens_t = key_matrix("scores", lens, width, device, seed=7)
    got, counts, hows, reach = gates_and_reach(keys, lens_t, TOPK, monkeypatch, 0)
    assert unwritten_slots(got) == []
    assert_same_bits(got, torch_way(keys, lens_t, TOPK, monkeypatch))
    long_rows = [(r, n) for r, n in enumerate(lens) if n > legacy_backend.SPLIT_TILE]
    assert len(reach) == len(long_rows) == 4, reach
    cpu = keys.cpu()
    for (gate, _n, _r), (r, n) in zip(reach, long_rows):
        short = cpu[r, (torch.arange(256) * n) // 256].sort(descending=True).values
        full = legacy_backend.SPLIT_SAMPLE
        longer = cpu[r, (torch.arange(full) * n) // full].sort(descending=True).values
        assert gate == int(short[sample_rank(n, TOPK, 256) - 1]), (r, gate)
        assert gate != int(longer[sample_rank(n, TOPK, full) - 1]), (r, gate)


def test_topk_2048_rows_finish_by_their_bins(monkeypatch, device):
    """At topk 2048 the sample's range from the gate up spreads over ``TOPK`` bins, not a quarter
    of 4,096: about 2.5 * TOPK keys reach the gate, and a quarter put more than ``MAXSEG`` into a
    bin near the k-th key in some rows of indexer-like scores at 196,608 keys (768K tokens), which
    then took the one-program search (18 of 80 rows of this pattern, recomputed as below; 1 of 80
    with ``TOPK`` bins). Here two of four rows did; with ``TOPK`` bins all four finish by their
    bins (the shipped tile, sample and block; the torch way's bits either way)."""
    topk, width = 2048, 196608
    for name, value in (("SPLIT_TILE", 4096), ("SPLIT_SAMPLE", 2048), ("SPLIT_BLOCK", 1024), ("SPLIT_BINS", 4096),
                        ("SPLIT_MAXSEG", 16), ("SPLIT_GATE_BINS", 0)):
        assert getattr(legacy_backend, name) == value  # the shipped values the fp64 rule below assumes
    force_way(monkeypatch, device, "split")
    keys, lens_t = key_matrix("scores", [width] * 4, width, device, seed=0)
    quarter = [bins_from_kth(keys[i].cpu(), width, topk, 4096 / 4) for i in range(4)]
    spread = [bins_from_kth(keys[i].cpu(), width, topk, topk) for i in range(4)]
    assert max(quarter) > legacy_backend.SPLIT_MAXSEG >= max(spread), (quarter, spread)
    want = torch_way(keys, lens_t, topk, monkeypatch)
    got, counts, hows = split(keys, lens_t, topk)
    assert unwritten_slots(got) == []
    assert hows.tolist() == [HOW_BINS] * 4, (hows, counts)
    assert_same_bits(got, want)
    monkeypatch.setattr(legacy_backend, "SPLIT_SPREAD_HALVES", 0)  # a quarter: the rows the model names search
    got, counts, hows = split(keys, lens_t, topk)
    assert [h == HOW_BINS for h in hows.tolist()] == [q <= legacy_backend.SPLIT_MAXSEG for q in quarter], hows
    assert_same_bits(got, want)


# ---------------------------------------------------------------------------------------------
# GPU: DeepSeek-V4 decode widths with the shipped tile, sample and block
# ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["random", "scores", "increasing", "ties", "spikes"])
@pytest.mark.parametrize("topk", [512, 1024, 2048])
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_split_equals_torch_way_gpu(pattern, topk, rows, split_way, monkeypatch, device):
    """196,608-key rows (768K tokens) and shorter ones beside lengths around topk and the tile,
    in decode batches of 1, 8 and 64 rows."""
    width = 196608
    lens = ([width, 32768, width - 1, 4097, 4096, topk + 1, topk, topk - 1, 1, 0] * 7)[:rows]
    keys, lens_t = key_matrix(pattern, lens, width, device, seed=topk + rows)
    got, counts, hows = split(keys, lens_t, topk)
    assert unwritten_slots(got) == []
    assert_same_bits(got, torch_way(keys, lens_t, topk, monkeypatch))
    hows_expected(hows, counts, lens_t.cpu(), topk, legacy_backend.SPLIT_BINS)
    if pattern in ("random", "scores", "increasing"):  # the gate misjudges about one row in a thousand
        long_rows = [i for i, n in enumerate(lens) if n > legacy_backend.SPLIT_TILE]
        took = took_candidates(counts, lens_t, topk)
        assert set(took) <= set(long_rows) and len(took) >= len(long_rows) - len(long_rows) // 20


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["scores", "increasing", "ties", "spikes"])
@pytest.mark.parametrize("topk", [512, 1024])
def test_split_binned_gate_gpu(pattern, topk, split_way, monkeypatch, device):
    """The gate from one histogram (``SPLIT_GATE_BINS = 256``) at decode widths: the torch way's
    bits, at least the aimed rank of sampled keys reaching each gate and no more than the slack
    past it where the gate is not the search's; on fp32 scores no row left to the one-program
    fallback that the search's gate sends to its candidates. (At these widths the aimed rank is
    7 to 320 of the fixture's 1,024 sampled keys: the bins near it hold one key or none, and the
    binned gate is mostly the search's. A row's candidate count rides on its sample too: at
    ``topk = 512`` the search's gate lets 2,129 keys of row 2 in, past the ``4 * topk`` the
    candidate path takes.)"""
    width = 196608
    lens = [width, 32768, width - 1, 4097, 4096, topk + 1, topk, 0]
    keys, lens_t = key_matrix(pattern, lens, width, device, seed=topk)
    got, counts, hows, reach = gates_and_reach(keys, lens_t, topk, monkeypatch, 256)
    assert unwritten_slots(got) == []
    assert_same_bits(got, torch_way(keys, lens_t, topk, monkeypatch))
    hows_expected(hows, counts, lens_t.cpu(), topk, legacy_backend.SPLIT_BINS)
    _got, searched_counts, _hows, searched = gates_and_reach(keys, lens_t, topk, monkeypatch, 0)
    assert_binned_reach(reach, searched)
    if pattern == "scores":
        took, searched_took = (took_candidates(c, lens_t, topk) for c in (counts, searched_counts))
        assert set(searched_took) <= set(took), (counts, searched_counts)


@pytest.mark.gpu
@pytest.mark.parametrize("topk", [512, 1024, 2048])
def test_split_candidates_past_the_registers_gpu(topk, split_way, monkeypatch, device):
    """Decode widths whose gate lets in more than the finishing program holds: each such row
    finished by its bins from the whole buffer, the torch way's bits."""
    width = 196608
    lens = [width, width - 1, 100000, 32768, 4097, 4096, topk + 1, 0]
    keys, lens_t = dipped_scores(lens, width, device, seed=topk, dip=3.0, topk=topk)
    got, counts, hows = split(keys, lens_t, topk)
    assert unwritten_slots(got) == []
    assert_same_bits(got, torch_way(keys, lens_t, topk, monkeypatch))
    hows_expected(hows, counts, lens_t.cpu(), topk, legacy_backend.SPLIT_BINS)
    over = [i for i, (c, n) in enumerate(zip(counts.tolist(), lens))
            if n > legacy_backend.SPLIT_TILE and 4 * topk < c <= 8 * topk]
    assert set(over) >= {0, 1}, counts  # the longest rows have more candidates than the registers hold
    assert [hows[i] for i in over] == [HOW_BINS] * len(over), hows


@pytest.mark.gpu
@pytest.mark.parametrize("topk", [512, 1024])
def test_split_ties_at_the_kth_key_gpu(topk, split_way, monkeypatch, device):
    width = 196608
    lens = [width, 100000, 32768, 5000]
    keys, lens_t = tied_keys(lens, width, device, seed=topk)
    got, counts, hows = split(keys, lens_t, topk)
    assert took_candidates(counts, lens_t, topk) == [0, 1, 2, 3]
    hows_expected(hows, counts, lens_t.cpu(), topk, legacy_backend.SPLIT_BINS)
    assert_same_bits(got, torch_way(keys, lens_t, topk, monkeypatch))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["sglang_fp8", "sglang_mxfp4", "aiter_mxfp4"])
def test_one_row_tiles_give_the_same_bits_gpu(layout, device):
    """Eight one-row requests of up to 128K tokens: the one-row tile's key matrix equals the
    two-row tile's bit for bit (the whole legacy result with it)."""
    from indexer_topk.workload import make_workload

    wl = make_workload(layout, context_tokens=[131072, 4096, 65536, 98307, 131072, 1000, 50000, 70001],
                       rows_per_request=[1] * 8, topk=1024, seed=21, device=device)
    one = legacy_backend.legacy_score(wl.inputs(), rows_per_request=1)
    two = legacy_backend.legacy_score(wl.inputs())
    assert torch.equal(one, two)
    assert_bitwise(run_legacy(wl, rows_per_request=1), run_legacy(wl), "legacy decode")


def test_prof_is_checked(device):
    keys = torch.zeros((2, 256), dtype=torch.int32, device=device)
    lens = torch.tensor([256, 256], dtype=torch.int32, device=device)
    out = allocate_result(2, 64, device)
    with pytest.raises(ValueError, match="prof"):
        legacy_backend.split_select(keys, lens, page_table_for(2, 256, device), topk=64, out=out,
                                    prof=torch.zeros(2, dtype=torch.int64, device=device))


def test_finish_builds_compile_for_hopper():
    """The finishing kernel's PROF build (inline clock reads, a GPU measurement that the
    interpreter cannot run) and its build without bins compile for sm_90 here, in a process
    without the interpreter: the interpreter runs only the branches a call takes, so a name left
    undefined in a branch the build cannot take (the bins' finish without bins, as the parts
    change first had it) fails only when compiled."""
    from sm90_builds import compile_script

    script = """
from indexer_topk.backends import legacy as L
from indexer_topk.kernels.split_topk import finish_rows_kernel as f
const = dict(TOPK=512, TILE=L.SPLIT_TILE, SAMPLE=L.SPLIT_SAMPLE, BINS=L.SPLIT_BINS, MAXSEG=L.SPLIT_MAXSEG,
             PARTS=L.SPLIT_FINISH_PARTS, PROF=True)
k = report._compile(f, report._signature(f, {}, constexprs=const), const, 90, L.SPLIT_WARPS, 1)
print("%clock64" in k.asm["ptx"], k.asm["ptx"].count("st.global.b64"))
const = dict(const, BINS=0, PARTS=1, PROF=False)
k = report._compile(f, report._signature(f, {}, constexprs=const), const, 90, L.SPLIT_WARPS, 1)
print("atom" in k.asm["ptx"])
"""
    clock, stores, no_bins = compile_script(script, timeout=600).split()
    assert clock == "True" and int(stores) >= 4  # the clock read, and the row's counters stored
    assert no_bins == "True"  # the build without bins, its row select's atomics in it


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["scores", "increasing", "ties", "spikes"])
@pytest.mark.parametrize("rows,width", [(128, 65536), (132, 16448), (1024, 16384), (300, 4160)])
def test_auto_on_prefill_chunks_gpu(pattern, rows, width, monkeypatch, device):
    """Prefill chunks as ``auto`` selects them (on an H200, the split select for 128 rows of 65,536
    keys and 132 of 16,448; the row select for the others), with lengths around ``topk`` and the tile among
    them: the torch way's bits, every slot written."""
    topk = 1024
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", "auto")
    lens = ([width, width - 1, 4097, 4096, topk + 1, topk, topk - 1, 1, 0] + [width] * 23) * (rows // 32 + 1)
    keys, lens_t = key_matrix(pattern, lens[:rows], width, device, seed=rows + width)
    out = poisoned_result(rows, topk, device)
    legacy_backend.legacy_select(keys, lens_t, page_table_for(rows, width, device), topk=topk, out=out)
    assert unwritten_slots(out) == []
    assert_same_bits(out, torch_way(keys, lens_t, topk, monkeypatch))


def _corrupt_row(kind, hist, count, gen):
    """Row ``hist`` (its ``BINS`` bin counts) recounted so that the finish still goes by its bins
    (the total is ``count``, no bin from the k-th key's up counts more than 16) but not by the
    candidates the bins hold: ``shuffled`` moves the counts among the filled bins; ``top`` adds
    three to the highest filled bin (taken from the lowest), so that its run starts three slots
    before the row's first; ``overfull`` counts one candidate in the fullest bin and 127 above it,
    so that bin's run starts at slot 127 and holds all its candidates (the test fills it with
    more than the staging area's ``2 * topk`` slots)."""
    filled = torch.nonzero(hist > 0).flatten()
    if kind == "shuffled":
        hist[filled] = hist[filled[torch.randperm(len(filled), generator=gen).to(filled.device)]].clone()
    elif kind == "top":
        top, low = int(filled[-1]), filled[:3]
        hist[top] += 3
        hist[low] -= 1
    else:
        full = int(torch.argmax(hist))
        assert 1 <= full < hist.numel() - 8, full  # the ties above the gate's bin, below the last bins
        hist.zero_()
        hist[full + 1: full + 9] = torch.tensor([16] * 7 + [15], dtype=hist.dtype)
        hist[full] = 1
        hist[full - 1] = count - TOPK


@pytest.mark.parametrize("kind", ["shuffled", "top", "overfull"])
@pytest.mark.parametrize("parts", [1, 8])
def test_split_finish_writes_nothing_outside_its_row_on_a_corrupt_histogram(kind, parts, split_way, monkeypatch,
                                                                           device):
    """The finish by bins trusts that the histogram counts each bin's candidates, as the
    gathering leaves it. Recounted between the gathering and the finish (:func:`_corrupt_row`,
    the middle row of three), the row's outputs may be wrong, but the other rows' outputs and
    scratch must be an uncorrupted run's, and nothing may be written outside the outputs (guard
    bands on both sides) or the scratch."""
    from indexer_topk.guards import GuardedResult

    monkeypatch.setattr(legacy_backend, "SPLIT_BINS", 4096)
    monkeypatch.setattr(legacy_backend, "split_finish_parts", lambda rows, topk, sm_count: parts)
    width, rows, bad = 5120, 3, 1
    lens = torch.tensor([width, 4500, 4000], dtype=torch.int32)
    keys, lens_t = key_matrix("scores", lens.tolist(), width, device, seed=3)
    if kind == "overfull":  # 250 keys tied at about the row's 20th largest: a bin of 250 entrants
        row = keys[bad, : int(lens[bad])]
        tie = torch.sort(row, descending=True).values[20]
        at = torch.randperm(int(lens[bad]), generator=torch.Generator().manual_seed(0))[:250]
        keys[bad, at.to(keys.device)] = tie
    bins = legacy_backend.SPLIT_BINS
    need = legacy_backend.split_scratch_size(rows, TOPK)
    real_launch = legacy_backend.launch
    gen = torch.Generator().manual_seed(parts)

    def run(corrupt):
        def launch(kernel, grid, *args, **kwargs):
            if corrupt and kernel is finish_rows_kernel:
                hist, counts = args[14].view(rows, 2 * bins), args[11]
                _corrupt_row(kind, hist[bad, :bins], int(counts[bad]), gen)
            return real_launch(kernel, grid, *args, **kwargs)

        monkeypatch.setattr(legacy_backend, "launch", launch)
        scratch = torch.full((need + GUARD,), SENTINEL, dtype=torch.int32, device=device)
        # the scratch's body as the smallest key: a run read from before its first slot then
        # ranks below the run's candidates (the sentinel, a large key, would rank above them)
        scratch[:need] = -(2**31)
        guarded = GuardedResult(rows, TOPK, device)
        split(keys, lens_t, TOPK, out=guarded.out, scratch=scratch)
        guarded.assert_guards_intact()
        return guarded.out, scratch

    want, want_scratch = run(corrupt=False)
    got, got_scratch = run(corrupt=True)
    assert int(got_scratch[3 * rows + bad]) == HOW_BINS  # the recounted histogram was followed
    for name, w, g in zip(got._fields, want, got):
        others = [r for r in range(rows) if r != bad]
        assert torch.equal(w.view(torch.int32)[others], g.view(torch.int32)[others]), f"{name}: another row's outputs"
    # the scratch outside the corrupt row's header fields, candidate region and histogram
    mine = torch.zeros(need, dtype=torch.bool)
    mine[torch.arange(HEADER_FIELDS) * rows + bad] = True
    cand, cand_end = CAND_PER_TOPK * TOPK, rows * (HEADER_FIELDS + CAND_PER_TOPK * TOPK)
    mine[HEADER_FIELDS * rows + bad * cand: HEADER_FIELDS * rows + (bad + 1) * cand] = True
    mine[cand_end + bad * 2 * bins: cand_end + (bad + 1) * 2 * bins] = True
    assert torch.equal(want_scratch[:need][~mine.to(device)], got_scratch[:need][~mine.to(device)]), \
        "another row's scratch"
