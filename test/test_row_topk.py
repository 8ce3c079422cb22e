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

from typing import Optional

import pytest
import torch

from indexer_topk.backends import legacy as legacy_backend
from indexer_topk.contract import KEY_NAN, KEY_NONE, allocate_result, by_position, ordered_score_bits
from indexer_topk.guards import poisoned_result, unwritten_slots

from kernel_cases import assert_contract, assert_matches_reference, build, pattern_cases, reference_result, run_legacy

TOPK = 512


def set_settings(monkeypatch, **settings):
    """The legacy backend's module settings given, for the test."""
    for name, value in settings.items():
        monkeypatch.setattr(legacy_backend, name, value)


def force_way(monkeypatch, device, way: str, **cpu_settings):
    """``legacy_select`` takes ``way`` for the test; on a CPU the module settings given too
    (small enough for the interpreter)."""
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", way)
    if device == "cpu":
        set_settings(monkeypatch, **cpu_settings)
    return legacy_backend


@pytest.fixture
def rows_way(monkeypatch, device):
    """The row select with a tile and sample small enough to give many tiles to a short row."""
    return force_way(monkeypatch, device, "rows", ROWS_TILE=1024, ROWS_SAMPLE=512)


def set_sort(monkeypatch, bits: Optional[int]):
    """The row select sorts each row's selection by the ``bits``-wide network, whatever the rows
    (``None``: by its rule)."""
    set_settings(monkeypatch, ROWS_SORT_BITS=bits)


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


def select(keys, lens, topk, way, monkeypatch, order="score"):
    rows, width = keys.shape
    out = poisoned_result(rows, topk, keys.device)
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", way)
    legacy_backend.legacy_select(keys, lens, page_table_for(rows, width, keys.device), topk=topk, out=out,
                                 order=order)
    return out


def assert_same_bits(got, want):
    for name, a, b in zip(got._fields, got, want):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), name


@pytest.mark.parametrize("pattern", ["random", "scores", "increasing", "decreasing", "ties", "nan", "spikes"])
@pytest.mark.parametrize("bits", [64, 32])
@pytest.mark.parametrize("set_pool", [None, 0])
def test_rows_equal_torch_way(pattern, bits, set_pool, rows_way, monkeypatch, device):
    """Rows of many tiles, one tile, exactly topk and fewer: the same four outputs, every slot,
    the selection sorted by the 64- or the 32-bit network, the long rows' pool in position order
    or in none (``ROWS_SET_POOL_WIDTH``: its ties cut by position, its last entries sorted back)."""
    set_sort(monkeypatch, bits)
    set_settings(monkeypatch, ROWS_SET_POOL_WIDTH=set_pool)
    width = 4160
    lens = [width, width - 1, 1100, TOPK + 1, TOPK, TOPK - 1, 1, 0]
    keys, lens_t = key_matrix(pattern, lens, width, device)
    got = select(keys, lens_t, TOPK, "rows", monkeypatch)
    assert unwritten_slots(got) == []
    assert_same_bits(got, select(keys, lens_t, TOPK, "torch", monkeypatch))


@pytest.mark.parametrize("bins,cand", [(0, 512), (2, 16), (256, 512)])
@pytest.mark.parametrize("pattern", ["scores", "ties", "spikes"])
@pytest.mark.parametrize("set_pool", [None, 0])
def test_rows_equal_torch_way_by_each_kth_search(pattern, bins, cand, set_pool, rows_way, monkeypatch, device):
    """The k-th searched by radix digits over each tile (``ROWS_BINS = 0``), in a bin of two,
    with a scratch too small for most bins, or in a bin of 256, the long rows' pool in either
    order: the same four outputs."""
    set_settings(monkeypatch, ROWS_BINS=bins, ROWS_CAND=cand, ROWS_SET_POOL_WIDTH=set_pool)
    width = 4160
    lens = [width, 1100, TOPK + 1, TOPK - 1, 0]
    keys, lens_t = key_matrix(pattern, lens, width, device)
    got = select(keys, lens_t, TOPK, "rows", monkeypatch)
    assert unwritten_slots(got) == []
    assert_same_bits(got, select(keys, lens_t, TOPK, "torch", monkeypatch))


@pytest.mark.parametrize("pattern", ["scores", "ties"])
def test_rows_unsorted_hold_the_sorted_entries(pattern, rows_way, monkeypatch, device):
    """``order="position"`` (the finish's ``SORT_BITS = 0``, no sort): every slot written, each
    row's selection in ascending positions, the entries of the sorted run."""
    width = 4160
    lens = [width, 1100, TOPK + 1, TOPK, 1, 0]
    keys, lens_t = key_matrix(pattern, lens, width, device)
    set_sort(monkeypatch, 64)
    want = select(keys, lens_t, TOPK, "rows", monkeypatch)
    got = select(keys, lens_t, TOPK, "rows", monkeypatch, order="position")
    assert unwritten_slots(got) == []
    raw = got.raw_indices
    live = raw >= 0
    assert bool((raw[:, 1:] > raw[:, :-1])[live[:, 1:]].all()), "positions ascend"
    assert not torch.equal(got.raw_indices, want.raw_indices)  # the long rows were sorted in the other
    assert_same_bits(got, by_position(want))


@pytest.mark.parametrize("setting,rows,width,bits", [
    (None, 511, 4096, 64), (None, 512, 4096, 32), (None, 8192, 4096, 32), (None, 512, 1024, 32),
    (None, 1023, 4160, 64), (None, 1024, 4160, 32), (64, 8192, 4096, 64), (32, 128, 4096, 32)])
def test_row_sort_width_by_rows(setting, rows, width, bits, monkeypatch, device):
    """The row select's launch takes the 32-bit sort from ``ROWS_NARROW_MIN_ROWS`` rows of at most
    a tile (``ROWS_TILE``, 4,096 keys here), from ``ROWS_NARROW_MIN_ROWS_LONG`` rows of more,
    unless ``ROWS_SORT_BITS`` names a width (the launch is recorded, not run)."""
    set_sort(monkeypatch, setting)
    force_way(monkeypatch, device, "rows")
    monkeypatch.setattr(legacy_backend, "ROWS_TILE", 4096)
    launched = []
    monkeypatch.setattr(legacy_backend, "launch", lambda kernel, grid, *a, **k: launched.append(k))
    keys = torch.zeros((rows, width), dtype=torch.int32, device=device)
    lens = torch.full((rows,), width, dtype=torch.int32, device=device)
    legacy_backend.legacy_select(keys, lens, page_table_for(rows, width, device), topk=TOPK,
                                 out=allocate_result(rows, TOPK, device))
    assert [k["SORT_BITS"] for k in launched] == [bits]


@pytest.mark.parametrize("few,rows,programs,warps", [
    (16, 1, 1, 16), (16, 4, 4, 16), (16, 5, 5, 8), (16, 9, 8, 8), (None, 4, 4, 8), (4, 3, 3, 4)])
def test_row_select_launch_by_rows(few, rows, programs, warps, monkeypatch, device):
    """While the rows number at most the SMs (four here), the row select
    launches a program of ``ROWS_FEW_WARPS`` warps a row; past them (or with the setting
    ``None``) ``ROWS_PROGRAMS_PER_SM`` programs an SM of ``ROWS_WARPS``, no more than the rows;
    each program gets a pool either way (the launches are recorded, not run)."""
    force_way(monkeypatch, device, "rows")
    monkeypatch.setattr(legacy_backend, "ROWS_FEW_WARPS", few)
    monkeypatch.setattr(legacy_backend, "ROWS_WARPS", 8)
    monkeypatch.setattr(legacy_backend, "ROWS_PROGRAMS_PER_SM", 2)
    monkeypatch.setattr(legacy_backend, "ROWS_TILE", 1024)
    monkeypatch.setattr(legacy_backend, "device_sm_count", lambda _device: 4)
    launched = []
    monkeypatch.setattr(legacy_backend, "launch", lambda kernel, grid, *a, **k: launched.append((grid, a, k)))
    width = 2048  # longer than the tile: each program takes a pool
    keys = torch.zeros((rows, width), dtype=torch.int32, device=device)
    lens = torch.full((rows,), width, dtype=torch.int32, device=device)
    legacy_backend.legacy_select(keys, lens, page_table_for(rows, width, device), topk=TOPK,
                                 out=allocate_result(rows, TOPK, device))
    [(grid, args, kw)] = launched
    assert grid == (programs,) and kw["num_warps"] == warps
    pools = args[11]
    assert pools.numel() == programs * 4 * TOPK == legacy_backend.row_pool_size(rows, width, TOPK, 4)


def run_keys(rows: int, width: int, topk: int, longest: int, seed: int, top: bool = False) -> torch.Tensor:
    """int32 keys in groups alike in all but their ``log2(topk)`` low bits (the runs of the
    32-bit sort), of 1 to ``longest`` keys each, some equal within a group, scattered along the
    row (``width`` even), rising with the group's number: the top eighth of the groups positive,
    or (``top``) the highest group at the top of the int32 range."""
    low_bits = topk.bit_length() - 1
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty((rows, width), dtype=torch.int32)
    for r in range(rows):
        sizes = torch.randint(1, longest + 1, (width,), generator=gen)
        group = torch.repeat_interleave(torch.arange(width), sizes)[:width]
        low = torch.randint(0, 1 << low_bits, (width,), generator=gen)
        low[1::2] = low[0::2]  # neighbours in a group often share their low bits too: equal keys
        last = int(group.max())
        first = (1 << (31 - low_bits)) - 1 - last if top else -(last * 7) // 8  # the lowest group's high bits
        keys = ((group + first) << low_bits) + low
        out[r] = keys[torch.randperm(width, generator=gen)].to(torch.int32)
    return out


@pytest.mark.parametrize("topk", [512, 1024])
@pytest.mark.parametrize("longest", [2, 4, 5, 9])
@pytest.mark.parametrize("top", [False, True])
def test_narrow_sort_runs(topk, longest, top, rows_way, monkeypatch, device):
    """The 32-bit sort on keys made of runs (``NARROW_RUN`` is 4): runs up to it corrected in
    place, longer ones sent to the 64-bit network, runs across the k-th key cut: the torch way's
    four outputs, every slot, for rows of many tiles and just past topk (one tile at topk 512
    under the interpreter's tile of 1,024 keys), keys of both signs and at the top of the range."""
    set_sort(monkeypatch, 32)
    width = 2304
    lens = [width, 1500, topk + 3, topk + 1]
    keys = run_keys(len(lens), width, topk, longest, seed=topk + longest, top=top)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    keys[torch.arange(width)[None, :] >= lens_t[:, None].long()] = KEY_NONE
    keys, lens_t = keys.to(device), lens_t.to(device)
    got = select(keys, lens_t, topk, "rows", monkeypatch)
    assert unwritten_slots(got) == []
    assert_same_bits(got, select(keys, lens_t, topk, "torch", monkeypatch))


@pytest.mark.parametrize("bits", [64, 32])
def test_rows_lengths_past_the_matrix(bits, rows_way, monkeypatch, device):
    """Unchecked lengths below zero or past the matrix's width read no further than the row: the
    row select gives what the torch way gives (both clamp to the row), by either sort."""
    set_sort(monkeypatch, bits)
    width = 1280
    keys, _ = key_matrix("random", [width] * 3, width, device, seed=3)
    lens = torch.tensor([-5, width + 999, 2**31 - 1], dtype=torch.int32, device=device)
    got = select(keys, lens, TOPK, "rows", monkeypatch)
    assert unwritten_slots(got) == []
    assert got.counts.tolist() == [0, TOPK, TOPK]
    assert_same_bits(got, select(keys, lens, TOPK, "torch", monkeypatch))


@pytest.mark.parametrize("order", ["score", "position"])
@pytest.mark.parametrize("pattern", ["scores", "ties", "nan"])
def test_rows_of_a_matrix_one_tile_wide(pattern, order, rows_way, monkeypatch, device):
    """A matrix at most the tile wide compiles the one-tile path alone (``ONE_TILE``): lengths
    around topk, zero, below zero and past the matrix give the torch way's outputs, best first and
    by position."""
    width = legacy_backend.ROWS_TILE
    lens = [width, width - 3, TOPK + 1, TOPK, TOPK - 1, 3, 0]
    keys, _ = key_matrix(pattern, lens, width, device, seed=4)
    lens_t = torch.tensor(lens[:-2] + [-5, width + 999], dtype=torch.int32, device=device)
    got = select(keys, lens_t, TOPK, "rows", monkeypatch, order=order)
    assert unwritten_slots(got) == []
    want = select(keys, lens_t, TOPK, "torch", monkeypatch)
    assert_same_bits(got, by_position(want) if order == "position" else want)


def test_row_select_builds_compile_for_hopper():
    """The row select's build for rows of one tile in position order with the binned k-th search
    (``ONE_TILE``, what prefill chunks of up to 16K tokens take), and the longer rows' build with
    its pool in no particular order (``SET_POOL``), compile for sm_90 here, in a
    process without the interpreter (which runs only the branches a call takes, and does not
    check that a name bound in two branches has one type in both)."""
    from sm90_builds import compile_script

    script = """
from indexer_topk.backends import legacy as L
from indexer_topk.kernels.row_topk import topk_rows_kernel as f
for one_tile, bits, set_pool in ((True, 0, False), (False, 0, True)):
    const = dict(TOPK=1024, TILE=L.ROWS_TILE, SAMPLE=L.ROWS_SAMPLE, SORT_BITS=bits, BINS=L.ROWS_BINS,
                 CAND=L.ROWS_CAND, ONE_TILE=one_tile, SET_POOL=set_pool)
    sig = dict(report._signature(f, {}, constexprs=const), rows="i32")
    k = report._compile(f, sig, const, 90, L.ROWS_WARPS, 1, L.ROWS_MAXNREG)
    print(k.asm["ptx"].count("bar.sync") > 0)
"""
    assert compile_script(script, timeout=600).split() == ["True", "True"]


@pytest.mark.parametrize("bits", [64, 32])
def test_rows_topk_1024_and_more_rows_than_programs(bits, rows_way, monkeypatch, device):
    """topk 1024 over more rows than the persistent grid has programs (each program takes
    several rows in turn and reuses its pool and output rows), by either sort."""
    set_sort(monkeypatch, bits)
    width = 2560
    lens = [width - 13 * i for i in range(11)]
    keys, lens_t = key_matrix("random", lens, width, device, seed=5)
    got = select(keys, lens_t, 1024, "rows", monkeypatch)
    assert unwritten_slots(got) == []
    assert_same_bits(got, select(keys, lens_t, 1024, "torch", monkeypatch))


@pytest.mark.parametrize("topk,bits,set_pool", [(512, 64, None), (512, 32, None), (1024, 64, None), (1024, 32, None),
                                               (512, 32, 0), (1024, 64, 0)])
def test_rows_write_only_their_outputs(topk, bits, set_pool, rows_way, monkeypatch, device):
    """Output rows beside the selected ones (``row_start``) and the key matrix stay untouched,
    also where rows longer than the tile are at most ``2 * topk`` keys (the pools' size), by
    either sort (the 32-bit one writes its network order over the output row before the
    outputs), with the long rows' pool in either order (the unordered one's last entries are
    sorted back into the output row)."""
    set_sort(monkeypatch, bits)
    set_settings(monkeypatch, ROWS_SET_POOL_WIDTH=set_pool)
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


@pytest.mark.parametrize("way", ["rows", "torch"])
def test_selection_order_against_plain_torch(way, rows_way, monkeypatch, device):
    """The finish (:func:`.select.finalize_row`, which every way shares, so comparing ways cannot
    check it) against plain torch's stable order, every slot: rows of distinct keys, and rows
    where one pair of equal keys (at reversed positions, at the top, inside, at the k-th) or many
    equal keys enter the selection."""
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
    keys, lens = keys.to(device), lens.to(device)
    assert_expected_order(select(keys, lens, TOPK, way, monkeypatch), keys, lens, TOPK)


@pytest.mark.parametrize("row_start", [0, 3])
@pytest.mark.parametrize("way", ["rows", "torch"])
def test_keys_past_the_length_are_never_selected(way, row_start, rows_way, monkeypatch, device):
    """Keys past a row's length that are not ``KEY_NONE`` (the score stage writes ``KEY_NONE``
    there; a caller's own matrix need not), among them the row's best: each way selects from the
    row's first ``n`` keys alone, every slot as plain torch orders them, also for a chunk of rows
    past the first (``row_start``: its lengths are the contract's rows ``row_start ..``, the rows
    before it hold other lengths and keep their outputs)."""
    width = 1600
    lens = torch.tensor([width - 1, 1100, TOPK + 1, TOPK, 3, 0], dtype=torch.int32)
    gen = torch.Generator().manual_seed(5)
    keys = torch.randint(-(2**20), 2**20, (len(lens), width), generator=gen, dtype=torch.int32)
    past = torch.arange(width)[None, :] >= lens[:, None].long()
    keys[past] = 2**30 + torch.randint(0, 2**20, (int(past.sum()),), generator=gen, dtype=torch.int32)
    keys, lens = keys.to(device), lens.to(device)
    rows = len(lens)
    out = poisoned_result(row_start + rows, TOPK, device)
    full_lens = torch.cat([torch.full((row_start,), width, dtype=torch.int32, device=device), lens])
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", way)
    legacy_backend.legacy_select(keys, full_lens, page_table_for(row_start + rows, width, device), topk=TOPK,
                                 out=out, row_start=row_start)
    assert_expected_order(type(out)(*(t[row_start:] for t in out)), keys, lens, TOPK)
    for got, poison in zip(out, poisoned_result(row_start, TOPK, device)):
        assert torch.equal(got[:row_start].view(torch.int32), poison.view(torch.int32))


@pytest.mark.parametrize("way", ["rows", "torch", "split"])
@pytest.mark.parametrize("case", ["strided", "short", "2-D"])
def test_select_refuses_lengths_it_would_misread(case, way, rows_way, monkeypatch, device):
    """``legacy_select`` called directly (the public entry point checks ``seq_lens`` itself) with
    lengths the kernels would read at the wrong stride or past their end: ``ValueError`` naming
    ``seq_lens`` before any kernel runs, the outputs untouched."""
    rows, width = 4, 1024
    keys, lens = key_matrix("random", [width] * rows, width, device)
    bad = {"strided": torch.stack([lens, lens], 1).reshape(-1)[::2], "short": lens[: rows - 1],
           "2-D": lens[:, None]}[case]
    out = poisoned_result(rows + 1, TOPK, device)
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", way)
    with pytest.raises(ValueError, match="seq_lens"):
        legacy_backend.legacy_select(keys, bad, page_table_for(rows + 1, width, device), topk=TOPK, out=out,
                                     row_start=1 if case == "short" else 0)
    for got, poison in zip(out, poisoned_result(rows + 1, TOPK, device)):
        assert torch.equal(got.view(torch.int32), poison.view(torch.int32))


def test_kth_keys_from_each_rows_first_keys():
    """The torch way's k-th key and its count among the top k (``kth_keys``) against a sort of
    each row's first ``n`` keys (clamped to the row): keys past ``n`` above every other, equal
    keys at the k-th, ``INT32_MIN`` keys inside the length, lengths of 0, negative and past the
    row; rows of at most ``topk`` keys are not read by the select pass and are left out."""
    topk, width = 8, 40
    gen = torch.Generator().manual_seed(2)
    lens = torch.tensor([40, 39, 9, 8, 0, -3, 55, 20, 30], dtype=torch.int32)
    keys = torch.randint(-3, 3, (len(lens), width), generator=gen, dtype=torch.int32)
    keys[6, ::5] = torch.iinfo(torch.int32).min
    keys[7, :] = torch.iinfo(torch.int32).min  # every key of the row: the k-th is INT32_MIN
    keys[8, 30:] = 2**31 - 1  # the row's best keys, all past its length
    kth, need = legacy_backend.kth_keys(keys, topk, lens)
    for r, n in enumerate(lens.clamp(0, width).tolist()):
        if n <= topk:
            continue
        top = keys[r, :n].sort(descending=True).values[:topk]
        assert kth[r].item() == top[-1].item(), r
        assert need[r].item() == int((top == top[-1]).sum()), r
    assert kth.dtype == need.dtype == torch.int32


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
@pytest.mark.parametrize("bits", [64, 32])
@pytest.mark.parametrize("set_pool", [None, 0])
def test_rows_equal_torch_way_gpu(pattern, topk, bits, set_pool, monkeypatch, device):
    """DeepSeek-V4 widths on the GPU, the shipped tile and sample: 196,608-key rows (768K
    tokens), 16,384 and one tile, beside lengths around topk; by either sort, the long rows'
    pool in either order (``ROWS_SET_POOL_WIDTH``)."""
    set_sort(monkeypatch, bits)
    set_settings(monkeypatch, ROWS_SET_POOL_WIDTH=set_pool)
    width = 196608
    lens = [width, width - 1, 16384, 4096, 4095, topk + 1, topk, topk - 1, 1, 0] * 13
    keys, lens_t = key_matrix(pattern, lens, width, device, seed=topk)
    got = select(keys, lens_t, topk, "rows", monkeypatch)
    assert unwritten_slots(got) == []
    assert_same_bits(got, select(keys, lens_t, topk, "torch", monkeypatch))
