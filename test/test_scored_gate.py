"""The FP8 decode step with the gate ahead of the score kernel (``INDEXER_TOPK_SCORED_GATE``): the
gate's sample scored from the cache, the score kernel gathering its own span (backends/legacy.py,
``scored_split``), against the step it replaces (``legacy_score`` then ``split_select``: the
gate read from the key matrix, a gathering kernel of its own).

The two must agree on every bit they leave: the outputs, the key matrix, and the split select's
header of each row (gate, candidate count, histogram scale, how the row finished), since the
sampled keys have the matrix's bits. Outputs are poisoned first (every slot must be written);
a guard band past the scratch and the output rows beside the chunk must stay untouched.
"""

import dataclasses

import pytest
import torch

from indexer_topk.backends import legacy as legacy_backend
from indexer_topk.contract import IndexerTopKResult
from indexer_topk.guards import poisoned_result, unwritten_slots
from indexer_topk.kernels.split_topk import HEADER_FIELDS
from indexer_topk.kernels.launch import tile_config
from indexer_topk.workload import make_workload

from kernel_cases import ALL_PATTERNS, assert_bitwise, assert_contract, assert_matches_reference, decode_batch
from test_row_topk import force_way, set_settings
from test_split_topk import sample_rank

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

SENTINEL = 0x5A5A5A5A
GUARD = 4096  # int32 entries past the scratch that no launch may write


@pytest.fixture
def small_split(monkeypatch, device):
    """The split select with a tile, sample and block small enough for the interpreter, the gate
    ahead at any width."""
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MIN_WIDTH", 0)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_TOPKS", None)
    return force_way(monkeypatch, device, "split", SPLIT_TILE=1024, SPLIT_SAMPLE=1024, SPLIT_BLOCK=256)


def both_ways(wl, row_start=0, rows=None, group=1):
    """``(the gate ahead, four kernels)``: each ``(outputs, key matrix, scratch header)`` for rows
    ``row_start .. row_start + rows`` of the decode batch ``wl``, outputs poisoned first; ``group``:
    the score tile's rows (2: requests of two rows), in both ways."""
    inputs = wl.inputs()
    rows = wl.rows - row_start if rows is None else rows
    width = legacy_backend.key_matrix_width(wl.page_table)
    got = []
    for scored in (True, False):
        out = poisoned_result(wl.rows, wl.topk, wl.q.device)
        # the matrix as the front of a larger storage (legacy_indexer_topk's chunks): a guard row
        storage = torch.full((rows + 1, width), SENTINEL, dtype=torch.int32, device=wl.q.device)
        keys = storage[:rows]
        need = legacy_backend.split_scratch_size(rows, wl.topk)
        scratch = torch.full((need + GUARD,), SENTINEL, dtype=torch.int32, device=wl.q.device)
        if scored:
            legacy_backend.scored_split(inputs, keys, out=out, row_start=row_start, scratch=scratch[:need], group=group)
        else:
            legacy_backend.legacy_score(inputs, keys=keys, row_start=row_start, row_count=rows,
                                        rows_per_request=group)
            legacy_backend.split_select(keys, wl.seq_lens, wl.page_table, topk=wl.topk, out=out, row_start=row_start,
                                        scratch=scratch[:need])
        assert bool((scratch[need:] == SENTINEL).all()), "a write past the scratch"
        assert bool((storage[rows:] == SENTINEL).all()), "a write past the key matrix"
        header = scratch[: HEADER_FIELDS * rows].view(HEADER_FIELDS, rows).clone()
        got.append((out, keys, header))
    return got


def assert_same_step(wl, row_start=0, rows=None, ways=None, group=1):
    """The gate ahead and the four kernels (``ways``: :func:`both_ways`'s, run here when ``None``)
    agree on the key matrix, each row's header and the outputs; returns the outputs."""
    (out3, keys3, head3), (out4, keys4, head4) = both_ways(wl, row_start, rows, group) if ways is None else ways
    assert torch.equal(keys3, keys4), "key matrix"
    # the gate and scale of rows that took none (no longer than the tile) are left as they were
    lens = wl.seq_lens[row_start: row_start + keys3.shape[0]].clamp(0, keys3.shape[1]).cpu()
    long_rows = lens > legacy_backend.SPLIT_TILE
    for field, name in enumerate(("gate", "count", "scale", "how")):
        a, b = head3[field].cpu(), head4[field].cpu()
        mask = long_rows if name in ("gate", "scale") else torch.ones_like(long_rows)
        assert torch.equal(a[mask], b[mask]), f"{name}: {a.tolist()} vs {b.tolist()}"
    assert_bitwise(out3, out4, "the gate ahead vs four")
    return out3


DECODE_LENS = [5000, 4096, 1025, 1024, 129, 128, 127, 1, 0, 3000]


@pytest.mark.parametrize("pattern", ALL_PATTERNS)
def test_gate_ahead_gives_the_four_kernels_bits(pattern, small_split, device):
    """Ten one-row requests, lengths around the tile, topk, one and zero, on every score pattern
    (ties everywhere, zero plateaus, NaN rows, rising and falling scores): the same outputs, key
    matrix and header, and the fp64 reference's selection."""
    wl = make_workload("sglang_fp8", context_tokens=[4 * n for n in DECODE_LENS], rows_per_request=[1] * 10,
                       topk=128, seed=5, device=device, pattern=pattern)
    out = assert_same_step(wl)
    assert unwritten_slots(out) == []
    assert_contract(out, wl)
    if pattern in ("random", "increasing"):
        assert_matches_reference(out, wl)


@pytest.mark.parametrize("pattern", ["random", "increasing", "zero_plateau"])
def test_gate_ahead_with_a_binned_gate(pattern, small_split, monkeypatch, device):
    """The gate from one histogram of the sample (``SPLIT_GATE_BINS``) on both steps: the same
    gates, counts and bits, since the sampled keys have the matrix's bits."""
    monkeypatch.setattr(legacy_backend, "SPLIT_GATE_BINS", 256)
    wl = make_workload("sglang_fp8", context_tokens=[4 * n for n in DECODE_LENS], rows_per_request=[1] * 10,
                       topk=128, seed=6, device=device, pattern=pattern)
    out = assert_same_step(wl)
    assert unwritten_slots(out) == []
    if pattern != "zero_plateau":
        assert_matches_reference(out, wl)


def test_gate_ahead_with_the_short_sample(small_split, monkeypatch, device):
    """Where ``split_sample`` names the short sample, the gate ahead scores and gates from that
    many keys, as the four kernels do: the same gates, counts and bits, and each long row's gate
    the aimed rank's key of the short sample (scored keys stored for one sample and read as
    another, or a step sampling ``SPLIT_SAMPLE``, would give other gates)."""
    # on a GPU too: the rows past the tile, the short sample
    set_settings(monkeypatch, SPLIT_TILE=1024, SPLIT_SAMPLE=1024, SPLIT_SAMPLE_SHORT=256, SPLIT_SAMPLE_HITS=4)
    wl = make_workload("sglang_fp8", context_tokens=[4 * n for n in DECODE_LENS], rows_per_request=[1] * 10,
                       topk=128, seed=7, device=device)
    assert legacy_backend.split_sample(legacy_backend.key_matrix_width(wl.page_table), 128) == 256
    ways = both_ways(wl)
    out = assert_same_step(wl, ways=ways)
    assert unwritten_slots(out) == []
    assert_matches_reference(out, wl)
    _out, keys, header = ways[0]
    gates, keys = header[0].cpu(), keys.cpu()
    long_rows = [(r, n) for r, n in enumerate(DECODE_LENS) if n > 1024]
    assert len(long_rows) == 4
    for r, n in long_rows:
        sampled = keys[r, (torch.arange(256) * n) // 256].sort(descending=True).values
        assert int(gates[r]) == int(sampled[sample_rank(n, 128, 256) - 1]), (r, int(gates[r]))


def test_gate_ahead_on_a_chunk_of_rows(small_split, device):
    """Rows 2..4 of a batch (``row_start``): rows beside them keep their poison."""
    wl = make_workload("sglang_fp8", context_tokens=[8000, 20000, 6000, 300, 4200, 9000], rows_per_request=[1] * 6,
                       topk=128, seed=8, device=device)
    out = assert_same_step(wl, row_start=2, rows=3)
    assert unwritten_slots(IndexerTopKResult(*(t[2:5] for t in out))) == []
    for r in (0, 1, 5):
        assert_bitwise(IndexerTopKResult(*(t[r: r + 1] for t in out)), poisoned_result(1, wl.topk, device),
                       f"row {r}, outside the chunk")


MTP_LENS = [5000, 1025, 4096, 300, 3000]  # a request's last row; its draft row one shorter


def mtp_batch(device, pattern="random", seed=12, lens=MTP_LENS, topk=128):
    """Requests of two rows (a decode step with one draft row of multi-token prediction each):
    the rows of a request share its pages and differ in length by one position."""
    return make_workload("sglang_fp8", context_tokens=[4 * n for n in lens], rows_per_request=[2] * len(lens),
                         topk=topk, seed=seed, device=device, pattern=pattern)


@pytest.mark.parametrize("pattern", ["random", "increasing", "equal", "zero_plateau", "nan_rows"])
def test_gate_ahead_in_two_row_tiles(pattern, small_split, device):
    """Requests of two rows, a request a score tile (``group=2``), lengths around the tile and
    topk: the four-kernel step's outputs, key matrix and header (its score kernel in the same
    two-row tiles), and the fp64 reference's selection."""
    wl = mtp_batch(device, pattern)
    lens = wl.seq_lens.cpu().tolist()
    assert all(lens[2 * r] + 1 == lens[2 * r + 1] for r in range(len(MTP_LENS)))  # the draft row's length
    out = assert_same_step(wl, group=2)
    assert unwritten_slots(out) == []
    assert_contract(out, wl)
    if pattern in ("random", "increasing"):
        assert_matches_reference(out, wl)


def test_gate_ahead_in_two_row_tiles_off_the_requests(small_split, device):
    """Two-row tiles that straddle requests (a chunk starting at an odd row, so each tile holds the
    draft row of one request and the last row of the next, whose pages differ) and a chunk of an
    odd number of rows (its last tile one row): the rows are scored apart, the same bits, and
    rows beside the chunk keep their poison."""
    wl = mtp_batch(device, seed=14)
    for row_start, rows in ((1, 6), (0, 7), (3, 5)):
        out = assert_same_step(wl, row_start=row_start, rows=rows, group=2)
        inside = IndexerTopKResult(*(t[row_start: row_start + rows] for t in out))
        assert unwritten_slots(inside) == []
        for r in [r for r in range(wl.rows) if not row_start <= r < row_start + rows]:
            assert_bitwise(IndexerTopKResult(*(t[r: r + 1] for t in out)), poisoned_result(1, wl.topk, device),
                           f"row {r}, outside the chunk {row_start}+{rows}")


def test_gate_ahead_in_two_row_tiles_with_scattered_pages(small_split, device):
    """A request's two rows whose page-table rows differ (a caller's batch, not an engine's): the
    tile scores each row's own pages, the same bits as the four kernels."""
    wl = mtp_batch(device, seed=15, lens=[4000, 2600, 1500])
    pt = wl.page_table.clone()
    pt[1] = pt[1].flip(0)
    pt[3, : pt.shape[1] // 2] = pt[3, : pt.shape[1] // 2].roll(7)
    wl = dataclasses.replace(wl, page_table=pt)
    out = assert_same_step(wl, group=2)
    assert unwritten_slots(out) == []
    assert_matches_reference(out, wl)


def test_gate_ahead_in_two_row_tiles_on_garbage(small_split, device):
    """Requests of two rows with what the checks would refuse (lengths negative, past the page
    table, int32's extremes, the width exactly, rows of one request of different lengths far
    apart; page ids outside the cache): both ways read no further than the key matrix and the
    cache, the same bits, nothing written outside the outputs, the matrix and the scratch."""
    wl = mtp_batch(device, seed=18, lens=[5000, 3000, 2000, 4000])
    width = legacy_backend.key_matrix_width(wl.page_table)
    lens = [-5, width + 100, 2**31 - 1, width, -(2**31), 1025, 3000, 7]
    pt = wl.page_table.clone()
    pt[0, 3] = -7
    pt[1, 5] = wl.k_cache.shape[0] + 5
    pt[6:, ::4] = 2**31 - 1
    wl = dataclasses.replace(wl, seq_lens=torch.tensor(lens, dtype=torch.int32, device=device), page_table=pt)
    out = assert_same_step(wl, group=2)
    assert unwritten_slots(out) == []


@pytest.mark.parametrize("group,pattern", [(1, "random"), (1, "equal"), (1, "increasing"), (2, "random"),
                                           (2, "zero_plateau")])
def test_gathering_with_prefetch_gives_the_same_bits(group, pattern, small_split, monkeypatch, device):
    """``SPLIT_GATHER_PREFETCH = 1`` and ``SCORED_GATE_PREFETCH = 1`` (each block's keys loaded
    while the block before is appended, in the gathering kernel and inside the score kernel that
    gathers): both ways agree with each other and with the build without it (both 0): outputs,
    key matrix and headers, on runs of several blocks, a run's last block part full and rows no
    longer than the tile."""
    wl = (make_workload("sglang_fp8", context_tokens=[4 * n for n in DECODE_LENS], rows_per_request=[1] * 10,
                        topk=128, seed=19, device=device, pattern=pattern)
          if group == 1 else mtp_batch(device, pattern, seed=19))
    monkeypatch.setattr(legacy_backend, "SPLIT_GATHER_PREFETCH", 0)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_PREFETCH", 0)
    without = both_ways(wl, group=group)
    monkeypatch.setattr(legacy_backend, "SPLIT_GATHER_PREFETCH", 1)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_PREFETCH", 1)
    ahead = both_ways(wl, group=group)
    out = assert_same_step(wl, ways=ahead, group=group)
    assert unwritten_slots(out) == []
    for (o1, k1, h1), (o2, k2, h2), way in zip(without, ahead, ("the gate ahead", "four kernels")):
        assert torch.equal(k1, k2), way
        assert torch.equal(h1[1].cpu(), h2[1].cpu()), f"{way}: counts"
        assert_bitwise(o1, o2, f"{way}: prefetch against none")


@pytest.mark.parametrize("pattern", ["random", "increasing"])
def test_gathering_with_strided_slots_gives_the_same_bits(pattern, small_split, monkeypatch, device):
    """``SPLIT_GATHER_STRIDED = 1`` and ``SCORED_GATE_STRIDED = 1`` (a sparse block's entrants
    slotted in strided order, in the gathering kernel and inside the score kernel that gathers;
    the block wider than the programs' threads so the strided sum runs) against both 0: the
    buffer holds the same entrants in another order, and the finish ranks them to the same
    outputs, counts and key matrix, every slot written, in both ways. Random scores leave blocks
    sparse, rising scores dense ones (slotted by position); tied scores overflow the buffer and
    are selected again from the row, whatever the slots."""
    assert legacy_backend.SPLIT_BLOCK > 32 * tile_config("sglang_fp8").num_warps
    wl = make_workload("sglang_fp8", context_tokens=[4 * n for n in DECODE_LENS], rows_per_request=[1] * 10,
                       topk=128, seed=23, device=device, pattern=pattern)
    assert legacy_backend.SPLIT_BLOCK > 32 * legacy_backend.SPLIT_GATHER_WARPS
    monkeypatch.setattr(legacy_backend, "SPLIT_GATHER_STRIDED", 0)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_STRIDED", 0)
    by_position = both_ways(wl)
    monkeypatch.setattr(legacy_backend, "SPLIT_GATHER_STRIDED", 1)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_STRIDED", 1)
    strides = {}
    launch = legacy_backend.launch

    def spy(kernel, grid, *args, **kwargs):  # the stride each gathering kernel was built with
        strides[kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__] = kwargs.get("STRIDE")
        return launch(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(legacy_backend, "launch", spy)
    strided = both_ways(wl)
    assert strides.get("gather_rows_kernel") == 32 * legacy_backend.SPLIT_GATHER_WARPS, strides
    assert strides.get("gather_logits_kernel") == 32 * tile_config("sglang_fp8").num_warps, strides
    out = assert_same_step(wl, ways=strided)
    assert unwritten_slots(out) == []
    for (o1, k1, h1), (o2, k2, h2), way in zip(by_position, strided, ("the gate ahead", "four kernels")):
        assert torch.equal(k1, k2), way
        assert torch.equal(h1[1].cpu(), h2[1].cpu()), f"{way}: counts"
        assert_bitwise(o1, o2, f"{way}: strided slots against positions")


def test_gate_ahead_reads_no_page_outside_the_cache(small_split, device):
    """Page ids outside the cache (the checks off) score as zeros in both ways, the same bits,
    and write nothing outside the outputs and the scratch."""
    wl = make_workload("sglang_fp8", context_tokens=[6000, 5200], rows_per_request=[1, 1], topk=128, seed=9,
                       device=device)
    pt = wl.page_table.clone()
    pt[0, 3] = -7
    pt[0, 10] = wl.k_cache.shape[0] + 5
    pt[1, ::3] = 2**31 - 1
    wl = dataclasses.replace(wl, page_table=pt)
    out = assert_same_step(wl)
    assert unwritten_slots(out) == []


def test_gate_ahead_on_garbage_lengths(small_split, device):
    """Lengths the checks would refuse (negative, past the page table, int32's extremes, the
    width exactly, one past the tile): the rows are read no further than the key matrix's width
    in both ways, the same bits, and nothing is written outside the outputs, the matrix and the
    scratch."""
    wl = make_workload("sglang_fp8", context_tokens=[4 * 5000, 4 * 1100, 4 * 3000, 4 * 2000, 4 * 4000, 4 * 1025,
                                                     4 * 700],
                       rows_per_request=[1] * 7, topk=128, seed=11, device=device)
    width = legacy_backend.key_matrix_width(wl.page_table)
    lens = [-5, width + 100, 2**31 - 1, width, -(2**31), 1025, 700]
    wl = dataclasses.replace(wl, seq_lens=torch.tensor(lens, dtype=torch.int32, device=device))
    out = assert_same_step(wl)
    assert unwritten_slots(out) == []


def test_scored_split_refuses_what_its_kernels_cannot_serve(small_split, device):
    """Rows past the batch (lengths, page-table rows and queries read unmasked, output rows
    written), a matrix wider than the page table (sample positions past its rows), a group that
    is not 1 or the score tile's rows as a Python int, and MXFP4 keys (the sample is scored as
    FP8): refused before any launch."""
    wl = decode_like("sglang_fp8", device)
    width = legacy_backend.key_matrix_width(wl.page_table)
    out = poisoned_result(wl.rows, wl.topk, device)
    for rows, row_start, cols in ((3, 0, width), (2, 1, width), (1, -1, width), (2, 0, width + 64)):
        keys = torch.zeros((rows, cols), dtype=torch.int32, device=device)
        with pytest.raises(ValueError, match="scored_split"):
            legacy_backend.scored_split(wl.inputs(), keys, out=out, row_start=row_start)
    keys = torch.zeros((2, width), dtype=torch.int32, device=device)
    for group in (True, 2.0, 3, 0, None):  # True == 1 and 2.0 == 2 would reach the launch grid
        with pytest.raises(ValueError, match="a group of"):
            legacy_backend.scored_split(wl.inputs(), keys, out=out, group=group)
    mx = decode_like("sglang_mxfp4", device)
    keys = torch.zeros((2, legacy_backend.key_matrix_width(mx.page_table)), dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="sglang_fp8"):
        legacy_backend.scored_split(mx.inputs(), keys, out=out)
    assert unwritten_slots(out) == ["values", "raw_indices", "physical_indices", "counts"]


_GATHER_PTX = """
from indexer_topk.backends.legacy import SCORE_GATHER_MAXNREG
from indexer_topk.kernels.launch import pack_args, tile_config
from indexer_topk.kernels.logits import gather_logits_kernel
from indexer_topk.workload import make_workload
w = make_workload("sglang_fp8", context_tokens=[2000], rows_per_request=[1], topk=32, seed=0, device="cpu")
ka = pack_args(w.inputs(), launch=False)
cfg = tile_config(w.inputs().layout)
tensors = dict(q_ptr=ka.q, qs_ptr=ka.qs, w_ptr=ka.w, kc_ptr=ka.kc, kf_ptr=ka.kf, ks_ptr=ka.ks)
R = int(sys.argv[2])
c = dict(LAYOUT=ka.layout, TMA=True, INTERPRET=False, STAGES=cfg.logits_stages, TOPK=64, TILE=1024, BLOCK=256,
         BINS=64, PDL=True, R=R)
sig = report._signature(gather_logits_kernel, tensors, constexprs=c)
print(report._compile(gather_logits_kernel, sig, c, 90, cfg.num_warps, cfg.logits_stages,
                      SCORE_GATHER_MAXNREG * R).asm["ptx"])
"""


@pytest.mark.parametrize("rows", [1, 2])
def test_gathering_score_kernel_touches_the_gates_scratch_only_after_waiting(rows):
    """Compiled for sm_90 here (no device, no interpreter), ``PDL``, one-row and two-row tiles: the score kernel that
    gathers starts while the gate is taken, so every global access of its gathering (the gate,
    scale, count, bins and candidates the gate kernel clears or writes, and the keys read back)
    must follow its ``griddepcontrol.wait``, and the keys read back must follow a CTA barrier
    after the last store of the scoring. (test_pdl checks the wait against the first atomic only:
    a load of the gate hoisted above the wait would pass it.)"""
    import re
    from pathlib import Path

    from sm90_builds import compile_script

    ptx = compile_script(_GATHER_PTX, rows)
    files = {int(n): Path(name).name for n, name in re.findall(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', ptx, re.M)}
    mem = re.compile(r"\b(ld|st|atom|red|cp\.async)\.(?:[\w:]+\.)*?global|\bcp\.async\S*\.global")
    accesses, wait, barriers = [], [], []  # (line, op, source file of the innermost location)
    where = None
    for n, line in enumerate(ptx.splitlines()):
        loc = re.match(r"\s*\.loc\s+(\d+)\s", line)
        if loc:
            where = files.get(int(loc.group(1)))
        elif "griddepcontrol.wait" in line:
            wait.append(n)
        elif re.match(r"\s*bar\.sync\b", line):
            barriers.append(n)
        else:
            m = mem.search(line)
            if m and not line.lstrip().startswith("//"):
                accesses.append((n, m.group(0), where))
    assert len(wait) == 1, wait
    gather = [(n, op) for n, op, f in accesses if f == "split_topk.py"]
    assert gather and all(n > wait[0] for n, _ in gather), (wait, gather[:5])
    assert any(op.startswith("atom") for _, op in gather), "the gathering's count"
    score_stores = [n for n, op, f in accesses if op.startswith("st") and f in ("logits.py", "score.py")]
    assert score_stores and max(score_stores) < wait[0], "the scoring stores its keys before it waits"
    assert any(max(score_stores) < b < min(n for n, _ in gather) for b in barriers), "a barrier before the read-back"


def test_legacy_decode_takes_the_gate_ahead_when_asked(small_split, monkeypatch, device):
    """``INDEXER_TOPK_SCORED_GATE`` on: an FP8 decode call launches the sample's scoring, the
    gate, the score kernel that gathers, and the finish, with the four-kernel step's bits; off, unreadable, a
    prefill call (no ``rows_per_request=1``) and MXFP4 keys keep the four kernels."""
    launched = []
    real = legacy_backend.launch

    def spy(kernel, grid, *args, **kwargs):
        launched.append(kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__)
        return real(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(legacy_backend, "launch", spy)
    wl = decode_like("sglang_fp8", device)
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "1")
    ahead = legacy_backend.legacy_indexer_topk(wl.inputs(), rows_per_request=1)
    assert launched == ["score_sample_kernel", "gate_rows_kernel", "gather_logits_kernel", "finish_rows_kernel"]
    for raw, hint, layout in (("0", 1, "sglang_fp8"), ("maybe", 1, "sglang_fp8"), ("1", None, "sglang_fp8"),
                              ("1", 1, "sglang_mxfp4")):
        launched.clear()
        monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", raw)
        w = wl if layout == "sglang_fp8" else decode_like(layout, device)
        got = legacy_backend.legacy_indexer_topk(w.inputs(), rows_per_request=hint)
        assert launched == ["logits_kernel", "gate_rows_kernel", "gather_rows_kernel", "finish_rows_kernel"], (
            raw, hint, layout)
        if layout == "sglang_fp8":
            assert_bitwise(got, ahead, f"{raw} {hint}")


def test_gate_ahead_in_row_chunks(small_split, monkeypatch, device):
    """A key-matrix budget of two rows: each chunk of a five-row decode batch takes the gate
    ahead with its own ``row_start`` over the same storage, the four-kernel step's bits."""
    wl = make_workload("sglang_fp8", context_tokens=[20000, 6000, 17000, 400, 19000], rows_per_request=[1] * 5,
                       topk=128, seed=4, device=device)
    width = legacy_backend.key_matrix_width(wl.page_table)
    budget = 2 * width * 4
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "1")
    ahead = poisoned_result(wl.rows, wl.topk, device)
    starts = []
    real = legacy_backend.scored_split

    def spy(inputs, keys, **kw):
        starts.append((kw["row_start"], keys.shape[0]))
        return real(inputs, keys, **kw)

    monkeypatch.setattr(legacy_backend, "scored_split", spy)
    legacy_backend.legacy_indexer_topk(wl.inputs(), out=ahead, budget_bytes=budget, rows_per_request=1)
    assert starts == [(0, 2), (2, 2), (4, 1)]
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "0")
    four = legacy_backend.legacy_indexer_topk(wl.inputs(), rows_per_request=1)
    assert unwritten_slots(ahead) == []
    assert_bitwise(ahead, four, "the gate ahead in chunks of two rows")


def test_gate_ahead_replays(small_split, monkeypatch, device):
    """Three decode calls of one signature on fresh tensors (the second and third replay the
    first's recorded launches, the sample's scoring with no PDL attribute among them): each
    the four-kernel step's bits."""
    import indexer_topk as it
    from indexer_topk import api

    api._KNOWN.clear()
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "1")
    try:
        for seed, pattern in ((1, "random"), (2, "equal"), (3, "increasing")):
            wl = make_workload("sglang_fp8", context_tokens=[20000, 17600, 2400], rows_per_request=[1, 1, 1], topk=512,
                               seed=seed, device=device, pattern=pattern)
            out = poisoned_result(wl.rows, wl.topk, device)
            it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy", out=out, check_values=False,
                            rows_per_request=1)
            monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "0")
            assert_bitwise(out, legacy_backend.legacy_indexer_topk(wl.inputs(), rows_per_request=1), f"call {seed}")
            monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "1")
        replays = [c.replays.get("legacy") for c in api._KNOWN._calls.values() if "legacy" in c.replays]
        assert len(replays) == 1 and replays[0] is not None, "one signature, replayed"
    finally:
        api._KNOWN.clear()


def decode_like(layout, device):
    return make_workload(layout, context_tokens=[5000, 4400], rows_per_request=[1, 1], topk=128, seed=2, device=device)


def test_scored_gate_way(monkeypatch):
    """Only FP8 decode chunks the split select serves, at least the width set, with the switch on
    (and a topk whose candidate region holds the sample: ``test_gate_edges.py``)."""
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MIN_WIDTH", 1024)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_NARROW", None)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_TOPKS", None)
    wl = make_workload("sglang_fp8", context_tokens=[256, 256], rows_per_request=[1, 1], topk=128, seed=0,
                       device="cpu")
    inputs = wl.inputs()
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "1")
    assert legacy_backend.scored_gate_way(inputs, 1, 2, 1024)
    assert not legacy_backend.scored_gate_way(inputs, None, 2, 1024)
    assert not legacy_backend.scored_gate_way(inputs, 1, 0, 1024)
    assert not legacy_backend.scored_gate_way(inputs, 1, 2, 0)
    assert not legacy_backend.scored_gate_way(inputs, 1, 2, 1023)  # narrower than the width set
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_NARROW", ((2, 2, 1000),))
    assert legacy_backend.scored_gate_way(inputs, 1, 2, 1023)  # in a band
    assert not legacy_backend.scored_gate_way(inputs, 1, 3, 1023)  # past the band's rows
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_NARROW", None)
    assert not legacy_backend.scored_gate_way(inputs, 1, legacy_backend.ROWS_MIN_ROWS, 1024)  # the rows way
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_TOPKS", (512, 1024))
    assert not legacy_backend.scored_gate_way(inputs, 1, 2, 1024)  # not a topk of the set
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_TOPKS", (128,))
    assert legacy_backend.scored_gate_way(inputs, 1, 2, 1024)
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "0")
    assert not legacy_backend.scored_gate_way(inputs, 1, 2, 1024)



def test_scored_gate_way_for_requests_of_two_rows(monkeypatch):
    """Requests of two rows take the gate ahead in two-row tiles while ``SCORED_GATE_MAX_ROWS`` is
    2, not at 1, and never requests of three (no tile holds them); the width and batch rule reads
    the requests, not the rows."""
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MIN_WIDTH", 1024)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_NARROW", None)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_TOPKS", None)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MAX_ROWS", 2)
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "1")
    wl = make_workload("sglang_fp8", context_tokens=[256, 256], rows_per_request=[2, 2], topk=128, seed=0,
                       device="cpu")
    inputs = wl.inputs()
    assert legacy_backend.scored_gate_group(inputs, 1) == 1
    assert legacy_backend.scored_gate_group(inputs, 2) == 2
    assert legacy_backend.scored_gate_group(inputs, 3) is None
    assert legacy_backend.scored_gate_group(inputs, None) is None
    assert legacy_backend.scored_gate_way(inputs, 2, 4, 1024)
    assert not legacy_backend.scored_gate_way(inputs, 3, 3, 1024)
    assert not legacy_backend.scored_gate_way(inputs, 2, 4, 1023)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_NARROW", ((1, 2, 1000),))
    assert legacy_backend.scored_gate_way(inputs, 2, 4, 1023)  # two requests, in the band
    assert not legacy_backend.scored_gate_way(inputs, 2, 6, 1023)  # three requests, past it
    assert not legacy_backend.scored_gate_way(inputs, 1, 4, 1023)  # four one-row requests, past it
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MAX_ROWS", 1)
    assert legacy_backend.scored_gate_group(inputs, 2) is None
    assert not legacy_backend.scored_gate_way(inputs, 2, 4, 1024)
    assert legacy_backend.scored_gate_way(inputs, 1, 2, 1024)
    mx = make_workload("sglang_mxfp4", context_tokens=[256], rows_per_request=[2], topk=128, seed=0, device="cpu")
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MAX_ROWS", 2)
    assert legacy_backend.scored_gate_group(mx.inputs(), 2) is None


@pytest.mark.parametrize("value", [0, -1, True, 2.0, None, "2"])
def test_scored_gate_max_rows_refused_by_name(value, monkeypatch):
    """A ``SCORED_GATE_MAX_ROWS`` the rule cannot read is refused by name, not read as a row count."""
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MAX_ROWS", value)
    wl = make_workload("sglang_fp8", context_tokens=[256], rows_per_request=[2], topk=128, seed=0, device="cpu")
    with pytest.raises(ValueError, match="SCORED_GATE_MAX_ROWS"):
        legacy_backend.scored_gate_group(wl.inputs(), 2)
    with pytest.raises(ValueError, match="SCORED_GATE_MAX_ROWS"):
        legacy_backend.legacy_indexer_topk(wl.inputs(), rows_per_request=2)


def test_legacy_decode_of_two_row_requests_takes_the_gate_ahead(small_split, monkeypatch, device):
    """Requests of two rows (``rows_per_request=2``) with ``SCORED_GATE_MAX_ROWS = 2`` launch the
    sample's scoring, the gate, the score kernel that gathers in two-row tiles and the finish; at
    the shipped 1 the four kernels, the same bits."""
    shipped = legacy_backend.SCORED_GATE_MAX_ROWS
    assert shipped == 1
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MAX_ROWS", 2)
    launched = []
    real = legacy_backend.launch

    def spy(kernel, grid, *args, **kwargs):
        launched.append((kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__, kwargs.get("R")))
        return real(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(legacy_backend, "launch", spy)
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "1")
    wl = mtp_batch(device, seed=16, lens=[5000, 2400])
    ahead = legacy_backend.legacy_indexer_topk(wl.inputs(), rows_per_request=2)
    assert launched == [("score_sample_kernel", None), ("gate_rows_kernel", None), ("gather_logits_kernel", 2),
                        ("finish_rows_kernel", None)]
    launched.clear()
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MAX_ROWS", shipped)
    four = legacy_backend.legacy_indexer_topk(wl.inputs(), rows_per_request=2)
    assert launched == [("logits_kernel", 2), ("gate_rows_kernel", None), ("gather_rows_kernel", None),
                        ("finish_rows_kernel", None)]
    assert unwritten_slots(ahead) == []
    assert_bitwise(ahead, four, "two-row requests, the gate ahead against the four kernels")


@pytest.mark.parametrize("rows,width,ahead", [
    (1, 16384, False), (8, 16384, False), (16, 16384, False), (1, 8192, False), (32, 8192, False),
    (1, 32768, True), (4, 32768, True), (6, 32768, True), (8, 32768, True), (11, 32768, True), (12, 32768, True),
    (64, 32768, True), (65, 32768, False), (128, 32768, False), (1, 32767, False), (12, 32767, False),
    (128, 40960, True),
    (129, 40959, False), (8, 40960, True), (1, 40960, True), (64, 65536, True), (8, 196608, True),
])
def test_scored_gate_by_width_and_batch(rows, width, ahead):
    """The shipped rule places the gate ahead where it measured faster, L2-cold: every chunk from
    160K tokens (40,960 positions), one to 64 requests from 128K; not at more requests of 128K
    (even at 128), nor at 64K (slower at 8, even at 16) or 32K (even at 32). The band's and the
    width's edges on both sides."""
    assert legacy_backend.scored_gate_measured_faster(rows, width) is ahead


def test_scored_gate_bands_switched_off(monkeypatch):
    """``SCORED_GATE_NARROW = None`` (or no band) leaves the width alone: the bands' shapes go
    after the score kernel, the width's still ahead of it; a band without a most rows holds any
    batch from its fewest."""
    for bands in (None, ()):
        monkeypatch.setattr(legacy_backend, "SCORED_GATE_NARROW", bands)
        assert not legacy_backend.scored_gate_measured_faster(12, 32768)
        assert not legacy_backend.scored_gate_measured_faster(64, 32768)
        assert legacy_backend.scored_gate_measured_faster(8, legacy_backend.SCORED_GATE_MIN_WIDTH)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_NARROW", ((3, None, 100),))
    assert not legacy_backend.scored_gate_measured_faster(2, 100)
    assert legacy_backend.scored_gate_measured_faster(3, 100)
    assert legacy_backend.scored_gate_measured_faster(10 ** 6, 100)
    assert not legacy_backend.scored_gate_measured_faster(3, 99)


# ---------------------------------------------------------------------------------------------
# GPU: the shipped tile, sample and block at DeepSeek-V4 decode widths
# ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("topk", [512, 1024, 2048])
def test_gate_ahead_gives_the_four_kernels_bits_gpu(topk, monkeypatch, device):
    """A decode batch of eight requests up to 128K tokens with scattered pages."""
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", "split")
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MIN_WIDTH", 0)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_TOPKS", None)
    wl = decode_batch("sglang_fp8", 7, device, topk=topk)
    out = assert_same_step(wl)
    assert unwritten_slots(out) == []
    assert_contract(out, wl)


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["increasing", "decreasing", "equal", "zero_plateau", "nan_rows"])
@pytest.mark.parametrize("shape", [(1, 786432), (8, 786432), (64, 16384)], ids=["1x768K", "8x768K", "64x16K"])
def test_gate_ahead_on_adversarial_scores_gpu(pattern, shape, monkeypatch, device):
    requests, tokens = shape
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", "split")
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MIN_WIDTH", 0)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_TOPKS", None)
    wl = make_workload("sglang_fp8", context_tokens=[tokens] * requests, rows_per_request=[1] * requests, topk=1024,
                       seed=13, device=device, pattern=pattern)
    out = assert_same_step(wl)
    assert unwritten_slots(out) == []


@pytest.mark.gpu
def test_mixed_batch_gate_ahead_gpu(monkeypatch, device):
    """64 requests of 4K to 768K tokens, the serving mix's mixed batch, through the operator
    with the switch on against off."""
    import indexer_topk as it

    lens = [4096 + (786432 - 4096) * i // 63 for i in range(64)]
    wl = make_workload("sglang_fp8", context_tokens=lens, rows_per_request=[1] * 64, topk=1024, seed=0, device=device)
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "0")
    four = it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy", rows_per_request=1)
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "1")
    ahead = it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy", rows_per_request=1)
    assert_bitwise(ahead, four, "mixed batch")


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["random", "increasing", "equal", "nan_rows"])
@pytest.mark.parametrize("shape", [(1, 786432), (8, 786432), (32, 131072)], ids=["1x768K", "8x768K", "32x128K"])
def test_gate_ahead_in_two_row_tiles_gpu(pattern, shape, monkeypatch, device):
    """Requests of two rows (one draft row each) at DeepSeek-V4 decode widths, a request a tile:
    the four-kernel step's bits, every slot written."""
    requests, tokens = shape
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", "split")
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MIN_WIDTH", 0)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_TOPKS", None)
    wl = make_workload("sglang_fp8", context_tokens=[tokens - 4096 * r for r in range(requests)],
                       rows_per_request=[2] * requests, topk=1024, seed=17, device=device, pattern=pattern)
    out = assert_same_step(wl, group=2)
    assert unwritten_slots(out) == []
