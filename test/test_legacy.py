"""The legacy backend (score matrix + exact top-k) against the fp64 reference and its contract.

Small topk and short contexts keep these fast under the Triton interpreter; on a GPU the same
tests run compiled. Tests marked ``gpu`` use DeepSeek-V4 shapes and need a CUDA device.
"""

import pytest
import torch

from indexer_topk.backends.legacy import key_matrix_width, legacy_indexer_topk, legacy_score
from indexer_topk.contract import (
    KEY_NAN, KEY_NONE, PAGE_SIZE, SUPPORTED_TOPK, ordered_score_bits, scores_from_ordered_bits,
)
from indexer_topk.guards import GuardedResult, GuardedWorkspace, poisoned_result

from kernel_cases import (
    DETERMINISM_CASE,
    LAYOUTS,
    Case,
    assert_bitwise,
    assert_contract,
    assert_matches_reference,
    build,
    check_legacy,
    edge_length_case,
    gpu_128k_case,
    gpu_adversarial_case,
    legacy_result,
    mixed_requests_case,
    nonfinite_case,
    pattern_cases,
    reference_result,
    reversed_pages_case,
    run_legacy,
    unreversed,
    without_rows,
)

PATTERN_CASES = pattern_cases()


# ---------------------------------------------------------------------------------------------
# Against the reference
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", PATTERN_CASES, ids=str)
def test_matches_reference(case, device):
    """Every layout on random and zero-plateau scores, every adversarial pattern on one layout:
    the legacy outputs agree with the fp64 reference and satisfy the contract."""
    check_legacy(case, device)


def test_key_matrix_is_the_contract_encoding(device):
    """The kernels' order keys are the host's (one encoding): the score kernel writes KEY_NAN
    for NaN scores and KEY_NONE past a row's length, every other key survives a host decode and
    re-encode, and the selected values are the host decode of each row's best keys."""
    from indexer_topk.kernels import common

    assert (common.KEY_MIN.value, common.KEY_NAN.value) == (KEY_NONE, KEY_NAN)
    case = next(c for c in PATTERN_CASES if c.pattern == "nan_rows")
    wl = build(case, device)
    keys = legacy_score(wl.inputs()).cpu()
    lens = wl.seq_lens.cpu().long()
    live = torch.arange(keys.shape[1])[None, :] < lens[:, None]
    assert bool((keys[~live] == KEY_NONE).all()) and bool((~live).any())
    nan_rows = torch.isnan(wl.weights[:, 0].float()).cpu()
    assert bool(nan_rows.any()) and bool((keys[nan_rows][live[nan_rows]] == KEY_NAN).all())
    assert torch.equal(ordered_score_bits(scores_from_ordered_bits(keys[live])), keys[live])
    assert bool((scores_from_ordered_bits(keys[~live]) == float("-inf")).all())
    res = legacy_result(case, device)
    for r in range(wl.rows):
        n = int(res.counts[r])
        best = keys[r].sort(descending=True).values[:n]
        got = res.values[r, :n].cpu().view(torch.int32)
        if lens[r] > wl.topk:
            assert torch.equal(got, scores_from_ordered_bits(best).view(torch.int32)), f"row {r}"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_edge_lengths(layout, device):
    """Empty rows, rows shorter than, equal to and one longer than topk, and an odd row count."""
    case = edge_length_case(layout)
    _, res = check_legacy(case, device)
    assert res.counts.tolist() == [0, 31, 32, 32, 32, 1, 0, 32, 32]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rows_of_different_requests_share_a_pair(layout, device):
    """One-row requests: each row pair spans two page tables and two lengths."""
    case = mixed_requests_case(layout)
    check_legacy(case, device)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reversed_page_order(layout, device):
    """A row whose pages run in reverse physical order selects the same positions and scores as
    with the original pages, and maps them through its own page table."""
    case = reversed_pages_case(layout)
    wl, res = check_legacy(case, device)
    plain = legacy_result(unreversed(case), device)
    for name in ("values", "raw_indices", "counts"):
        a, b = getattr(res, name), getattr(plain, name)
        if name == "values":
            a, b = a.view(torch.int32), b.view(torch.int32)
        assert torch.equal(a, b), f"{name} changed with the page order"
    plain_pages = build(unreversed(case), device).k_cache.shape[0]
    for row in case.reverse_rows:
        # the row reads new pages, in descending physical order, through its own page table
        n_pages = -(-int(wl.seq_lens[row]) // PAGE_SIZE)
        pages = wl.page_table[row, :n_pages].long().cpu()
        assert int(pages.min()) >= plain_pages
        assert torch.equal(pages, torch.arange(int(pages[0]), int(pages[0]) - n_pages, -1))
        raw = res.raw_indices[row].long()
        want = wl.page_table[row].long()[raw // PAGE_SIZE] * PAGE_SIZE + raw % PAGE_SIZE
        assert torch.equal(res.physical_indices[row].long(), want)
        assert not torch.equal(res.physical_indices[row], plain.physical_indices[row])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's inf * 0
def test_nonfinite_scores(device):
    """Key scales of +inf, -inf and NaN give scattered +-inf and NaN scores: infinities tied at the
    selection boundary go to the lower positions, NaN ranks below -inf, and a short row lists
    its -inf and NaN scores in place."""
    case = nonfinite_case()
    wl, res = check_legacy(case, device)
    short = res.values[3, : wl.topk - 1]
    assert bool(torch.isnan(short).any()) and bool((short == float("-inf")).any())


def supported_topk_case(topk: int) -> Case:
    """Two rows a little longer than ``topk`` (one request) and one shorter row (another)."""
    return Case(f"supported-topk{topk}", "sglang_fp8", context_tokens=(4 * topk + 600, 2000),
                rows_per_request=(2, 1), topk=topk, seed=31)


@pytest.mark.parametrize("topk", SUPPORTED_TOPK)
def test_supported_topk_on_long_rows(topk, device):
    """Every topk the API takes, on rows longer than it: at 2048 the final sort holds more keys
    than the interpreter's rank count fits in one Triton block, so it counts piece by piece."""
    wl, res = check_legacy(supported_topk_case(topk), device)
    assert int(wl.seq_lens.max()) > topk and int(wl.seq_lens.min()) < topk


def test_all_rows_shorter_than_topk(device):
    """topk wider than the whole logits matrix: every row returns positions 0..seq_len-1."""
    case = Case("short-topk256", "sglang_fp8", context_tokens=(500, 400, 4), rows_per_request=(2, 1, 1), topk=256)
    wl = build(case, device)
    assert key_matrix_width(wl.page_table) < case.topk
    res = legacy_result(case, device)
    assert_contract(res, wl)
    assert_matches_reference(res, wl, reference_result(case, device))


def test_zero_rows(device):
    """A call without rows returns empty outputs."""
    wl = build(mixed_requests_case("sglang_mxfp4"), device)
    res = legacy_indexer_topk(without_rows(wl))
    assert res.values.shape == (0, wl.topk) and res.raw_indices.shape == (0, wl.topk)
    assert res.counts.shape == (0,)


# ---------------------------------------------------------------------------------------------
# Chunking and the caller-owned workspace
# ---------------------------------------------------------------------------------------------

def test_tiny_budget_chunks_rows(device):
    """A logits budget of one byte forces two-row chunks (the last one a single row): the
    outputs are bit-identical to a single chunk."""
    case = edge_length_case("aiter_mxfp4")
    wl = build(case, device)
    whole = legacy_result(case, device)
    chunked = run_legacy(wl, budget_bytes=1)
    assert_bitwise(chunked, whole, "chunked by two rows")
    chunked3 = run_legacy(wl, budget_bytes=3 * key_matrix_width(wl.page_table) * 4 + 1)
    assert_bitwise(chunked3, whole, "budget of three rows")


def test_caller_workspace_and_guards(device):
    """A caller-owned workspace of two rows of logits (so four chunks for seven rows) inside a
    guarded buffer: identical outputs, and not a byte written outside the workspace."""
    case = mixed_requests_case("sglang_mxfp4")
    wl = build(case, device)
    nbytes = 2 * key_matrix_width(wl.page_table) * 4
    ws = GuardedWorkspace(nbytes, device)
    res = run_legacy(wl, workspace=ws.workspace, budget_bytes=64)
    ws.assert_guards_intact()
    assert_bitwise(res, legacy_result(case, device), "two-row workspace")


# ---------------------------------------------------------------------------------------------
# Preallocated outputs
# ---------------------------------------------------------------------------------------------

def test_poisoned_outputs_are_overwritten(device):
    """Outputs prefilled with sentinels: every element is written, padding past counts is
    -1 / -inf, and the result is bit-identical to a fresh call."""
    case = edge_length_case("sglang_fp8")
    wl = build(case, device)
    out = poisoned_result(wl.rows, wl.topk, device)
    res = run_legacy(wl, out=out)
    assert res.values.data_ptr() == out.values.data_ptr()
    assert_contract(out, wl)
    assert_bitwise(out, legacy_result(case, device), "into poisoned outputs")


def test_output_guard_bands(device):
    """Outputs that are slices of larger sentinel buffers: nothing outside them is written."""
    case = mixed_requests_case("aiter_mxfp4")
    wl = build(case, device)
    g = GuardedResult(wl.rows, wl.topk, device)
    run_legacy(wl, out=g.out, budget_bytes=1)
    g.assert_guards_intact()
    assert_contract(g.out, wl)
    assert_bitwise(g.out, legacy_result(case, device), "into guarded outputs")


def test_deterministic(device):
    """Five calls on a tie-heavy workload give bit-identical outputs."""
    wl = build(DETERMINISM_CASE, device)
    first = run_legacy(wl)
    for i in range(4):
        assert_bitwise(run_legacy(wl), first, f"repeat {i + 1}")


# ---------------------------------------------------------------------------------------------
# GPU: DeepSeek-V4 shapes
# ---------------------------------------------------------------------------------------------

GPU_TOPKS = [512, 1024, 2048]


@pytest.mark.gpu
@pytest.mark.parametrize("topk", GPU_TOPKS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_128k_matches_reference(layout, topk, device):
    """A 128K-token context (two requests, nine rows): legacy agrees with the reference."""
    case = gpu_128k_case(layout, topk)
    check_legacy(case, device)


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["increasing", "equal", "zero_plateau", "nan_rows"])
def test_gpu_adversarial_full_shape(pattern, device):
    """64 rows of a 256K-token request under adversarial score patterns: legacy agrees with the
    reference."""
    case = gpu_adversarial_case(pattern)
    check_legacy(case, device)


@pytest.mark.gpu
def test_gpu_chunked_matches_whole(device):
    """A budget of four rows of logits gives the same bits as one chunk on long rows."""
    case = Case("gpu-chunk", "sglang_fp8", context_tokens=(131072,), rows_per_request=(13,), topk=2048, seed=12)
    wl = build(case, device)
    whole = run_legacy(wl)
    chunked = run_legacy(wl, budget_bytes=4 * key_matrix_width(wl.page_table) * 4)
    assert_bitwise(chunked, whole, "chunked by four rows")
    assert_contract(whole, wl)


@pytest.mark.gpu
def test_gpu_deterministic(device):
    """100 calls on a moderate configuration give bit-identical outputs."""
    case = Case("gpu-det", "aiter_mxfp4", context_tokens=(65536, 32768), rows_per_request=(8, 8), topk=2048, seed=13)
    wl = build(case, device)
    first = run_legacy(wl)
    for i in range(99):
        assert_bitwise(run_legacy(wl), first, f"repeat {i + 1}")


@pytest.mark.parametrize("case", [
    dict(requests=1, rows=1, tokens=3000),  # a decode row: the split select
    dict(requests=3, rows=1, tokens=5000),
    dict(requests=1, rows=3, tokens=18000, row_select=True),  # the row select's pools: rows past its tile
    dict(requests=1, rows=3, tokens=900, row_select=True),  # one tile a row: no pools
])
def test_legacy_scratch_bytes_is_what_a_call_allocates(case, monkeypatch):
    """legacy_scratch_bytes (the memory a legacy call, or a graph capturing it, holds) against the
    allocations a recording of the call sees (a call of one chunk: the chunks of a longer one
    may reuse each other's scratch, which a recording refuses)."""
    from indexer_topk.backends import legacy
    from indexer_topk.contract import allocate_result
    from indexer_topk.replay import Recorder, _Alloc
    from indexer_topk.workload import make_workload

    if case.get("row_select"):
        monkeypatch.setattr(legacy, "ROWS_MIN_ROWS", 2)
    w = make_workload("sglang_fp8", context_tokens=[case["tokens"]] * case["requests"],
                      rows_per_request=[case["rows"]] * case["requests"], topk=512, seed=3)
    out = allocate_result(w.rows, w.topk, "cpu")
    with Recorder((*w.args(), *out, None)) as rec:
        legacy_indexer_topk(w.inputs(), out=out)
    allocated = sum(s.nbytes for s in rec.steps if isinstance(s, _Alloc))
    assert rec.why_not is None
    assert legacy.legacy_scratch_bytes(w.rows, w.page_table.shape[1], w.topk, 4) == allocated


# ---------------------------------------------------------------------------------------------
# The score tile's head sums
# ---------------------------------------------------------------------------------------------

# (rows a tile, warps) of the score kernel: the layout's tile (prefill), one row a tile (decode
# batches), and the wider tiles benchmark/research/score_rows.py timed (slower; same bits)
SCORE_TILES = ((2, 4), (1, 4), (2, 8), (4, 4), (4, 8))


def test_score_tiles_sum_heads_in_the_same_order():
    """The score kernel compiled for sm_90 (no GPU needed) at every tile of ``SCORE_TILES``: in the
    layout each head sum reduces (the MMA's result reshaped to ``[keys, rows, heads]``), a row's
    heads take the same register and lane bases in the same order, and no warp holds part of a
    row's heads. So the in-thread sums and the lane shuffles add a row's 64 products in one order
    at every tile, which is why a decode batch's one-row tiles give the bits of prefill's two-row
    tile (the GPU tests compare the two paths' outputs; ``score_rows.py`` compared every tile's key
    matrix on an H100)."""
    import json

    from sm90_builds import compile_script

    script = """
import json, re
tiles = json.loads(sys.argv[2])
from indexer_topk.kernels.launch import pack_args, tile_config
from indexer_topk.kernels.logits import logits_kernel as f
from indexer_topk.workload import make_workload
w = make_workload("sglang_fp8", context_tokens=[2000], rows_per_request=[2], topk=32, seed=0, device="cpu")
ka = pack_args(w.inputs(), launch=False)
tensors = dict(q_ptr=ka.q, qs_ptr=ka.qs, w_ptr=ka.w, kc_ptr=ka.kc, kf_ptr=ka.kf, ks_ptr=ka.ks)
cfg = tile_config("sglang_fp8")
out = {}
for rows, warps in tiles:
    const = dict(LAYOUT=ka.layout, R=rows, TMA=True, INTERPRET=False, STAGES=cfg.logits_stages)
    k = report._compile(f, report._signature(f, tensors, constexprs=const), const, 90, warps, cfg.logits_stages)
    ir = k.asm["ttgir"]
    names = re.findall(r'"tt.reduce"\\(%[\\w.]+\\) <\\{axis = 2 : i32\\}>.*?\\}\\) : \\(tensor<64x\\d+x64xf32, #(\\w+)>\\)', ir, re.S)
    bases = []
    for name in names:
        text = re.search(r"^#" + name + r" = (.*)$", ir, re.M).group(1)
        bases.append({kind: json.loads(re.search(kind + r" = (\\[.*?\\]\\])", text).group(1))
                      for kind in ("register", "lane", "warp")})
    out[f"{rows}:{warps}"] = bases
print(json.dumps(out))
"""
    layouts = json.loads(compile_script(script, json.dumps(SCORE_TILES)).strip().splitlines()[-1])

    def head_order(b):
        """The head components of a layout's bases, each with its place among its kind's bases
        (registers: the order alone, since a thread sums its registers in index order)."""
        for kind in ("register", "lane", "warp"):
            assert all(v[2] == 0 or (v[0] == 0 and v[1] == 0) for v in b[kind]), f"a {kind} basis mixes heads"
        regs = [v[2] for v in b["register"] if v[2]]
        lanes = [(i, v[2]) for i, v in enumerate(b["lane"]) if v[2]]
        warps = [v[2] for v in b["warp"] if v[2]]
        return regs, lanes, warps

    first = None
    for tile, per_reduce in layouts.items():
        assert len(per_reduce) == 2, f"{tile}: expected the two spans' head sums, found {len(per_reduce)}"
        for b in per_reduce:
            got = head_order(b)
            assert got[2] == [], f"{tile}: a warp holds part of a row's heads"
            assert sorted(got[0] + [h for _, h in got[1]]) == [1, 2, 4, 8, 16, 32], f"{tile}: {got}"
            first = first or got
            assert got == first, f"{tile}: heads in {got}, the layout tile's in {first}"
