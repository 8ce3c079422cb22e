"""Hostile settings of the legacy decode step: the split select's spread (``split_spread``,
``SPLIT_SPREAD_HALVES``), its gate's sample (``split_sample``: ``SPLIT_SAMPLE``,
``SPLIT_SAMPLE_SHORT``, ``SPLIT_SAMPLE_HITS``), the one-row score span (``SCORE_MIN_SPAN_ONE_ROW``),
the gate kernels' warps (``SPLIT_GATE_WARPS``, ``SCORED_GATE_WARPS``), the row select's sort
(``ROWS_SORT_BITS``, ``ROWS_NARROW_MIN_ROWS``, ``ROWS_NARROW_MIN_ROWS_LONG``) and k-th search
(``ROWS_BINS``, ``ROWS_CAND``), ``KTH_SEARCH``,
the research script's ``--configs`` parser that overrides them, and every environment variable
of the package.

A setting or variable either takes effect as documented or is refused with an error (an
unreadable variable: a warning) naming it; none silently changes the path or the bits. The
end-to-end calls go through :func:`indexer_topk.indexer_topk` with ``backend="legacy"`` and
``rows_per_request=1`` at topk 2048, outputs poisoned first. The fp64 reference rounds each
score once from float64 and the kernels accumulate in fp32, so the values differ from it in
their last bits by design: the bit-for-bit oracle is the legacy backend's ``torch`` way (the
k-th key by ``torch.topk``, then one exact pass: no gate, no bins, no spread), and the reference
is held to the repository's kernel-vs-reference rule.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from pathlib import Path

import pytest
import torch

import indexer_topk as it
from indexer_topk import api
from indexer_topk.backends import legacy as legacy_backend
from indexer_topk.backends.key_matrix import chunk_rows, key_matrix_bytes
from indexer_topk.contract import IndexerTopKResult, PAGE_SIZE, SUPPORTED_TOPK
from indexer_topk.envs import envs
from indexer_topk.guards import poisoned_result, unwritten_slots
from indexer_topk.kernels import launch as launch_mod
from indexer_topk.kernels.launch import SELECT_WARPS
from indexer_topk.kernels.logits import gather_logits_kernel, logits_kernel
from indexer_topk.kernels.split_topk import HOW_BINS, HOW_ROW_SELECT, HOW_SEARCH, gate_rows_kernel
from indexer_topk.workload import make_workload

from kernel_cases import assert_bitwise, assert_contract, assert_matches_reference

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

TOPK = 2048
# one-row requests (C4 positions): two rows past the shipped SPLIT_TILE (4,096) that take the
# gate, the bins and the spread; one shorter than topk (padded); one short row
LENS = (6000, 4500, 2047, 300)


@pytest.fixture(autouse=True)
def no_recorded_calls():
    """Each call takes the full host path under the settings the test set (a signature's recorded
    launches would replay the settings of an earlier test)."""
    api._KNOWN.clear()
    yield
    api._KNOWN.clear()


@functools.lru_cache(maxsize=None)
def decode_step(layout: str = "sglang_fp8"):
    """A decode step at topk 2048 (:data:`LENS`, one row a request) and its legacy outputs by the
    ``torch`` way (cached; tests must not modify either)."""
    wl = make_workload(layout, context_tokens=[4 * n for n in LENS], rows_per_request=[1] * len(LENS), topk=TOPK,
                       seed=11, device="cpu")
    assert wl.seq_lens.tolist() == list(LENS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(legacy_backend, "KTH_SEARCH", "torch")
        api._KNOWN.clear()
        want = call(wl)
        api._KNOWN.clear()
    return wl, want


def call(wl, backend="legacy", **kw) -> IndexerTopKResult:
    """``indexer_topk`` of ``wl`` into poisoned outputs, every slot of which must be written."""
    out = poisoned_result(wl.rows, wl.topk, "cpu")
    got = it.indexer_topk(*wl.args(), **wl.kwargs(), backend=backend, out=out, rows_per_request=1, **kw)
    assert got is out
    assert unwritten_slots(out) == [], f"{backend}: slots left unwritten"
    return out


class Spy:
    """The legacy module's launches (kernel, grid, kwargs) and each split finish's candidate
    counts and how its rows were finished."""

    def __init__(self, monkeypatch):
        self.launches, self.finishes = [], []
        real_launch, real_finish = legacy_backend.launch, legacy_backend._split_finish

        def launch(kernel, grid, *args, **kwargs):
            self.launches.append((kernel, tuple(grid), kwargs))
            return real_launch(kernel, grid, *args, **kwargs)

        def finish(keys, seq_lens, page_table, topk, out, row_start, bufs, prof, pdl, warps):
            real_finish(keys, seq_lens, page_table, topk, out, row_start, bufs, prof, pdl, warps)
            self.finishes.append((bufs[1].clone(), bufs[3].clone()))  # counts, hows (the interpreter: done)

        monkeypatch.setattr(legacy_backend, "launch", launch)
        monkeypatch.setattr(legacy_backend, "_split_finish", finish)

    def of(self, kernel):
        return [(grid, kw) for k, grid, kw in self.launches if k is kernel]


# ---------------------------------------------------------------------------------------------
# split_spread under every setting
# ---------------------------------------------------------------------------------------------

def test_split_spread_bounds_under_any_setting(monkeypatch):
    """Over bins 0..16,384, halves from negative to absurd and topk 1..16,384 (with the supported
    ones): the spread is the quarter (at least one bin; 0 without bins) or more than a quarter
    and at most half of the bins, never more for a topk the bins are too coarse for, nor where
    halves or bins are 0, exactly ``halves / 2 * topk`` capped at half; it grows with the halves;
    and absurd halves take half the bins at every topk they serve."""
    topks = sorted({2 ** i for i in range(15)} | set(SUPPORTED_TOPK) | {3, 1000, 1500})
    for bins in (0, 2, 4, 64, 1024, 4096, 8192, 16384):
        monkeypatch.setattr(legacy_backend, "SPLIT_BINS", bins)
        quarter = max(1, bins // 4) if bins else 0
        previous = {}
        for halves in (-(10 ** 9), -3, -1, 0, 1, 2, 3, 4, 7, 10 ** 9):
            monkeypatch.setattr(legacy_backend, "SPLIT_SPREAD_HALVES", halves)
            for topk in topks:
                s = legacy_backend.split_spread(topk)
                where = (bins, halves, topk, s)
                assert type(s) is int and quarter <= s <= max(quarter, bins // 2), where
                assert s == quarter or s > bins // 4, where  # a spread at or below the quarter would narrow the bins
                if halves <= 0 or bins == 0 or 2 * topk > bins:
                    assert s == quarter, where
                elif s != quarter:
                    assert s == min(halves * topk // 2, bins // 2), where
                if halves == 10 ** 9 and 2 * topk <= bins and bins >= 4:
                    assert s == bins // 2, where
                assert s >= previous.get(topk, quarter), where  # more halves never narrow the spread
                previous[topk] = s


def test_split_spread_at_the_supported_topks_as_launched():
    """With the shipped settings: every topk the public API accepts gets the quarter (1,024 bins)
    or topk bins (2,048 at topk 2048, half of 4,096), and no more than the finish's histogram
    holds."""
    assert legacy_backend.SPLIT_BINS == 4096 and legacy_backend.SPLIT_SPREAD_HALVES == 2
    for topk in SUPPORTED_TOPK:
        s = legacy_backend.split_spread(topk)
        assert s in (1024, topk) and s <= legacy_backend.SPLIT_BINS // 2
    assert legacy_backend.split_spread(2048) == 2048


# ---------------------------------------------------------------------------------------------
# The decode step at topk 2048, end to end, under spread and bins settings
# ---------------------------------------------------------------------------------------------

def test_decode_topk_2048_shipped_settings(monkeypatch):
    """The shipped settings: the torch way's bits and the reference under the repository's rule;
    the gate launched with ``SPREAD = split_spread(2048) = 2048`` and ``SPLIT_GATE_WARPS``; the
    rows past the tile finished from their candidates, the others by the row select; the plain
    score kernel in one-row tiles."""
    wl, want = decode_step()
    spy = Spy(monkeypatch)
    got = call(wl)
    assert_bitwise(got, want, "shipped settings vs the torch way")
    assert_contract(got, wl)
    assert_matches_reference(got, wl)
    [(grid, kw)] = spy.of(gate_rows_kernel)
    assert kw["SPREAD"] == 2048 and kw["num_warps"] == legacy_backend.SPLIT_GATE_WARPS and grid == (len(LENS),)
    [(counts, hows)] = spy.finishes
    # the longest row by its bins; the next one's gate, at the sample's second smallest key, lets
    # all but one key in, whose bins may crowd (then the search)
    assert hows[0] == HOW_BINS and hows[1] in (HOW_BINS, HOW_SEARCH), (counts, hows)
    assert hows.tolist()[2:] == [HOW_ROW_SELECT] * 2
    width = wl.page_table.shape[1] * PAGE_SIZE
    [(grid, _kw)] = spy.of(logits_kernel)
    assert grid == (len(LENS), -(-width // legacy_backend.score_span(len(LENS), width, 4, one_row=True)))


@pytest.mark.parametrize("settings,spread", [
    ({"SPLIT_SPREAD_HALVES": 0}, 1024),  # the quarter
    ({"SPLIT_SPREAD_HALVES": -7}, 1024),
    ({"SPLIT_BINS": 8192, "SPLIT_SPREAD_HALVES": 3}, 3072),  # a spread of no power of two
    ({"SPLIT_BINS": 8192, "SPLIT_SPREAD_HALVES": 10 ** 9}, 4096),  # capped at half the bins
    ({"SPLIT_BINS": 64}, 16),  # bins too coarse for the topk: the quarter, rows sent to the search
    ({"SPLIT_BINS": 0}, 0),  # no bins (no spread): every row by the search
], ids=["halves0", "halves-7", "bins8192-halves3", "bins8192-halves1e9", "bins64", "bins0"])
def test_decode_topk_2048_under_spread_settings(settings, spread, monkeypatch):
    """Each setting reaches the gate kernel as documented, the long rows still finish from their
    candidates (by their bins or the search; the search alone without bins), and the outputs
    keep the torch way's bits."""
    wl, want = decode_step()
    for name, value in settings.items():
        monkeypatch.setattr(legacy_backend, name, value)
    spy = Spy(monkeypatch)
    got = call(wl)
    assert_bitwise(got, want, f"{settings} vs the torch way")
    [(_grid, kw)] = spy.of(gate_rows_kernel)
    assert kw["SPREAD"] == spread == legacy_backend.split_spread(TOPK)
    assert kw["BINS"] == legacy_backend.SPLIT_BINS
    [(counts, hows)] = spy.finishes
    long_hows = hows.tolist()[:2]
    if legacy_backend.SPLIT_BINS == 0:
        assert long_hows == [HOW_SEARCH, HOW_SEARCH], (counts, hows)
    else:
        assert set(long_hows) <= {HOW_SEARCH, HOW_BINS}, (counts, hows)


def test_decode_topk_2048_gate_ahead_reads_its_own_warps(monkeypatch):
    """The gate ahead of the score kernel (an FP8 decode step, here at any width): its gate with
    ``SCORED_GATE_WARPS`` and the spread, the plain path's gate with ``SPLIT_GATE_WARPS``; each
    read at the call, so an override takes effect without a restart. With more score programs
    an SM than the spans' floors allow, the gathering score kernel keeps the two-row floor
    (``SCORE_MIN_SPAN``), the plain one takes the one-row floor (``SCORE_MIN_SPAN_ONE_ROW``).
    Same bits both ways."""
    wl, want = decode_step()
    monkeypatch.setattr(legacy_backend, "SCORE_PROGRAMS_PER_SM", 64)  # spans of 2 pages wanted: the floors rule
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MIN_WIDTH", 0)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_TOPKS", None)
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_WARPS", 4)
    monkeypatch.setattr(legacy_backend, "SPLIT_GATE_WARPS", 2)
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "1")
    spy = Spy(monkeypatch)
    got = call(wl)
    assert_bitwise(got, want, "the gate ahead vs the torch way")
    [(_grid, kw)] = spy.of(gate_rows_kernel)
    assert kw["SAMPLED"] is True and kw["num_warps"] == 4 and kw["SPREAD"] == 2048
    width = wl.page_table.shape[1] * PAGE_SIZE
    [(grid, _kw)] = spy.of(gather_logits_kernel)
    assert grid == (len(LENS), -(-width // legacy_backend.SCORE_MIN_SPAN)) and not spy.of(logits_kernel)
    # the switch set to something it cannot read: the gate after the score kernel, its own warps
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "yes please")
    spy.launches.clear()
    api._KNOWN.clear()
    got = call(wl)
    assert_bitwise(got, want, "the switch unreadable vs the torch way")
    [(_grid, kw)] = spy.of(gate_rows_kernel)
    assert kw["SAMPLED"] is False and kw["num_warps"] == 2 and kw["SPREAD"] == 2048
    assert not spy.of(gather_logits_kernel)
    [(grid, _kw)] = spy.of(logits_kernel)
    assert grid == (len(LENS), -(-width // legacy_backend.SCORE_MIN_SPAN_ONE_ROW))
    assert legacy_backend.SCORE_MIN_SPAN_ONE_ROW < legacy_backend.SCORE_MIN_SPAN


def test_warps_settings_are_powers_of_two():
    """Triton takes a power of two warps; the interpreter ignores the setting, so a CPU run is
    the place to check it."""
    for name in ("SPLIT_WARPS", "SPLIT_GATE_WARPS", "SCORED_GATE_WARPS", "SPLIT_GATHER_WARPS", "ROWS_WARPS"):
        w = getattr(legacy_backend, name)
        assert type(w) is int and 1 <= w <= 32 and w & (w - 1) == 0, (name, w)
    assert SELECT_WARPS & (SELECT_WARPS - 1) == 0
    for few in (legacy_backend.ROWS_FEW_WARPS, legacy_backend.SPLIT_FEW_WARPS):
        assert few is None or (type(few) is int and 1 <= few <= 32 and few & (few - 1) == 0), few


# ---------------------------------------------------------------------------------------------
# The score span's settings: whole pages or refused
# ---------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def short_decode():
    """Two one-row FP8 requests of 1,000 and 700 positions (topk 512) and their key matrix under
    the shipped span settings, one row a tile."""
    wl = make_workload("sglang_fp8", context_tokens=[4000, 2800], rows_per_request=[1, 1], topk=512, seed=4,
                       device="cpu")
    return wl, legacy_backend.legacy_score(wl.inputs(), rows_per_request=1).clone()


@pytest.mark.parametrize("name,value", [("SCORE_MIN_SPAN_ONE_ROW", 64), ("SCORE_MIN_SPAN_ONE_ROW", 8192),
                                        ("SCORE_SPAN", 64), ("SCORE_MIN_SPAN", 64)])
def test_whole_page_span_settings_keep_the_key_matrix(name, value, monkeypatch):
    """A span of one page or of the whole row: the same key matrix, one row a tile or two."""
    wl, want = short_decode()
    monkeypatch.setattr(legacy_backend, name, value)
    for rows_per_request in (1, None):
        got = legacy_backend.legacy_score(wl.inputs(), rows_per_request=rows_per_request)
        assert torch.equal(got, want), (name, value, rows_per_request)


@pytest.mark.parametrize("name,value", [("SCORE_MIN_SPAN_ONE_ROW", 100), ("SCORE_MIN_SPAN_ONE_ROW", 0),
                                        ("SCORE_MIN_SPAN_ONE_ROW", -64), ("SCORE_MIN_SPAN_ONE_ROW", 256.0),
                                        ("SCORE_MIN_SPAN", 96), ("SCORE_SPAN", 8191), ("SCORE_SPAN", 0)])
def test_span_settings_of_part_of_a_page_are_refused(name, value, monkeypatch):
    """A span that is not a positive multiple of the page: refused naming the setting, before any
    kernel runs (the score kernel takes a span's first position for a page's start, so such a
    span stored every page's scores at the wrong positions), the outputs untouched."""
    wl, _want = short_decode()
    monkeypatch.setattr(legacy_backend, name, value)
    with pytest.raises(ValueError, match=name):
        legacy_backend.score_span(1, 1024, 4, one_row=True)
    out = poisoned_result(wl.rows, wl.topk, "cpu")
    with pytest.raises(ValueError, match=name):
        it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy", out=out, rows_per_request=1)
    assert_bitwise(out, poisoned_result(wl.rows, wl.topk, "cpu"), "outputs of a refused call")


@pytest.mark.parametrize("name,value", [("SPLIT_SAMPLE_SHORT", 1000), ("SPLIT_SAMPLE_SHORT", 32),
                                        ("SPLIT_SAMPLE_SHORT", 0), ("SPLIT_SAMPLE_SHORT", 1024.0),
                                        ("SPLIT_SAMPLE", 8192), ("SPLIT_SAMPLE", 3072),
                                        ("SPLIT_SAMPLE", True), ("SPLIT_SAMPLE_HITS", 0),
                                        ("SPLIT_SAMPLE_HITS", -16), ("SPLIT_SAMPLE_HITS", 16.5)])
def test_sample_settings_the_kernels_cannot_take_are_refused(name, value, monkeypatch):
    """A gate sample that is not a power of two from a page to the tile (a register tile the
    kernels could not build, or build past the finishing program's), or a hit count that is not a
    positive int: refused naming the setting before any kernel runs, the outputs untouched."""
    monkeypatch.setattr(legacy_backend, name, value)
    named = rf"legacy\.{name}: "  # this setting, not another of the same prefix
    with pytest.raises(ValueError, match=named):
        legacy_backend.split_sample(32768, 1024)
    assert_refused_before_scoring(named, monkeypatch)


def assert_refused_before_scoring(named: str, monkeypatch):
    """A legacy decode call under the test's settings raises ``ValueError`` matching ``named``
    before the score stage runs, its outputs untouched."""
    launched = []
    monkeypatch.setattr(legacy_backend, "legacy_score", lambda *a, **k: launched.append(1))
    wl = make_workload("sglang_fp8", context_tokens=[4 * 6000, 4 * 300], rows_per_request=[1, 1], topk=TOPK,
                       seed=2, device="cpu")
    out = poisoned_result(wl.rows, wl.topk, "cpu")
    with pytest.raises(ValueError, match=named):
        it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy", out=out, rows_per_request=1)
    assert_bitwise(out, poisoned_result(wl.rows, wl.topk, "cpu"), "outputs of a refused call")
    assert launched == []  # refused before the score stage



@pytest.mark.parametrize("name,value", [
    ("SCORED_GATE_MIN_WIDTH", -1), ("SCORED_GATE_MIN_WIDTH", None), ("SCORED_GATE_MIN_WIDTH", 4096.0),
    ("SCORED_GATE_MIN_WIDTH", True), ("SCORED_GATE_MIN_WIDTH", "np.int64(40960)"),
    ("SCORED_GATE_NARROW", [(1, 4, 16384)]), ("SCORED_GATE_NARROW", ([1, 4, 16384],)),
    ("SCORED_GATE_NARROW", ((1, 4),)), ("SCORED_GATE_NARROW", ((1, 4, 16384, 0),)),
    ("SCORED_GATE_NARROW", ((4, 1, 16384),)), ("SCORED_GATE_NARROW", ((1, None, -1),)),
    ("SCORED_GATE_NARROW", ((1, 4.0, 16384),)), ("SCORED_GATE_NARROW", ((True, 4, 16384),)),
    ("SCORED_GATE_NARROW", ("np.int64(1)", 4, 16384)), ("SCORED_GATE_NARROW", (1, 4, 16384)),
    ("SCORED_GATE_NARROW", "1,4,16384"), ("SCORED_GATE_TOPKS", 1024), ("SCORED_GATE_TOPKS", "512"),
    ("SCORED_GATE_TOPKS", (1024.0,)), ("SCORED_GATE_TOPKS", [1024]),
    ("SCORED_GATE_MAX_ROWS", 0), ("SCORED_GATE_MAX_ROWS", None), ("SCORED_GATE_MAX_ROWS", 2.0),
    ("SCORED_GATE_MAX_ROWS", True), ("SCORED_GATE_MAX_ROWS", "np.int64(40960)"),
    ("SCORE_GATHER_MAXNREG", 0), ("SCORE_GATHER_MAXNREG", 256), ("SCORE_GATHER_MAXNREG", 64.0),
    ("SCORE_GATHER_MAXNREG", True), ("SCORE_GATHER_MAXNREG", "np.int64(40960)"),
])
@pytest.mark.parametrize("call", ["fp8 decode", "fp8 prefill", "mxfp4 decode"])
def test_scored_gate_settings_it_cannot_read_are_refused(name, value, call, monkeypatch):
    """The gate ahead's rule reads a width, bands of (fewest rows, most rows or None, least
    width), a tuple of topks and the most rows a request, all Python ints, and its score kernel a
    register cap (None or 16-255): anything else is refused naming the setting
    before any kernel launches, the outputs untouched, on calls the rule is never asked about
    (a prefill chunk, MXFP4 keys) too."""
    import numpy as np

    if isinstance(value, str) and value.startswith("np.int64"):
        value = np.int64(40960)
    elif isinstance(value, tuple) and value and value[0] == "np.int64(1)":
        value = ((np.int64(1), 4, 16384),)
    monkeypatch.setattr(legacy_backend, name, value)
    launched = []
    monkeypatch.setattr(legacy_backend, "launch", lambda *a, **k: launched.append(1))
    layout, hint = {"fp8 decode": ("sglang_fp8", 1), "fp8 prefill": ("sglang_fp8", None),
                    "mxfp4 decode": ("sglang_mxfp4", 1)}[call]
    wl = make_workload(layout, context_tokens=[4 * 6000, 4 * 300], rows_per_request=[1, 1], topk=TOPK, seed=2,
                       device="cpu")
    out = poisoned_result(wl.rows, wl.topk, "cpu")
    with pytest.raises(ValueError, match=rf"legacy\.{name}: "):
        it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy", out=out, rows_per_request=hint)
    assert_bitwise(out, poisoned_result(wl.rows, wl.topk, "cpu"), "outputs of a refused call")
    assert launched == []


@pytest.mark.parametrize("bands", [(), ((0, None, 0),), ((12, 12, 32768),), ((0, 0, 0), (3, None, 2 ** 62))])
def test_scored_gate_bands_at_their_edges_are_taken(bands, monkeypatch):
    """Bands the rule can read are taken as given: none, zeros, one row count, a huge width;
    so is a tuple subclass (a named tuple)."""
    from collections import namedtuple

    monkeypatch.setattr(legacy_backend, "SCORED_GATE_NARROW", bands)
    legacy_backend._check_scored_gate()
    Band = namedtuple("Band", "fewest most width")
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_NARROW", tuple(Band(*b) for b in bands))
    legacy_backend._check_scored_gate()
    assert legacy_backend.scored_gate_measured_faster(12, 32768) is any(
        lo <= 12 and (hi is None or 12 <= hi) and 32768 >= w for lo, hi, w in bands)


def test_scored_gate_rule_asked_directly_names_a_setting_it_cannot_read(monkeypatch):
    """The rule called on its own (a caller's routing, a test) checks its settings as a call does."""
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_NARROW", ((12, None),))
    with pytest.raises(ValueError, match=r"legacy\.SCORED_GATE_NARROW: "):
        legacy_backend.scored_gate_measured_faster(12, 32768)

@pytest.mark.parametrize("name,value", [("ROWS_SORT_BITS", 16), ("ROWS_SORT_BITS", 0), ("ROWS_SORT_BITS", True),
                                        ("ROWS_SORT_BITS", 32.0), ("ROWS_SORT_BITS", "32"),
                                        ("ROWS_NARROW_MIN_ROWS", -1), ("ROWS_NARROW_MIN_ROWS", 1024.0),
                                        ("ROWS_NARROW_MIN_ROWS", None), ("ROWS_NARROW_MIN_ROWS", False),
                                        ("ROWS_NARROW_MIN_ROWS_LONG", -1), ("ROWS_NARROW_MIN_ROWS_LONG", "1024"),
                                        ("ROWS_FEW_WARPS", 12), ("ROWS_FEW_WARPS", 0), ("ROWS_FEW_WARPS", 64),
                                        ("ROWS_FEW_WARPS", True), ("ROWS_FEW_WARPS", 16.0),
                                        ("ROWS_FEW_WARPS", "16"), ("ROWS_WARPS", 6), ("ROWS_WARPS", None),
                                        ("ROWS_PROGRAMS_PER_SM", 0), ("ROWS_PROGRAMS_PER_SM", 2.0),
                                        ("ROWS_WARPS", 0), ("ROWS_WARPS", 64), ("ROWS_WARPS", True),
                                        ("ROWS_WARPS", "np.int64"), ("ROWS_FEW_WARPS", "np.int64"),
                                        ("ROWS_PROGRAMS_PER_SM", -1), ("ROWS_PROGRAMS_PER_SM", None),
                                        ("ROWS_PROGRAMS_PER_SM", True), ("ROWS_PROGRAMS_PER_SM", "np.int64"),
                                        ("ROWS_FEW_WARPS", 32), ("ROWS_WARPS", 32), ("ROWS_MAXNREG", 0),
                                        ("ROWS_MAXNREG", 256), ("ROWS_MAXNREG", 128.0), ("ROWS_MAXNREG", "128"),
                                        ("ROWS_BINS", 24), ("ROWS_BINS", 1), ("ROWS_BINS", 512), ("ROWS_BINS", -32),
                                        ("ROWS_BINS", None), ("ROWS_BINS", 32.0), ("ROWS_BINS", True),
                                        ("ROWS_CAND", 8), ("ROWS_CAND", 500), ("ROWS_CAND", 0), ("ROWS_CAND", None),
                                        ("ROWS_CAND", "np.int64"), ("ROWS_SET_POOL_WIDTH", -1),
                                        ("ROWS_SET_POOL_WIDTH", True), ("ROWS_SET_POOL_WIDTH", 4096.0),
                                        ("ROWS_SET_POOL_WIDTH", "4096")])
def test_row_select_settings_the_kernel_cannot_take_are_refused(name, value, monkeypatch):
    """The row select's sort is 32 or 64 bits wide (``ROWS_SORT_BITS``, or by counts of rows,
    ``ROWS_NARROW_MIN_ROWS`` and ``ROWS_NARROW_MIN_ROWS_LONG``), its programs take a power of two
    warps (``ROWS_WARPS``, ``ROWS_FEW_WARPS``) whose registers under the cap (``ROWS_MAXNREG``,
    128: 32 warps need twice the register file) fit a program, and an SM at least one of them
    (``ROWS_PROGRAMS_PER_SM``), and its k-th search bins a tile in 0 or a power of two from 2 to
    256 bins (``ROWS_BINS``) with a power of two from 16 keys of scratch (``ROWS_CAND``), and its
    long rows' pool is unordered from a width of keys (``ROWS_SET_POOL_WIDTH``, or never with None): any
    other value is refused naming
    the setting before any kernel runs, the outputs untouched, on the path
    that never reaches the row select too."""
    if value == "np.int64":  # a numpy int (not a Python int): refused like any other type
        import numpy as np

        value = np.int64(8)
    monkeypatch.setattr(legacy_backend, name, value)
    assert_refused_before_scoring(rf"legacy\.{name}: ", monkeypatch)


@pytest.mark.parametrize("name,value", [("SPLIT_WARPS", 6), ("SPLIT_WARPS", None), ("SPLIT_WARPS", 64),
                                        ("SPLIT_WARPS", "np.int64"), ("SPLIT_FEW_WARPS", 12), ("SPLIT_FEW_WARPS", 0),
                                        ("SPLIT_FEW_WARPS", True), ("SPLIT_FEW_WARPS", 8.0),
                                        ("SPLIT_FEW_WARPS", "np.int64"), ("SPLIT_FEW_ROWS", -1),
                                        ("SPLIT_FEW_ROWS", None), ("SPLIT_FEW_ROWS", 4.0)])
def test_split_finish_warps_settings_the_kernel_cannot_take_are_refused(name, value, monkeypatch):
    """The split finish takes a power of two warps (``SPLIT_WARPS``, ``SPLIT_FEW_WARPS`` up to
    ``SPLIT_FEW_ROWS`` rows, a count): any other value is refused naming the setting before any
    kernel runs, the outputs untouched, and by :func:`split_finish_warps` asked directly."""
    if value == "np.int64":  # a numpy int (not a Python int): refused like any other type
        import numpy as np

        value = np.int64(8)
    monkeypatch.setattr(legacy_backend, name, value)
    assert_refused_before_scoring(rf"legacy\.{name}: ", monkeypatch)
    with pytest.raises(ValueError, match=rf"legacy\.{name}: "):
        legacy_backend.split_finish_warps(1)


@pytest.mark.parametrize("few,rows,warps", [(8, 1, 8), (8, 4, 8), (8, 5, 16), (None, 1, 16), (4, 0, 4)])
def test_split_finish_warps_by_rows(few, rows, warps, monkeypatch):
    """Up to ``SPLIT_FEW_ROWS`` rows (four) the finish takes ``SPLIT_FEW_WARPS``, past them
    (or with it None) ``SPLIT_WARPS``."""
    monkeypatch.setattr(legacy_backend, "SPLIT_FEW_WARPS", few)
    monkeypatch.setattr(legacy_backend, "SPLIT_FEW_ROWS", 4)
    monkeypatch.setattr(legacy_backend, "SPLIT_WARPS", 16)
    assert legacy_backend.split_finish_warps(rows) == warps


@pytest.mark.parametrize("name,value", [("SPLIT_PROGRAMS_PER_SM", 0), ("SPLIT_PROGRAMS_PER_SM", None),
                                        ("SPLIT_PROGRAMS_PER_SM", 4.5), ("SPLIT_PROGRAMS_PER_SM", "np.int64"),
                                        ("SPLIT_MORE_PROGRAMS_PER_SM", 0), ("SPLIT_MORE_PROGRAMS_PER_SM", True),
                                        ("SPLIT_MORE_PROGRAMS_PER_SM", 16.0), ("SPLIT_MORE_PROGRAMS_ROWS", -1),
                                        ("SPLIT_MORE_PROGRAMS_ROWS", None), ("SPLIT_MORE_PROGRAMS_ROWS", "64"),
                                        ("SPLIT_GATHER_PREFETCH", 2), ("SPLIT_GATHER_PREFETCH", True),
                                        ("SPLIT_GATHER_PREFETCH", None), ("SPLIT_GATHER_PREFETCH", 1.0),
                                        ("SCORED_GATE_PREFETCH", 2), ("SCORED_GATE_PREFETCH", False),
                                        ("SPLIT_GATHER_STRIDED", -1), ("SPLIT_GATHER_STRIDED", True),
                                        ("SCORED_GATE_STRIDED", 2), ("SCORED_GATE_STRIDED", "1")])
def test_split_gathering_programs_settings_it_cannot_take_are_refused(name, value, monkeypatch):
    """The gathering kernel's programs an SM (``SPLIT_PROGRAMS_PER_SM``, ``SPLIT_MORE_PROGRAMS_PER_SM``
    up to ``SPLIT_MORE_PROGRAMS_ROWS`` rows) are counts: a float would reach the launch's grid,
    0 would run one program a row; the gathering's prefetch (``SPLIT_GATHER_PREFETCH``,
    ``SCORED_GATE_PREFETCH``) and strided slots (``SPLIT_GATHER_STRIDED``, ``SCORED_GATE_STRIDED``)
    are 0 or 1. Anything else is refused naming the setting before any
    kernel runs, the outputs untouched, and by :func:`split_runs` asked directly."""
    if value == "np.int64":
        import numpy as np

        value = np.int64(4)
    monkeypatch.setattr(legacy_backend, name, value)
    assert_refused_before_scoring(rf"legacy\.{name}: ", monkeypatch)
    with pytest.raises(ValueError, match=rf"legacy\.{name}: "):
        legacy_backend.split_runs(1, 65536, 132)


@pytest.mark.parametrize("more,rows,width,runs", [
    (16, 64, 196608, 33), (16, 65, 196608, 9), (16, 16, 196608, 132), (16, 8, 16384, 16), (16, 1, 1000, 1),
    (None, 64, 196608, 9), (None, 16, 196608, 33),
])
def test_split_gathering_programs_by_rows(more, rows, width, runs, monkeypatch):
    """Up to ``SPLIT_MORE_PROGRAMS_ROWS`` rows (64) a row's runs are ``SPLIT_MORE_PROGRAMS_PER_SM``
    (16) an SM over the rows, past them (or with it None) ``SPLIT_PROGRAMS_PER_SM`` (4), never
    more than the row's blocks of ``SPLIT_BLOCK`` keys and at least one; on 132 SMs."""
    monkeypatch.setattr(legacy_backend, "SPLIT_PROGRAMS_PER_SM", 4)
    monkeypatch.setattr(legacy_backend, "SPLIT_MORE_PROGRAMS_PER_SM", more)
    monkeypatch.setattr(legacy_backend, "SPLIT_MORE_PROGRAMS_ROWS", 64)
    monkeypatch.setattr(legacy_backend, "SPLIT_BLOCK", 1024)
    assert legacy_backend.split_runs(rows, width, 132) == runs


@pytest.mark.parametrize("cap", [None, 64])
def test_row_select_takes_32_warps_under_a_cap_that_fits(cap, monkeypatch):
    """32 warps are refused only for the registers the cap gives them: with no cap (the compiler
    fits 1,024 threads) or a cap of 64, the launch is planned."""
    monkeypatch.setattr(legacy_backend, "ROWS_MAXNREG", cap)
    monkeypatch.setattr(legacy_backend, "ROWS_FEW_WARPS", 32)
    assert legacy_backend.row_programs(3, 4) == (3, 32)


@pytest.mark.parametrize("name,value", [("ROWS_PROGRAMS_PER_SM", 0), ("ROWS_FEW_WARPS", 12), ("ROWS_WARPS", 2.0)])
def test_row_launch_helpers_refuse_a_setting_asked_directly(name, value, monkeypatch):
    """:func:`row_programs` and :func:`row_pool_size` (the launch's grid and its pools, asked
    by a sizing caller without a call) refuse the setting by name too, as their docstrings say:
    with ``ROWS_PROGRAMS_PER_SM`` 0 and ``ROWS_FEW_WARPS`` None they would otherwise size no
    program past the SMs' count of rows."""
    monkeypatch.setattr(legacy_backend, "ROWS_FEW_WARPS", None)
    monkeypatch.setattr(legacy_backend, name, value)
    with pytest.raises(ValueError, match=rf"legacy\.{name}: "):
        legacy_backend.row_programs(300, 4)
    with pytest.raises(ValueError, match=rf"legacy\.{name}: "):
        legacy_backend.row_pool_size(300, 2 * legacy_backend.ROWS_TILE, 512, 4)


def test_row_sort_counts_are_checked_while_a_width_is_forced(monkeypatch):
    """A count of rows the rule cannot take is refused by name also while ``ROWS_SORT_BITS``
    forces the width (and the rule is not asked), before any kernel runs."""
    monkeypatch.setattr(legacy_backend, "ROWS_SORT_BITS", 32)
    monkeypatch.setattr(legacy_backend, "ROWS_NARROW_MIN_ROWS_LONG", -1)
    assert_refused_before_scoring(r"legacy\.ROWS_NARROW_MIN_ROWS_LONG: ", monkeypatch)


def test_sample_settings_switched_off_or_at_their_edges(monkeypatch):
    """``SPLIT_SAMPLE_SHORT = None`` keeps ``SPLIT_SAMPLE`` at every width; a short sample of one
    page, and a hit count of one, are taken as given; one larger than ``SPLIT_SAMPLE`` is taken
    at ``SPLIT_SAMPLE``."""
    sample = legacy_backend.split_sample
    monkeypatch.setattr(legacy_backend, "SPLIT_SAMPLE_SHORT", None)
    assert [sample(w, 1024) for w in (4097, 65536)] == [2048, 2048]
    monkeypatch.setattr(legacy_backend, "SPLIT_SAMPLE_SHORT", PAGE_SIZE)
    monkeypatch.setattr(legacy_backend, "SPLIT_SAMPLE_HITS", 1)
    assert [sample(w, 1024) for w in (65536, 65537)] == [PAGE_SIZE, 2048]
    monkeypatch.setattr(legacy_backend, "SPLIT_SAMPLE_SHORT", 8192)
    assert [sample(w, 1024) for w in (4097, 196608)] == [2048, 2048]


# ---------------------------------------------------------------------------------------------
# KTH_SEARCH: a way of its list or refused
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["Split", "spilt", "", None, 1, "auto "])
def test_unknown_select_way_is_refused(value, monkeypatch):
    """A ``KTH_SEARCH`` that names no way (a misspelling, the research parser's integers) is
    refused naming it, where the select stage's last branch took it for ``"radix"``."""
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", value)
    with pytest.raises(ValueError, match="KTH_SEARCH"):
        legacy_backend._select_mode(1, 8192, "cpu")
    wl, _want = short_decode()
    out = poisoned_result(wl.rows, wl.topk, "cpu")
    with pytest.raises(ValueError, match="KTH_SEARCH"):
        it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy", out=out, rows_per_request=1)


def test_known_select_ways_are_taken(monkeypatch):
    for way in legacy_backend.SELECT_WAYS:
        monkeypatch.setattr(legacy_backend, "KTH_SEARCH", way)
        assert legacy_backend._select_mode(1, 8192, "cpu") == way
    monkeypatch.setattr(legacy_backend, "KTH_SEARCH", "auto")
    assert legacy_backend._select_mode(1, 8192, "cpu") == "split"


# ---------------------------------------------------------------------------------------------
# The research script's --configs (benchmark/research/split_decode.py)
# ---------------------------------------------------------------------------------------------

def split_decode():
    """benchmark/research/split_decode.py (it puts the paths of its own imports on ``sys.path``)."""
    research = str(Path(__file__).resolve().parents[1] / "benchmark" / "research")
    if research not in sys.path:
        sys.path.insert(0, research)
    import split_decode as module

    return module


def test_configs_parse_integers_and_none():
    parse = split_decode().parse_config
    assert parse("") == {} and parse(" , ") == {}
    assert parse("SPLIT_SPREAD_HALVES=3, SCORE_MIN_SPAN_ONE_ROW = 128 ,ROWS_MAXNREG=None,") == {
        "SPLIT_SPREAD_HALVES": 3, "SCORE_MIN_SPAN_ONE_ROW": 128, "ROWS_MAXNREG": None}
    assert parse("SPLIT_SPREAD_HALVES=-1") == {"SPLIT_SPREAD_HALVES": -1}


@pytest.mark.parametrize("entry", ["SPLIT_GATE_WARPS=", "SPLIT_GATE_WARPS", "=8", "SPLIT_GATE_WARPS=8=16",
                                   "SPLIT_SPREAD_HALVES=2.5", "SPLIT_GATE_WARPS=1e3", "SPLIT_GATE_WARPS=0x8",
                                   "SPLIT_GATE_WARPS=nan", "KTH_SEARCH=split", "INDEXER_TOPK_PDL=yes please"])
def test_configs_refuse_entries_naming_them(entry):
    parse = split_decode().parse_config
    with pytest.raises(ValueError, match=re.escape(repr(entry))):
        parse(f"SPLIT_WARPS=8,{entry}")


def test_configs_refuse_names_nothing_reads(monkeypatch):
    """A misspelt variable would be set, read by nothing, and its config measured as the shipped
    settings; a misspelt or missing module setting as well (the module would grow it)."""
    module = split_decode()
    monkeypatch.delenv("INDEXER_TOPK_PDLL", raising=False)
    with pytest.raises(ValueError, match="INDEXER_TOPK_PDLL"):
        module.Settings("SPLIT_WARPS=8;INDEXER_TOPK_PDLL=0")
    with pytest.raises(AttributeError, match="SPLIT_GATE_WARP\\b"):
        module.Settings("SPLIT_GATE_WARP=8")
    with pytest.raises(AttributeError, match="SGLANG_DSV4_FP4_FUSED_TOPK"):
        module.Settings("SGLANG_DSV4_FP4_FUSED_TOPK=0")  # not the legacy module's, nor an INDEXER_TOPK_ name
    assert "INDEXER_TOPK_PDLL" not in os.environ


def test_configs_apply_one_at_a_time_and_restore(monkeypatch):
    """Each config sets its settings over the shipped ones (a variable as its string, ``None``
    unsetting it), and ``apply()`` restores every one exactly, a variable unset where it was."""
    module = split_decode()
    for name in ("SPLIT_SPREAD_HALVES", "SCORED_GATE_WARPS", "SCORE_MIN_SPAN_ONE_ROW"):
        monkeypatch.setattr(legacy_backend, name, getattr(legacy_backend, name))  # restored whatever happens
    monkeypatch.delenv("INDEXER_TOPK_PDL", raising=False)
    monkeypatch.setenv("INDEXER_TOPK_SCORED_GATE", "1")
    shipped = (legacy_backend.SPLIT_SPREAD_HALVES, legacy_backend.SCORED_GATE_WARPS,
               legacy_backend.SCORE_MIN_SPAN_ONE_ROW)
    s = module.Settings("SPLIT_SPREAD_HALVES=0,INDEXER_TOPK_PDL=0;SCORED_GATE_WARPS=4,INDEXER_TOPK_SCORED_GATE=None;"
                        "SCORE_MIN_SPAN_ONE_ROW=64")
    assert s.configs[0] == ""
    s.apply(s.configs[1])
    assert legacy_backend.SPLIT_SPREAD_HALVES == 0 and legacy_backend.split_spread(2048) == 1024
    assert envs.INDEXER_TOPK_PDL.raw() == "0" and envs.INDEXER_TOPK_PDL.get() is False
    assert legacy_backend.SCORED_GATE_WARPS == shipped[1]
    s.apply(s.configs[2])
    assert legacy_backend.SPLIT_SPREAD_HALVES == shipped[0] and legacy_backend.SCORED_GATE_WARPS == 4
    assert envs.INDEXER_TOPK_PDL.raw() is None and envs.INDEXER_TOPK_SCORED_GATE.raw() is None
    s.apply(s.configs[3])
    assert legacy_backend.SCORE_MIN_SPAN_ONE_ROW == 64 and legacy_backend.SCORED_GATE_WARPS == shipped[1]
    s.apply()
    assert (legacy_backend.SPLIT_SPREAD_HALVES, legacy_backend.SCORED_GATE_WARPS,
            legacy_backend.SCORE_MIN_SPAN_ONE_ROW) == shipped
    assert envs.INDEXER_TOPK_PDL.raw() is None and envs.INDEXER_TOPK_SCORED_GATE.raw() == "1"


# ---------------------------------------------------------------------------------------------
# Every environment variable under unreadable values
# ---------------------------------------------------------------------------------------------

HOSTILE = ["", "yes please", "1e3", "-1", "nan", "9" * 40, "9" * 5000]

# name -> (what an unreadable value gives, what empty gives, whether empty warns)
FAIL_SAFE_OFF = (False, False, True)  # a switch that fails safe: empty is unreadable too
OPT_IN = (False, False, False)  # an opt-in: unreadable means the default, off; empty is unset
EXPECTED = {
    "SGLANG_DSV4_FP4_FUSED_TOPK": FAIL_SAFE_OFF,
    "INDEXER_TOPK_TRITON_ROCM": OPT_IN,
    "INDEXER_TOPK_FUSED_PREFILL": OPT_IN,
    "INDEXER_TOPK_FUSED_DECODE": OPT_IN,
    "INDEXER_TOPK_ROUTES": (None, None, False),  # any string is a path: see below
    "INDEXER_TOPK_HOPPER_STREAM": FAIL_SAFE_OFF,
    "INDEXER_TOPK_REPLAY": FAIL_SAFE_OFF,
    "INDEXER_TOPK_DRIVER_LAUNCH": FAIL_SAFE_OFF,
    "INDEXER_TOPK_PDL": FAIL_SAFE_OFF,
    "INDEXER_TOPK_SCORED_GATE": FAIL_SAFE_OFF,
    "INDEXER_TOPK_LOGITS_BUDGET_MB": (2048, 2048, False),
    "INDEXER_TOPK_LOG_LEVEL": (None, None, False),
}


def test_every_variable_has_its_expectation():
    """A variable added to :class:`indexer_topk.envs.Envs` gets its line in :data:`EXPECTED`."""
    assert [f.name for f in envs.fields()] == list(EXPECTED)


def expected_reading(name: str, raw: str):
    """``(value, warns)`` of ``name`` set to ``raw``, from the documented parsing."""
    unreadable, empty, empty_warns = EXPECTED[name]
    if raw.strip() == "":
        return empty, empty_warns
    if name == "INDEXER_TOPK_ROUTES":
        return raw.strip(), False  # a path; select_table warns where it cannot be read (test_routes)
    if name == "INDEXER_TOPK_LOGITS_BUDGET_MB" and raw == "9" * 40:
        return int(raw), False  # an integer of at least 1: a budget above any matrix, read as such
    return unreadable, True


@pytest.mark.parametrize("raw", HOSTILE, ids=["empty", "words", "1e3", "-1", "nan", "huge", "5000digits"])
@pytest.mark.parametrize("name", list(EXPECTED))
def test_unreadable_variable_reads_as_documented(name, raw, monkeypatch, caplog):
    """From the process environment and from a mapping alike: the documented value, and one
    warning naming the variable and its value exactly where the value is unreadable (once a
    process: a second read is silent); :meth:`readable` agrees."""
    field = getattr(envs, name)
    want, warns = expected_reading(name, raw)
    monkeypatch.setenv(name, raw)
    with caplog.at_level(logging.WARNING, logger="indexer_topk"):
        assert field.get() == want and type(field.get()) is type(want)
        assert field.get({name: raw}) == want
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if warns:
        assert len(messages) == 1 and name in messages[0] and repr(raw) in messages[0], messages
    else:
        assert messages == []
    assert field.readable() is (not warns)


def test_huge_logits_budget_holds_every_row_in_one_chunk(monkeypatch):
    """A budget of 10**40 MiB reads as that integer (no overflow: Python ints): every row in one
    chunk, the matrix's bytes exactly the rows'."""
    monkeypatch.setenv("INDEXER_TOPK_LOGITS_BUDGET_MB", "9" * 40)
    assert envs.INDEXER_TOPK_LOGITS_BUDGET_MB.get() == int("9" * 40)
    width = 196608
    assert chunk_rows(4097, width) == 4098
    assert key_matrix_bytes(4097, width // PAGE_SIZE) == 4098 * width * 4


def test_decode_step_with_every_switch_unreadable(monkeypatch, caplog):
    """Every variable a legacy decode call reads set to an unreadable value at once: the switches
    fail safe (no record for replay, no gate ahead, no programmatic launch on a device capable of
    it), the budget is the default's (one chunk), each variable read warned about by name, and
    the torch way's bits."""
    wl, want = decode_step()
    monkeypatch.setattr(launch_mod, "pdl_capable", lambda device: True)  # the switch alone decides
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_MIN_WIDTH", 0)  # the gate ahead would serve this call
    monkeypatch.setattr(legacy_backend, "SCORED_GATE_TOPKS", None)
    names = ("INDEXER_TOPK_REPLAY", "INDEXER_TOPK_DRIVER_LAUNCH", "INDEXER_TOPK_PDL", "INDEXER_TOPK_SCORED_GATE",
             "INDEXER_TOPK_LOGITS_BUDGET_MB", "INDEXER_TOPK_HOPPER_STREAM")
    for name in names:
        monkeypatch.setenv(name, "yes please")
    scored = []
    monkeypatch.setattr(legacy_backend, "scored_split", lambda *a, **k: scored.append(1))
    spy = Spy(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="indexer_topk"):
        got = call(wl)
    assert_bitwise(got, want, "every switch unreadable vs the torch way")
    assert not scored and len(api._KNOWN) == 0
    assert all("launch_pdl" not in kw and kw.get("PDL", False) is False for _k, _g, kw in spy.launches)
    assert len(spy.of(logits_kernel)) == 1  # one chunk
    warned = " ".join(r.getMessage() for r in caplog.records)
    for name in ("INDEXER_TOPK_REPLAY", "INDEXER_TOPK_PDL", "INDEXER_TOPK_SCORED_GATE",
                 "INDEXER_TOPK_LOGITS_BUDGET_MB"):
        assert f"{name}='yes please'" in warned, name


def test_timeline_spans_are_medians_after_each_replays_first_kernel():
    """``--timeline``: kernel records of whole replays, in any order, as each kernel's median
    start and end after its replay's first kernel started; records that are not whole replays
    are refused, not misread."""
    spans = split_decode().replay_spans
    records = [("gate", 201, 204), ("score", 100, 102), ("gate", 101, 105), ("finish", 104, 110),
               ("score", 200, 203), ("finish", 205, 212)]
    assert spans(records, 3) == {"score": (0.0, 2.5), "gate": (1.0, 4.5), "finish": (4.5, 11.0)}
    with pytest.raises(ValueError, match="not whole replays of 3"):
        spans(records[:5], 3)
    with pytest.raises(ValueError, match="not whole replays"):
        spans([], 3)
