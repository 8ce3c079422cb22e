"""The legacy two-stage path: a ``[rows, width]`` score matrix, then an exact top-k stage.

This is what serving engines run today (SGLang: a score kernel writing ``[rows, width]`` FP32
logits into a 2 GiB slab, then a radix top-k that also maps positions to physical slots), in
Triton, for all three layouts. Rows are processed in chunks so the matrix never exceeds a byte
budget, as SGLang chunks rows under its slab. It is the baseline the fused path is measured
against and the fallback the policy keeps for decode and graph capture.

The matrix is a *key matrix*: it stores each score as its int32 order key (the same 4 bytes
as the fp32 score, see :mod:`indexer_topk.kernels.logits`), so the top-k stage can rank
integers. Below 128 rows, and for rows longer than one register tile while there are few of
them for the SMs (:func:`select_way`), each row is spread over many programs that gather the
keys reaching a sampled gate into a small buffer, finished by one program per row
(:mod:`indexer_topk.kernels.split_topk`); otherwise persistent programs read each row about once
(:mod:`indexer_topk.kernels.row_topk`: a radix search of the k-th key in registers, a sampled
gate and a bounded candidate pool for long rows). Either way it takes every key above the k-th
and the lowest positions among keys equal to it, and sorts the result under the contract's
order.

A decode batch (``rows_per_request=1``: every row has pages of its own) is scored one row per
tile, so each program streams its own row's pages with its loads pipelined; a row's scores
have the same bits in a one-row tile as in the two-row tile (:mod:`indexer_topk.kernels.score`).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton

from ..contract import (
    ORDER_POSITION, ORDER_SCORE, PAGE_SIZE, IndexerInputs, IndexerTopKResult, Layout, allocate_result, as_inputs,
    check_workspace,
)
from ..envs import envs
from ..kernels.launch import (
    SELECT_CHUNK, SELECT_WARPS, check_runnable, device_sm_count, kernels_interpreted, launch_options, launches_kernels,
    pack_args, pdl_launch, pdl_options, tile_config,
)
from ..kernels.logits import gather_logits_kernel, logits_kernel
from ..kernels.row_topk import topk_rows_kernel
from ..kernels.select import MODE_KEYS, select_rows_kernel
from ..kernels.scored_gate import score_sample_kernel
from ..kernels.split_topk import (
    CAND_PER_TOPK, HEADER_FIELDS, PROF_FIELDS, finish_rows_kernel, gate_rows_kernel, gather_rows_kernel,
)
from ..replay import launch
from .key_matrix import chunk_rows, key_matrix_bytes, key_matrix_width, rows_per_chunk  # noqa: F401 - public here too
from .ordering import lay_out_rows

# How the top-k stage selects: "rows" reads each row once in register tiles through a bounded
# candidate pool (kernels/row_topk.py: persistent programs, launches only, so the call's host
# work can be replayed, indexer_topk.replay); "split" spreads each row over many programs that
# gather the keys above a sampled gate, then one program per row selects from them
# (kernels/split_topk.py, launches only); "torch" runs torch.topk over the key matrix for each
# row's k-th key, then one exact pass per row; "radix" searches the k-th key with 8-bit
# histogram passes over the whole row, one program per row (the select stage before "rows").
# "auto" asks select_way: "split" below ROWS_MIN_ROWS rows (one program per row leaves most SMs
# idle for a few decode rows) and for rows longer than SPLIT_MIN_WIDTH keys up to
# SPLIT_ROWS_PER_SM rows an SM, "rows" otherwise. Same selection, same bits. Measured on an H200
# (benchmark/research/row_select.sh; benchmark/results/NOTES.md, "The split select for prefill
# chunks"): the split select wins at 128 rows of 65,536 and 196,608 keys, ties at 128 x 16,384
# and 256 x 65,536 (where its three launches cost an eager call more host time), and loses from
# 256 rows of 16,384 keys and at 512 rows and more.
KTH_SEARCH = "auto"
SELECT_WAYS = ("split", "rows", "torch", "radix")  # KTH_SEARCH's values besides "auto"
ROWS_MIN_ROWS = 128
SPLIT_ROWS_PER_SM = 1
SPLIT_MIN_WIDTH = 16384

# The "rows" select: keys per register tile of the scan, keys its gate is sampled from, warps
# and programs per SM.
# Measured on an H200 (benchmark/research/row_select.py): 8 warps capped at 128 registers, two
# programs an SM, beat one program of 8 or 16 warps, and 4 warps at 3 or 4 an SM.
ROWS_TILE = 4096
ROWS_SAMPLE = 2048  # at most ROWS_TILE (the kernel asserts it): rows longer than the tile are sampled
ROWS_WARPS = 8
ROWS_PROGRAMS_PER_SM = 2
ROWS_MAXNREG = 128  # register cap per thread (None: the compiler's choice)
# A program's registers, threads times the cap, must fit the SM's register file (64 K 32-bit
# registers on NVIDIA GPUs from Volta on): 32 warps capped at 128 compile (ptxas keeps the cap)
# and are refused at launch, after the score kernel has run.
REGISTERS_PER_PROGRAM = 65536
# ... but while the rows number no more than the SMs, each row is a program of its own and the
# kernel takes as long as one row: one program of ROWS_FEW_WARPS warps a row, where more warps
# share each of its tiles (None: ROWS_WARPS and ROWS_PROGRAMS_PER_SM at every size). Measured on
# H100s (row_select.py, the select stage alone, CUDA-graph replays, the same bits; three runs,
# all timed before bench.timing.queue_hold's spin): 128 rows of 4,096 random keys 28 -> 22-26 us,
# of 16,384 keys 41-42 -> 40 us, increasing keys within 1-3 us either way; at 256 rows of 4,096,
# where programs take two rows in turn, 34 -> 40 us, so the rule stops at the SMs
# (benchmark/results/NOTES.md, "The row select's warps by rows").
ROWS_FEW_WARPS: Optional[int] = 16
# The row select's sort of a row's selection: the 64-bit network over (key, position) composites,
# or 32 bits (the key's high bits and the entry's index, runs alike in those bits corrected after;
# kernels.select.sort_narrow). None: 32 bits from ROWS_NARROW_MIN_ROWS rows of a matrix at most
# ROWS_TILE keys wide, from ROWS_NARROW_MIN_ROWS_LONG rows of a wider one, 64 below. Measured on
# H100s (the select stage alone): 6-8% faster at 512-8192 rows of 4,096 keys; 12% slower at 128
# and 256 rows of 4,096 random keys (one row a program, where its two barriers and loads add to
# the latency); at 16,384 keys 3% slower at 512 rows, even at 1024 (the pool's cuts, not the
# sort, lead there); benchmark/results/NOTES.md, "The row select's sort".
ROWS_SORT_BITS: Optional[int] = None
# The row select's k-th search: one histogram of ROWS_BINS bins of equal width over the scores of
# a tile, then a search over the keys of the bin that holds the k-th, when they number at most
# ROWS_CAND (or topk, if fewer); a fuller bin, or ROWS_BINS 0, takes 5-bit radix digits over the
# whole tile (kernels.row_topk.binned_kth). Same selection, same bits. Measured on an H100 (the
# select stage alone in position order, CUDA-graph replays, one process; research/row_select.py):
# 32 bins 3-7% faster than the radix digits on normal scores at 1024 and 8192 rows of 4,096 keys,
# even at 16,384, 6-20% faster on rising scores; 64 bins and a scratch of 256 keys slower
# (benchmark/results/NOTES.md, "The k-th of a tile from one histogram").
ROWS_BINS = 32
ROWS_CAND = 512
# From which key-matrix width (keys a row) a row longer than the tile appends its entrants to its
# pool in no particular order: slots by a sum along each thread's registers rather than one in
# position order, ties at a cut taken by position, the last topk sorted back to position order by
# one int32 sort a row (kernels/row_topk.py, append with STRIDED). None: never. The same bits
# either way.
# Timed on an H100 at every width (row_select.py config s0; benchmark/results/row_select/
# strided_h100/, NOTES.md): 8% faster on normal scores at 65,536 keys but 25% slower on rising
# ones there, and 26% slower on normal scores at 16,384 keys (the final sort outweighs the appends
# saved), so None until a width wins on both. Again with the cut writing the pool back by position
# (benchmark/results/ab_9bcce92_h100/): from 65,536 keys 9-11% faster on normal scores, 22-25%
# slower on rising ones; from 32,768 slower on both. Since then a tile most of whose keys enter
# is appended by position (its strided slots scattered its stores, as they did the split
# gathering's): not yet timed.
ROWS_SET_POOL_WIDTH: Optional[int] = None
ROWS_NARROW_MIN_ROWS = 512
ROWS_NARROW_MIN_ROWS_LONG = 1024

# The "split" select: keys its gate is sampled from (at most SPLIT_TILE: rows of at most
# SPLIT_TILE keys are one register tile of the finishing program), keys a gathering program
# reads at once, gathering programs per SM, and the finishing program's warps. Measured on an
# H200 (benchmark/research/split_decode.py, device time per kernel at 1 x 768K, 8 x 768K and
# 64 x 128K): 16 finishing warps beat 8 and 32; a sample of 2,048 keys gates in 4.9-8.2 us
# against 6.7-10.0 for 4,096 (kernels/split_topk.py's gate then aims at 2.5 * topk entrants).
SPLIT_TILE = 4096
SPLIT_SAMPLE = 2048
# ... and the gate kernel's smaller sample, where a row's best topk still hold about
# SPLIT_SAMPLE_HITS of its keys (split_sample): the gate's r-th sampled key is then a quantile
# as steady as 2,048 sampled keys give at 768K tokens (10.7 among the best 1,024), and the gate
# kernel searches half the keys. On an H100 it gated 1 x 128K in 4.8 us against 6.4, 8 x 128K in
# 6.3 against 7.2, the same bits and finish times (decode_ab_round.sh; benchmark/results/NOTES.md);
# at 768K, where 1,024 sampled keys hold about 5 of the best 1,024, the step kept its time but
# a row would get too few entrants about 60 times as often (one row in 800) and more than the
# finish's registers 9 times as often, so long rows keep SPLIT_SAMPLE. (At topk 512 and 768K,
# SPLIT_SAMPLE itself holds about 5 of the best 512: those rows have the same odds.)
# None: SPLIT_SAMPLE at every width.
SPLIT_SAMPLE_SHORT = 1024
SPLIT_SAMPLE_HITS = 16
SPLIT_BLOCK = 1024
SPLIT_PROGRAMS_PER_SM = 4
# ... and up to SPLIT_MORE_PROGRAMS_ROWS rows, SPLIT_MORE_PROGRAMS_PER_SM gathering programs an SM
# (split_runs; None: SPLIT_PROGRAMS_PER_SM at every chunk). A program's blocks are a chain of a
# load and a returning atomic add each, so the kernel waits on latency, and more chains at once
# (4 warps each: 16 fill an SM's 64 warps) shorten it. Measured on an H100 (split_decode.py --cold
# on the mix's bytes, the same bits; benchmark/results/NOTES.md, "The gathering kernel's
# programs"): 16 against 4 took the gathering kernel 67 -> 57 us and the step 456 -> 447 us
# L2-cold at 64 rows (32 requests of 768K with a draft row each), 20 -> 16 and 145 -> 140 at 16
# rows (8 of them); 32 read 52 and 442 at 64 rows but 142 at 16; rows of 16,384 keys and fewer
# unchanged (their blocks, not this, bound the runs). Past 64 rows it is no rule: at prefill chunks
# of 128 rows 16 read 134 against 141 us on rows of 196,608 keys of random scores but 44 against
# 42 on rows of 65,536 increasing ones (benchmark/results/scored_gate/split_128_152d37c_h100/).
SPLIT_MORE_PROGRAMS_PER_SM: Optional[int] = 16
SPLIT_MORE_PROGRAMS_ROWS = 64
# Whether the gathering kernel loads each block's keys while it appends the block before (1),
# rather than after (0): the chain's load then waits behind the previous block's returning atomic
# add no longer. The same appends in the same order, so the same bits (kernels/split_topk.py,
# gather_run). SCORED_GATE_PREFETCH: the same inside the score kernel that gathers (the gate
# ahead), where the block held ahead cost registers under its cap (compiled for sm_90 at one row
# a tile when it was timed: 14 spilled loads against 1; at 16a83a9, Triton 3.6, neither spills,
# with strided slots or without). Timed on an H100 (benchmark/results/scored_gate/
# prefetch_fc3fc41_h100/ and split_128_152d37c_h100/, the same bits): in the gathering kernel it
# is faster at every shape that kernel serves (the MTP step of 32 x 768K 447 -> 440 us L2-cold,
# 65 requests of 128K 150 -> 148, the select of 128 rows of 196,608 keys 159 -> 140); inside
# the score kernel it is as fast or slower at every shape of the gate ahead, so it stays off there.
SPLIT_GATHER_PREFETCH = 1
SCORED_GATE_PREFETCH = 0
# Whether the gathering kernel gives a block's entrants their buffer slots by the strided prefix
# sum (1: kernels/common.py, exclusive_sum_strided, a sum along each thread's registers and one
# scan across threads) where at most an eighth of the block enters, rather than by position (0: a
# scan across threads per register). The finish ranks the buffer by key and position, so the same
# bits either way. Timed on an H100 (row_select.py --ways split, CUDA-graph replays, the same bits;
# benchmark/results/split_select/gather_strided_h100/, NOTES.md): normal scores 8-13% faster at
# 128 x 196,608, 256 x 65,536 and 1024 x 65,536 keys, rising scores unchanged; strided at every
# block, rising scores had lost 9-17% (dense blocks' scattered stores), hence the eighth.
SPLIT_GATHER_STRIDED = 1
# The same inside the score kernel that gathers (the gate ahead). Timed on an H100 (split_decode.py,
# graph replays of its decode batches, two runs, the same bits; benchmark/results/NOTES.md, "Wider score
# tiles, the gate ahead's slots strided"): the step 1-4% faster at every batch the gate ahead
# serves (one and eight requests of 128K, eight of 768K, 64 of 128K), the others unchanged.
SCORED_GATE_STRIDED = 1
SPLIT_WARPS = 16
# ... and its warps while a chunk has at most SPLIT_FEW_ROWS rows (None: SPLIT_WARPS at every
# chunk). Measured on an H100 (split_decode.py --configs SPLIT_WARPS=8, graph replays on the
# mix's bytes, the same bits; benchmark/results/NOTES.md, "The row select's warps by rows"): the
# finishing kernel took 8.7 us against 9.3 at 1 x 128K and 1 x 768K, 8.9 against 9.3 at 2 x 128K
# and 9.1 against 9.6 at 4 x 128K; at 8 x 128K no change, at 64 x 128K 1.0 us more. Again on
# another H100, with the rule against 16 warps (cold_rules_round.sh): 8.8 against 9.4 us at
# 1 x 128K, 8.7 against 9.2 at 1 x 768K, 9.2 against 9.7 at 4 x 128K, 9.7 either way at 8.
SPLIT_FEW_WARPS: Optional[int] = 8
SPLIT_FEW_ROWS = 4
# The gate kernel's warps: 8 gated a row faster than 16 (and 4) in device time at 1 x 128K and
# 1 x 768K on an H200 and at 1 x 128K and 8 x 128K on an H100, the same bits
# (split_decode.py --configs SPLIT_GATE_WARPS=8; benchmark/results/NOTES.md). The gate ahead's
# gate (scored_split), which runs beside the score kernel, keeps 16 (SCORED_GATE_WARPS): it was
# not timed with 8.
SPLIT_GATE_WARPS = 8
SCORED_GATE_WARPS = 16
# The gate from one histogram of SPLIT_GATE_BINS bins over the sample's scores, a few more
# entrants than aimed at (kernels/split_topk.py, binned_gate); 0: the sample's exact r-th key
# by a radix search of up to seven passes.
SPLIT_GATE_BINS = 0
SPLIT_GATHER_WARPS = 4
# The finishing program orders a row's candidates by a histogram of SPLIT_BINS bins over the
# scores from the gate up when no bin from the k-th key's up holds more than SPLIT_MAXSEG of them
# (kernels/split_topk.py); SPLIT_BINS = 0: always by a radix search and a sort. On an H200 the
# finishing program took 11.9 us against 18.0 at 1 x 768K and 12.5 against 18.6 at 8 x 768K in
# one run; 13.8 at 64 x 128K in a later one, where the search and sort had taken 19.5
# (split_decode.py, benchmark/results/NOTES.md).
SPLIT_BINS = 4096
# The bins the sample's scores from the gate up spread over: SPLIT_SPREAD_HALVES / 2 * topk, at
# most half of SPLIT_BINS, where that is more than a quarter, else a quarter (split_spread).
# About 2.5 * topk keys reach the gate, so at topk 2048 a quarter of 4,096 bins put more than
# SPLIT_MAXSEG keys into a bin near the k-th in about a fifth of the rows of indexer-like scores
# at 768K tokens (an fp64 recomputation of the finish's bins, test_split_topk.bins_from_kth),
# and each such row took the finish's one-program search; topk bins, about one row in 80.
# 0: a quarter at every topk.
SPLIT_SPREAD_HALVES = 2
SPLIT_MAXSEG = 16
# By bins, a row's finish is shared by up to SPLIT_FINISH_PARTS programs (each ranks and writes
# its share of the row's output slots) while the batch leaves SMs without a row: one program
# an SM would otherwise rank and write a row's topk keys alone, which a step of a few rows
# waits on (split_decode.py, benchmark/results/NOTES.md).
SPLIT_FINISH_PARTS = 8

# Positions per score program: long enough to amortise the query load, short enough to spread
# a few rows over every SM (a batch of few rows takes shorter spans, down to SCORE_MIN_SPAN,
# so that it fills, without passing, one wave of SCORE_PROGRAMS_PER_SM programs an SM). On an
# H200, 8 programs an SM scored 8 x 768K in 56.5 us against 67.7 for 4, 64 x 128K in 75.7
# against 86.9 (split_decode.py); a span that let 256 x 128K take 1,280 programs (a partial
# second wave) scored it about a fifth slower than 1,024 did (benchmark/results/NOTES.md).
# Spans spread over the fewest whole waves instead measured 10% faster at 64 x 768K and 4% slower
# on 64 rows of 4K..768K (dfb760c): the width, not the rows' lengths, sets the waves.
SCORE_SPAN = 8192
SCORE_MIN_SPAN = 512
# ... and down to this span in one-row tiles (a decode batch of few rows) of the plain score
# kernel: twice the programs scored one request of 128K faster on an H100 than the floor of 512
# did (split_decode.py --configs SCORE_MIN_SPAN=256; benchmark/results/NOTES.md). Prefill's
# two-row tiles and the kernel that also gathers (the gate ahead) keep the floor above: neither
# was timed with it.
SCORE_MIN_SPAN_ONE_ROW = 256
SCORE_PROGRAMS_PER_SM = 8
# The score kernel that also gathers (a decode step's gate scored ahead of it, scored_split):
# registers a thread per row of its tile, so that SCORE_PROGRAMS_PER_SM programs of 4 warps fit an
# SM as the plain score kernel's 64 do; at 72 (the compiler's choice) one wave of 8 x 768K ran as
# two. A two-row tile gets twice the cap, up to the 255 a thread can address; None leaves the
# registers to the compiler.
SCORE_GATHER_MAXNREG: Optional[int] = 64
# The gate ahead of the score kernel (scored_split), by a decode chunk's width of the key matrix
# (C4 positions: the page table's width, the batch's longest row) and its rows (a request each; a
# batch past the logits budget runs as several chunks): at every chunk from SCORED_GATE_MIN_WIDTH,
# and below it in the bands of SCORED_GATE_NARROW, each (fewest rows, most rows or None, least
# width); after the score kernel elsewhere. Measured on an H100 (benchmark/research/
# decode_rules_round.sh and gate_band_runs.sh: graph replays on the mix's bytes, each shape in two
# or three runs, the same bits; benchmark/results/NOTES.md, "The gate ahead by width and batch"),
# the gate ahead's time over after's: 0.92-0.99x at every batch timed from 160K tokens (40,960
# positions; 1, 8 and 32 requests at 160K-192K, 1-64 at 256K, topk 512-2048), 0.91-0.98x at 12,
# 24, 32 and 64 requests of 128K; 0.99x at 16 and 1.00x at 128 requests of 128K (and 1.01x at 64
# on an H200, before the short sample), so the band ends at 64; 1.08-1.19x at 6 and 8 requests of
# 128K, 1.23-1.27x at 8 and 1.11-1.12x at 16 of 64K, 1.09x at 32 of 32K. Those replays read
# keys left in L2 by the replay before; a served step reads a layer's keys from HBM (the other
# layers pass through L2 between two of its steps), so the band now follows the L2-cold step
# (split_decode.py --cold: the L2 overwritten before each replay, cold_rules_round.sh; three runs
# on two H100s, the same bits; benchmark/results/NOTES.md, "The gate ahead from one request of
# 128K"): against the step after it, 0.94-0.95x, 0.95-0.96x and 0.96-0.97x at two, four and eight
# requests of 128K in every run, 0.96x, 0.97x and 1.02x at one. Warm, eight requests still read
# 1.06-1.09x. Left after it: 8 of 64K (1.10x cold), 16 of 64K and 32 of 32K (0.98-0.99x cold,
# 1.08-1.11x warm). Where the sample's scoring and the gate outlast the score kernel, the gathering
# waits for them. Like the other settings here, they are read by a signature's first call; later
# calls of it replay its launches (indexer_topk.replay).
SCORED_GATE_MIN_WIDTH = 40960
SCORED_GATE_NARROW: Optional[Tuple[Tuple[int, Optional[int], int], ...]] = ((1, 64, 32768),)
# ... at these topks (None: any). It was timed faster at 8 x 768K and 8 x 256K at each of 512,
# 1024 and 2048 (benchmark/results/scored_gate/), so no topk is left out; a tuple keeps it to
# those topks. Below 256K only topk 1024 has been timed with it.
SCORED_GATE_TOPKS: Optional[Tuple[int, ...]] = None
# ... and for requests of two rows (a decode step with one draft row of multi-token prediction a
# request, ``rows_per_request=2``) while this is 2 or more: the score kernel then takes a
# request's two rows in one tile, as legacy_score scores them, and gathers each (the rule above
# read by requests, a chunk's score-tile groups); 1 keeps the gate ahead to one-row requests. Measured on an H100
# against the four kernels (split_decode.py --cold on the mix's bytes, the same bits;
# benchmark/results/NOTES.md, "The gate ahead at requests of two rows"): slower at 32 x 768K
# (465 against 451 us warm, 471 against 457 L2-cold), 8 x 768K and 4-32 x 128K, where the two-row
# tile's gathering took longer inside the score kernel (78 us at 32 x 768K) than the gathering
# kernel of its own (67 us); faster only at one request of 768K (42.4 against 45.1 us L2-cold).
# So 1.
SCORED_GATE_MAX_ROWS = 1


def split_sample(width: int, topk: int) -> int:
    """Keys the split select's gate kernel samples from each row of a ``width``-key matrix at
    ``topk``: ``SPLIT_SAMPLE_SHORT`` (at most ``SPLIT_SAMPLE``) where ``width`` is short enough
    that a row's best ``topk`` hold at least ``SPLIT_SAMPLE_HITS`` of them on average
    (``sample * topk >= SPLIT_SAMPLE_HITS * width``; shorter rows of the batch hold more), else
    ``SPLIT_SAMPLE``. The gate aims at about ``2.5 * topk`` entrants either way
    (:mod:`indexer_topk.kernels.split_topk`); a gate from fewer sampled keys is a noisier
    quantile, and the finish's checks keep any gate exact."""
    _check_samples()
    short = SPLIT_SAMPLE if SPLIT_SAMPLE_SHORT is None else min(SPLIT_SAMPLE_SHORT, SPLIT_SAMPLE)
    return short if short * topk >= SPLIT_SAMPLE_HITS * width else SPLIT_SAMPLE


def _check_samples() -> None:
    """``ValueError`` naming a sample setting the gate's kernels cannot take: a sample is a
    register tile (a power of two) scored a page at a time by the gate ahead (at least
    ``PAGE_SIZE``), and ``SPLIT_SAMPLE`` at most the finishing program's tile ``SPLIT_TILE``
    (``SPLIT_SAMPLE_SHORT`` is taken at most ``SPLIT_SAMPLE``, or is ``None``); ``SPLIT_SAMPLE_HITS``
    is a positive count."""
    def power_of_two(v):
        return v >= PAGE_SIZE and not v & (v - 1)

    _check_int_setting("SPLIT_SAMPLE", SPLIT_SAMPLE, lambda v: power_of_two(v) and v <= SPLIT_TILE,
                       f"a power of two from the page size ({PAGE_SIZE}) to SPLIT_TILE ({SPLIT_TILE})")
    if SPLIT_SAMPLE_SHORT is not None:
        _check_int_setting("SPLIT_SAMPLE_SHORT", SPLIT_SAMPLE_SHORT, power_of_two,
                           f"None or a power of two from the page size ({PAGE_SIZE})")
    _check_int_setting("SPLIT_SAMPLE_HITS", SPLIT_SAMPLE_HITS, lambda v: v > 0, "a positive int")


def _check_row_select() -> None:
    """``ValueError`` naming the row select's setting it cannot take: ``ROWS_SORT_BITS`` None, 32
    or 64, ``ROWS_NARROW_MIN_ROWS`` and ``ROWS_NARROW_MIN_ROWS_LONG`` counts of rows,
    ``ROWS_WARPS`` a power of two up to 32 (Triton's warps) and ``ROWS_FEW_WARPS`` None or one,
    ``ROWS_PROGRAMS_PER_SM`` a positive count (0 would launch no program for more rows than SMs,
    or for any rows with ``ROWS_FEW_WARPS`` None, leaving the outputs unwritten), and
    ``ROWS_BINS`` 0 or a power of two up to 256, ``ROWS_CAND`` one from 16 and
    ``ROWS_SET_POOL_WIDTH`` None or a width,
    ``ROWS_MAXNREG`` None or a register count that leaves each warps setting's program within
    ``REGISTERS_PER_PROGRAM`` (the launch would fail after the score kernel ran)."""
    _check_int_setting("ROWS_WARPS", ROWS_WARPS, _is_warps, "a power of two from 1 to 32")
    if ROWS_FEW_WARPS is not None:
        _check_int_setting("ROWS_FEW_WARPS", ROWS_FEW_WARPS, _is_warps, "None or a power of two from 1 to 32")
    _check_int_setting("ROWS_PROGRAMS_PER_SM", ROWS_PROGRAMS_PER_SM, lambda v: v > 0, "a positive int")
    if ROWS_MAXNREG is not None:
        _check_int_setting("ROWS_MAXNREG", ROWS_MAXNREG, lambda v: 1 <= v <= 255, "None or registers a thread, 1 to 255")
        for name, w in (("ROWS_WARPS", ROWS_WARPS), ("ROWS_FEW_WARPS", ROWS_FEW_WARPS)):
            if w is not None and w * 32 * ROWS_MAXNREG > REGISTERS_PER_PROGRAM:
                raise ValueError(f"indexer_topk.backends.legacy.{name}: {w} warps of ROWS_MAXNREG = {ROWS_MAXNREG} "
                                 f"registers a thread need {w * 32 * ROWS_MAXNREG}, past the "
                                 f"{REGISTERS_PER_PROGRAM} a program may hold: fewer warps, or a lower cap")
    if ROWS_SORT_BITS is not None:
        _check_int_setting("ROWS_SORT_BITS", ROWS_SORT_BITS, lambda v: v in (32, 64), "None, 32 or 64")
    _check_int_setting("ROWS_BINS", ROWS_BINS, lambda v: v == 0 or (v & (v - 1) == 0 and 2 <= v <= 256),
                       "0 or a power of two from 2 to 256")
    _check_int_setting("ROWS_CAND", ROWS_CAND, lambda v: v >= 16 and v & (v - 1) == 0, "a power of two from 16")
    if ROWS_SET_POOL_WIDTH is not None:
        _check_int_setting("ROWS_SET_POOL_WIDTH", ROWS_SET_POOL_WIDTH, lambda v: v >= 0, "None or a count of keys")
    for name, value in (("ROWS_NARROW_MIN_ROWS", ROWS_NARROW_MIN_ROWS),
                        ("ROWS_NARROW_MIN_ROWS_LONG", ROWS_NARROW_MIN_ROWS_LONG)):
        _check_int_setting(name, value, lambda v: v >= 0, "a count of rows")


def row_sort_bits(rows: int, width: int) -> int:
    """The width of the row select's sort for a key matrix of ``rows`` rows of ``width`` keys:
    ``ROWS_SORT_BITS``, else 32 from ``ROWS_NARROW_MIN_ROWS`` rows where ``width`` is at most
    ``ROWS_TILE`` (every row one register tile) and from ``ROWS_NARROW_MIN_ROWS_LONG`` rows where
    it is more, 64 below; ``ValueError`` naming a setting it cannot take."""
    _check_row_select()
    if ROWS_SORT_BITS is not None:
        return ROWS_SORT_BITS
    least = ROWS_NARROW_MIN_ROWS if width <= ROWS_TILE else ROWS_NARROW_MIN_ROWS_LONG
    return 32 if rows >= least else 64


def _is_warps(value: int) -> bool:
    """A warps count Triton takes: a power of two from 1 to 32."""
    return 1 <= value <= 32 and value & (value - 1) == 0


def _is_int(value) -> bool:
    """An int of Python's, not a bool (nor a numpy int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int_setting(name: str, value, fine, expected: str) -> None:
    """``ValueError`` naming the module setting ``name`` unless ``value`` is an int (not a bool)
    for which ``fine(value)`` holds; ``expected`` says what it must be."""
    if not _is_int(value) or not fine(value):
        raise ValueError(f"indexer_topk.backends.legacy.{name}: expected {expected}, got {value!r} "
                         f"({type(value).__name__})")


def _type_names(value) -> str:
    """The type of ``value``, or of each entry of a tuple: a numpy int prints as a plain number
    under numpy 1.x, so a refusal names the types it refused."""
    if isinstance(value, tuple):
        return ", ".join(type(x).__name__ for x in value)
    return type(value).__name__


def split_spread(topk: int) -> int:
    """Bins of the split finish's histogram that the sample's scores from the gate up fill:
    ``SPLIT_SPREAD_HALVES / 2 * topk``, at most half of ``SPLIT_BINS``, where that is more than a
    quarter of them, else a quarter (at least one bin; 0 without bins)."""
    quarter = max(1, SPLIT_BINS // 4) if SPLIT_BINS else 0
    if 2 * topk > SPLIT_BINS:  # bins too coarse for the topk
        return quarter
    return max(min(SPLIT_SPREAD_HALVES * topk // 2, SPLIT_BINS // 2), quarter)


def score_span(groups: int, width: int, sm_count: int, one_row: bool = False) -> int:
    """Positions per score program for ``groups`` row groups of ``width`` positions: ``SCORE_SPAN``
    unless that leaves programs short of one wave of ``SCORE_PROGRAMS_PER_SM`` an SM; then whole
    pages, as many programs a group as the wave holds for every group, at least ``SCORE_MIN_SPAN``
    (``SCORE_MIN_SPAN_ONE_ROW`` for one-row groups, ``one_row``)."""
    _check_spans()
    want = max(1, SCORE_PROGRAMS_PER_SM * sm_count // max(groups, 1))  # programs a row group may take
    span = -(-width // want)
    span = -(-span // PAGE_SIZE) * PAGE_SIZE
    return max(SCORE_MIN_SPAN_ONE_ROW if one_row else SCORE_MIN_SPAN, min(SCORE_SPAN, span))


def _check_spans() -> None:
    """``ValueError`` naming a span setting that is not a positive multiple of ``PAGE_SIZE``: the
    score kernel scores a program's span page by page from its first position, which it takes as
    a page's start (:func:`indexer_topk.kernels.score.score_page`), so a span of part of a page
    would store each page's scores at the wrong positions."""
    for name, value in (("SCORE_SPAN", SCORE_SPAN), ("SCORE_MIN_SPAN", SCORE_MIN_SPAN),
                        ("SCORE_MIN_SPAN_ONE_ROW", SCORE_MIN_SPAN_ONE_ROW)):
        _check_int_setting(name, value, lambda v: v > 0 and v % PAGE_SIZE == 0,
                           f"a positive multiple of the page size ({PAGE_SIZE})")


@launches_kernels
def legacy_score(inputs: IndexerInputs, *, keys=None, row_start=0, row_count=None,
                 rows_per_request: Optional[int] = None) -> torch.Tensor:
    """Score stage: the int32 key matrix ``[row_count, width]`` of rows ``row_start ..``.

    ``keys`` (int32 or float32 storage of that shape, reinterpreted as
    int32) is written in full: score keys below each row's ``seq_len``, ``KEY_NONE`` past it.
    Decode a key with :func:`indexer_topk.contract.scores_from_ordered_bits`.
    ``rows_per_request=1`` scores one row per tile (rows with pages of their own); the bits are
    the same either way.
    """
    ka = pack_args(inputs)
    if row_count is None:
        row_count = inputs.rows - row_start
    width = key_matrix_width(ka.page_table)
    if keys is None:
        keys = torch.empty((row_count, width), dtype=torch.int32, device=ka.kc.device)
    keys = keys.view(torch.int32)
    if row_count == 0 or width == 0:
        return keys
    group = 1 if rows_per_request == 1 else tile_config(inputs.layout).rows
    _launch_score(inputs, ka, keys, row_start, row_count, group)
    return keys


def _launch_score(inputs: IndexerInputs, ka, keys, row_start: int, row_count: int, group: int, gather=None,
                  pdl: bool = False) -> None:
    """The score kernel over rows ``row_start .. row_start + row_count`` into ``keys`` (``[row_count,
    width]`` int32, ``width > 0``), ``group`` rows a tile; ``ka``: :func:`pack_args` of ``inputs``.
    ``gather``: the split select's buffers (:func:`_split_scratch`): the kernel that
    also gathers each span's keys reaching the gate, waiting for the gate only then with ``pdl``
    (:func:`scored_split`)."""
    cfg = tile_config(inputs.layout)
    width = keys.shape[1]
    groups = triton.cdiv(row_count, group)
    # the shorter floor was timed with the plain score kernel only, not the one that gathers
    span = score_span(groups, width, device_sm_count(keys.device), one_row=group == 1 and gather is None)
    grid = (groups, triton.cdiv(width, span))
    args = (ka.q, ka.qs, ka.w, ka.kc, ka.kf, ka.ks, ka.kdesc, ka.pages, ka.page_table, ka.page_table.stride(0),
            ka.seq_lens, min(inputs.rows, row_start + row_count), row_start, inputs.weight_scale, keys, keys.stride(0))
    tile = dict(LAYOUT=ka.layout, TMA=ka.tma, INTERPRET=ka.interpret, STAGES=cfg.logits_stages, num_warps=cfg.num_warps,
                num_stages=cfg.logits_stages)
    if gather is None:
        launch(logits_kernel, grid, *args, 0, width, span, R=group, **tile)
        return
    gates, counts, scales, _hows, cand, hist = gather
    # the cap is a tile row's: two-row tiles get the 128 the plain score kernel's take uncapped,
    # and as many programs an SM (compiled for sm_90 uncapped, 145 registers, one program fewer)
    cap = None if SCORE_GATHER_MAXNREG is None else min(255, SCORE_GATHER_MAXNREG * group)
    launch(gather_logits_kernel, grid, *args, width, span, gates, counts, scales, hist, cand, TOPK=inputs.topk,
           TILE=SPLIT_TILE, BLOCK=SPLIT_BLOCK, BINS=SPLIT_BINS, PDL=pdl, R=group,
           PREFETCH=bool(SCORED_GATE_PREFETCH), STRIDE=_slot_stride(SCORED_GATE_STRIDED, cfg.num_warps), **tile,
           **launch_options(cap, ka.interpret), **pdl_options(pdl))


def kth_keys(keys: torch.Tensor, topk: int, lengths: torch.Tensor):
    """Each row's k-th largest key among its first ``lengths[i]`` keys (``lengths`` int ``[rows]``;
    below 0 none, past the row all) and how many keys equal to it the top k holds (int32 ``[rows]``).

    Keys past a row's length are left out whatever they hold: the select pass reads only the
    first ``lengths[i]``, and a k-th taken from keys it never reads would leave it short of
    ``topk`` entries (and the finish reading positions it never wrote). A row of at most
    ``topk`` keys gets an unread pair: the select pass takes all of it."""
    if keys.shape[1] < topk:  # every row is shorter than topk: the select pass takes all
        z = torch.zeros(keys.shape[0], dtype=torch.int32, device=keys.device)
        return z, z
    cols = torch.arange(keys.shape[1], device=keys.device)
    # below every key the row holds: a row of more than topk keys keeps only its own in its top k,
    # or ties with a key equal to INT32_MIN, which the select pass then takes by position
    keys = keys.masked_fill(cols[None, :] >= lengths[:, None], torch.iinfo(torch.int32).min)
    top = torch.topk(keys, topk, dim=1, sorted=False).values
    kth = top.min(dim=1).values
    need = topk - (top > kth[:, None]).sum(dim=1, dtype=torch.int32)
    return kth, need


def select_way(rows: int, width: int, sm_count: int) -> str:
    """How :func:`legacy_select` selects ``rows`` key-matrix rows of ``width`` keys on a GPU of
    ``sm_count`` SMs: ``"split"`` below ``ROWS_MIN_ROWS`` rows, and for rows longer than
    ``SPLIT_MIN_WIDTH`` keys while they number at most ``SPLIT_ROWS_PER_SM`` an SM; ``"rows"``
    otherwise. A long row read by one program streams at one SM's pace, while the split select
    spreads it over several and finishes it from a few thousand candidates; with more rows than
    SMs the row select's one read of each row wins."""
    if rows < ROWS_MIN_ROWS:
        return "split"
    if width > SPLIT_MIN_WIDTH and rows <= SPLIT_ROWS_PER_SM * sm_count:
        return "split"
    return "rows"


def _select_mode(rows: int, width: int, device) -> str:
    """The way :func:`legacy_select` takes: ``KTH_SEARCH``, or :func:`select_way`'s under ``"auto"``;
    ``ValueError`` naming ``KTH_SEARCH`` where it is none of :data:`SELECT_WAYS` (its last branch
    would otherwise take any other value for ``"radix"``)."""
    if KTH_SEARCH == "auto":
        return select_way(rows, width, device_sm_count(device))
    if KTH_SEARCH not in SELECT_WAYS:
        raise ValueError(f"indexer_topk.backends.legacy.KTH_SEARCH: unknown way {KTH_SEARCH!r}; expected one of "
                         f"{('auto',) + SELECT_WAYS}")
    return KTH_SEARCH


@launches_kernels
def legacy_select(keys, seq_lens, page_table, *, topk, out: IndexerTopKResult, row_start=0, pdl: bool = False,
                  order: str = ORDER_SCORE) -> None:
    """Top-k stage over a key matrix from :func:`legacy_score` (contiguous, ``[rows, width]``),
    written to ``out`` rows ``row_start..``. A row is read no further than ``width``, whatever
    its ``seq_len``. ``pdl``: the select kernels are launched with programmatic dependent launch
    (:func:`indexer_topk.kernels.launch.pdl_launch`): each may start as the kernel before it on
    the stream finishes, and waits for all of it on the GPU before reading anything. ``order``
    (:func:`indexer_topk.contract.check_order`): ``"position"`` leaves the row select's and the
    key-matrix select's rows in the position order they select in (no sort), and lays out the
    split select's afterwards."""
    keys = keys.view(torch.int32)
    row_count = keys.shape[0]
    # the kernels read the lengths of rows row_start.. at unit stride: anything else would read
    # other rows' lengths, or past the tensor (the public entry point checks it; this a caller's)
    if seq_lens.dim() != 1 or not seq_lens.is_contiguous() or seq_lens.numel() < row_start + row_count:
        raise ValueError(f"seq_lens: expected a contiguous 1-D tensor holding rows {row_start} .. "
                         f"{row_start + row_count - 1}, got shape {tuple(seq_lens.shape)} and strides "
                         f"{tuple(seq_lens.stride())}")
    search = _select_mode(row_count, keys.shape[1], keys.device)
    if search == "split":  # it checks the matrix and the device itself
        split_select(keys, seq_lens, page_table, topk=topk, out=out, row_start=row_start, pdl=pdl)
        lay_out_rows(out, order, topk, row_start, row_count)
        return
    if not keys.is_contiguous():
        raise ValueError("keys: expected a contiguous key matrix")
    if row_count == 0:
        return
    check_runnable(keys.device)
    unsorted = order == ORDER_POSITION  # the selection is in position order until the finish sorts it
    if search == "rows":
        sort_bits = row_sort_bits(row_count, keys.shape[1])  # its settings refused by name either way
        if unsorted:
            sort_bits = 0
        sm_count = device_sm_count(keys.device)
        programs, warps = row_programs(row_count, sm_count)
        # each program's candidate pool, used by rows longer than the tile only (torch.empty: an
        # allocation the replay repeats, indexer_topk.replay)
        need = _pool_entries(programs, keys.shape[1], topk)
        pools = torch.empty(need, dtype=torch.int32, device=keys.device) if need else keys
        launch(
            topk_rows_kernel, (programs,), keys, keys.shape[1], row_count, seq_lens, page_table, page_table.stride(0),
            out.values.view(torch.int32), out.raw_indices, out.physical_indices, out.counts, row_start, pools,
            TOPK=topk, TILE=ROWS_TILE, SAMPLE=ROWS_SAMPLE, PDL=pdl, SORT_BITS=sort_bits, BINS=ROWS_BINS,
            CAND=min(ROWS_CAND, topk), ONE_TILE=keys.shape[1] <= ROWS_TILE,
            SET_POOL=ROWS_SET_POOL_WIDTH is not None and keys.shape[1] >= ROWS_SET_POOL_WIDTH, num_warps=warps,
            **launch_options(ROWS_MAXNREG, kernels_interpreted()), **pdl_options(pdl),
        )
        return
    known_t = search == "torch"
    if known_t:
        kth, need = kth_keys(keys, topk, seq_lens[row_start:row_start + row_count])
    else:
        kth, need = seq_lens, seq_lens  # unread without KNOWN_T
    launch(
        select_rows_kernel, (row_count,), keys, keys, seq_lens, keys.shape[1], seq_lens, page_table, page_table.stride(0),
        out.values.view(torch.int32), out.raw_indices, out.physical_indices, out.counts, row_start, kth, need,
        MODE=MODE_KEYS, TOPK=topk, SPLITS=1, CHUNK=SELECT_CHUNK, KNOWN_T=known_t, SORT_BITS=0 if unsorted else 64,
        num_warps=SELECT_WARPS,
    )


def row_programs(rows: int, sm_count: int) -> Tuple[int, int]:
    """``(programs, warps)`` of the "rows" select over ``rows`` rows on ``sm_count`` SMs: a
    program of ``ROWS_FEW_WARPS`` warps a row while the rows number at most the SMs, else
    ``ROWS_PROGRAMS_PER_SM`` programs an SM (no more than the rows) of ``ROWS_WARPS`` warps.
    :func:`row_pool_size` gives each program its pool by this count; ``ValueError`` naming a
    row select setting it cannot take (:func:`_check_row_select`)."""
    _check_row_select()
    if ROWS_FEW_WARPS is not None and rows <= sm_count:
        return rows, ROWS_FEW_WARPS
    return min(rows, sm_count * ROWS_PROGRAMS_PER_SM), ROWS_WARPS


def split_runs(rows: int, width: int, sm_count: int) -> int:
    """Gathering programs per row of the "split" select: ``SPLIT_MORE_PROGRAMS_PER_SM`` an SM over
    a chunk of up to ``SPLIT_MORE_PROGRAMS_ROWS`` rows (``rows``: the chunk's, not the batch's),
    ``SPLIT_PROGRAMS_PER_SM`` over a longer one (and always where the first is None), no more
    than the row's blocks; ``ValueError`` naming a setting it cannot take
    (:func:`_check_split_programs`)."""
    _check_split_programs()
    per_sm = SPLIT_PROGRAMS_PER_SM
    if SPLIT_MORE_PROGRAMS_PER_SM is not None and rows <= SPLIT_MORE_PROGRAMS_ROWS:
        per_sm = SPLIT_MORE_PROGRAMS_PER_SM
    return max(1, min(-(-per_sm * sm_count // rows), -(-width // SPLIT_BLOCK)))


def _check_split_programs() -> None:
    """``ValueError`` naming the gathering programs' setting it cannot take: ``SPLIT_PROGRAMS_PER_SM``
    a count of at least 1, ``SPLIT_MORE_PROGRAMS_PER_SM`` None or one, ``SPLIT_MORE_PROGRAMS_ROWS``
    a count of rows, ``SPLIT_GATHER_PREFETCH``, ``SCORED_GATE_PREFETCH``, ``SPLIT_GATHER_STRIDED``
    and ``SCORED_GATE_STRIDED`` 0 or 1."""
    _check_int_setting("SPLIT_PROGRAMS_PER_SM", SPLIT_PROGRAMS_PER_SM, lambda v: v >= 1, "a count of at least 1")
    if SPLIT_MORE_PROGRAMS_PER_SM is not None:
        _check_int_setting("SPLIT_MORE_PROGRAMS_PER_SM", SPLIT_MORE_PROGRAMS_PER_SM, lambda v: v >= 1,
                           "None or a count of at least 1")
    _check_int_setting("SPLIT_MORE_PROGRAMS_ROWS", SPLIT_MORE_PROGRAMS_ROWS, lambda v: v >= 0, "a count of rows")
    _check_int_setting("SPLIT_GATHER_PREFETCH", SPLIT_GATHER_PREFETCH, lambda v: v in (0, 1), "0 or 1")
    _check_int_setting("SCORED_GATE_PREFETCH", SCORED_GATE_PREFETCH, lambda v: v in (0, 1), "0 or 1")
    _check_int_setting("SPLIT_GATHER_STRIDED", SPLIT_GATHER_STRIDED, lambda v: v in (0, 1), "0 or 1")
    _check_int_setting("SCORED_GATE_STRIDED", SCORED_GATE_STRIDED, lambda v: v in (0, 1), "0 or 1")


def _slot_stride(strided: int, warps: int) -> int:
    """A gathering kernel's ``STRIDE``: its thread count where its appends take strided slots
    (``strided``: ``SPLIT_GATHER_STRIDED`` or ``SCORED_GATE_STRIDED``), else 0 (by position)."""
    return 32 * warps if strided else 0


def split_finish_warps(rows: int) -> int:
    """Warps of the "split" select's finishing program for a chunk of ``rows`` rows:
    ``SPLIT_FEW_WARPS`` up to ``SPLIT_FEW_ROWS`` rows, ``SPLIT_WARPS`` past them (and always
    where ``SPLIT_FEW_WARPS`` is None); ``ValueError`` naming a setting it cannot take
    (:func:`_check_split_warps`)."""
    _check_split_warps()
    if SPLIT_FEW_WARPS is not None and rows <= SPLIT_FEW_ROWS:
        return SPLIT_FEW_WARPS
    return SPLIT_WARPS


def _check_split_warps() -> None:
    """``ValueError`` naming the split finish's warps setting it cannot take: ``SPLIT_WARPS`` a
    power of two from 1 to 32 (Triton's warps), ``SPLIT_FEW_WARPS`` None or one, and
    ``SPLIT_FEW_ROWS`` a count of rows."""
    _check_int_setting("SPLIT_WARPS", SPLIT_WARPS, _is_warps, "a power of two from 1 to 32")
    if SPLIT_FEW_WARPS is not None:
        _check_int_setting("SPLIT_FEW_WARPS", SPLIT_FEW_WARPS, _is_warps, "None or a power of two from 1 to 32")
    _check_int_setting("SPLIT_FEW_ROWS", SPLIT_FEW_ROWS, lambda v: v >= 0, "a count of rows")


def split_finish_parts(rows: int, topk: int, sm_count: int) -> int:
    """Finishing programs per row of the "split" select: the largest power of two up to
    ``SPLIT_FINISH_PARTS`` that leaves no more programs than SMs, each a share of ``topk``
    slots no smaller than a bin's longest run (``SPLIT_MAXSEG``); 1 without bins."""
    parts = 1
    while (SPLIT_BINS and parts * 2 <= SPLIT_FINISH_PARTS and rows * parts * 2 <= sm_count
           and topk // (parts * 2) >= SPLIT_MAXSEG):
        parts *= 2
    return parts


def split_scratch_size(rows: int, topk: int) -> int:
    """int32 entries of the "split" select's scratch for ``rows`` rows: per row its header
    (gate, candidate count, histogram scale, how it was finished), its candidate region
    (``CAND_PER_TOPK * topk``: a buffer of ``BUF_PER_TOPK * topk`` keys and as many positions,
    then the finish's staging area), and ``2 * SPLIT_BINS`` for its histogram and the finish's
    counters."""
    return rows * (HEADER_FIELDS + CAND_PER_TOPK * topk + 2 * SPLIT_BINS)


def row_pool_size(rows: int, width: int, topk: int, sm_count: int) -> int:
    """int32 entries of the row select's candidate pools for ``rows`` rows of ``width`` keys: a
    pool of ``2 * topk`` keys and as many positions for each of its programs, where rows are
    longer than its tile (0 otherwise: a row of one tile needs none)."""
    return _pool_entries(row_programs(rows, sm_count)[0], width, topk)


def _pool_entries(programs: int, width: int, topk: int) -> int:
    """:func:`row_pool_size` for a launch of ``programs`` programs (:func:`row_programs`)."""
    return programs * 4 * topk if width > ROWS_TILE else 0


def legacy_scratch_bytes(rows: int, page_table_columns: int, topk: int, sm_count: int,
                         budget_bytes: Optional[int] = None) -> int:
    """Bytes a legacy call holds at once (no workspace holding its key matrix) for ``rows`` rows
    over a page table of ``page_table_columns`` pages, with ``topk``, on a device of ``sm_count``
    SMs: the key matrix (a chunk of rows under the logits budget, ``budget_bytes`` or
    ``INDEXER_TOPK_LOGITS_BUDGET_MB``) and the largest chunk's select scratch (the split select's
    buffers, or the row select's candidate pools for rows longer than its tile), the way
    ``select_way`` picks. For a call of one chunk (a decode batch under the default budget) it is
    what a replay allocates, each buffer in its own 512-byte-aligned place of one block (not
    counted here), and what a graph capturing the call holds in its pool."""
    if rows == 0:
        return 0
    width = page_table_columns * PAGE_SIZE
    chunk = chunk_rows(rows, width, budget_bytes)
    select = max(split_scratch_size(n, topk) if select_way(n, width, sm_count) == "split"
                 else row_pool_size(n, width, topk, sm_count)
                 for n in {min(chunk, rows), rows % chunk or chunk})  # a full chunk and the last
    return key_matrix_bytes(rows, page_table_columns, budget_bytes) + 4 * select


@launches_kernels
def split_select(keys, seq_lens, page_table, *, topk, out: IndexerTopKResult, row_start=0, scratch=None,
                 prof=None, pdl: bool = False) -> None:
    """The "split" way of :func:`legacy_select` (its arguments), on ``scratch`` (int32, at least
    :func:`split_scratch_size` entries, contiguous; ``None``: allocated for the call). After the
    call, ``scratch[:4 * rows].view(4, rows)`` holds each row's gate, candidate count (the keys
    that reached its gate: the row was selected from them when that lies in ``[topk, 8 * topk]``
    and the row is longer than ``SPLIT_TILE``: by their bins, or by a search, past ``4 * topk``
    from those of its bins from the k-th key's up), histogram scale (fp32 bits) and how it was
    finished (``HOW_*`` of :mod:`indexer_topk.kernels.split_topk`, plus ``HOW_TRIMMED`` for a
    trimmed row). ``prof`` (int64 ``[rows, PROF_FIELDS]``, a GPU measurement):
    the finishing kernel's ``PROF`` build fills it with each row's phase cycles
    (:func:`indexer_topk.kernels.split_topk.finish_rows_kernel`). ``pdl``: its three kernels are
    launched with programmatic dependent launch (see :func:`legacy_select`)."""
    keys = keys.view(torch.int32)
    bufs = _split_scratch(keys, topk, scratch, prof)
    warps = split_finish_warps(keys.shape[0])  # its settings refused before the first kernel
    rows, width = keys.shape
    if rows == 0:
        return
    check_runnable(keys.device)
    gates, counts, scales, _hows, cand, hist = bufs
    runs = split_runs(rows, width, device_sm_count(keys.device))
    launch(gate_rows_kernel, (rows,), keys, width, seq_lens, row_start, gates, counts, scales, hist,
           TOPK=topk, TILE=SPLIT_TILE, SAMPLE=split_sample(width, topk), BINS=SPLIT_BINS, PDL=pdl, SAMPLED=False,
           GATE_BINS=SPLIT_GATE_BINS, SPREAD=split_spread(topk), num_warps=SPLIT_GATE_WARPS, **pdl_options(pdl))
    launch(gather_rows_kernel, (rows, runs), keys, width, seq_lens, row_start, gates, counts, scales, hist, cand,
           runs, TOPK=topk, TILE=SPLIT_TILE, BLOCK=SPLIT_BLOCK, BINS=SPLIT_BINS, PDL=pdl,
           PREFETCH=bool(SPLIT_GATHER_PREFETCH), STRIDE=_slot_stride(SPLIT_GATHER_STRIDED, SPLIT_GATHER_WARPS),
           num_warps=SPLIT_GATHER_WARPS, **pdl_options(pdl))
    _split_finish(keys, seq_lens, page_table, topk, out, row_start, bufs, prof, pdl, warps)


def scored_gate_way(inputs: IndexerInputs, rows_per_request: Optional[int], rows: int, width: int) -> bool:
    """Whether :func:`legacy_indexer_topk` serves a chunk of ``rows`` rows of ``width`` keys by
    :func:`scored_split`: a decode batch of FP8 keys (``rows_per_request`` 1, or 2 while
    ``SCORED_GATE_MAX_ROWS`` is 2 or more) whose requests :func:`scored_gate_measured_faster` places there
    and whose rows the "split" select serves, at a ``topk`` of ``SCORED_GATE_TOPKS``, while
    ``INDEXER_TOPK_SCORED_GATE`` is on, and whose candidate region holds the gate's sample (a
    ``topk`` of at least ``split_sample(width, topk) / CAND_PER_TOPK``: 103 with the shipped sample
    at the widths the gate ahead serves)."""
    if (scored_gate_group(inputs, rows_per_request) is None or rows == 0 or width == 0
            or not scored_gate_measured_faster(-(-rows // rows_per_request), width)
            or (SCORED_GATE_TOPKS is not None and inputs.topk not in SCORED_GATE_TOPKS)
            or split_sample(width, inputs.topk) > CAND_PER_TOPK * inputs.topk):
        return False
    return _select_mode(rows, width, inputs.device) == "split" and envs.INDEXER_TOPK_SCORED_GATE.get()


def scored_gate_group(inputs: IndexerInputs, rows_per_request: Optional[int]) -> Optional[int]:
    """The score tile's rows a group when :func:`scored_split` may serve this decode batch of FP8
    keys: 1 for one-row requests, the tile's rows (2) for requests of that many rows while
    ``SCORED_GATE_MAX_ROWS`` allows it (a group is then one request, its pages shared); ``None``
    for any other batch, or another layout."""
    _check_scored_gate()
    if inputs.layout is not Layout.SGLANG_FP8 or not _is_int(rows_per_request):
        return None
    if rows_per_request == 1:
        return 1
    tile_rows = tile_config(inputs.layout).rows
    return tile_rows if rows_per_request == tile_rows <= SCORED_GATE_MAX_ROWS else None


def scored_gate_measured_faster(rows: int, width: int) -> bool:
    """Whether a decode chunk of ``rows`` rows of ``width`` C4 positions takes the gate ahead of the
    score kernel by its shape: ``width`` at least ``SCORED_GATE_MIN_WIDTH``, or inside a band
    ``(fewest rows, most rows or None, least width)`` of ``SCORED_GATE_NARROW`` (``None``: none);
    ``ValueError`` naming either setting where it is not what this reads."""
    _check_scored_gate()
    if width >= SCORED_GATE_MIN_WIDTH:
        return True
    return any(lo <= rows and (hi is None or rows <= hi) and width >= least
               for lo, hi, least in SCORED_GATE_NARROW or ())


def _check_scored_gate() -> None:
    """``ValueError`` naming the gate ahead's setting it cannot read: ``SCORED_GATE_MIN_WIDTH`` a
    width, ``SCORED_GATE_NARROW`` ``None`` or a tuple of ``(fewest rows, most rows or None, least
    width)`` triples of Python ints at least 0, the most rows no fewer than the fewest,
    ``SCORED_GATE_MAX_ROWS`` a Python int of at least 1, ``SCORED_GATE_TOPKS`` ``None`` or a
    tuple of Python ints, and ``SCORE_GATHER_MAXNREG`` ``None`` or a Python int of 16 to 255."""
    _check_int_setting("SCORED_GATE_MIN_WIDTH", SCORED_GATE_MIN_WIDTH, lambda v: v >= 0, "a width in C4 positions")

    def count(v) -> bool:
        return _is_int(v) and v >= 0

    def band(b) -> bool:
        return (isinstance(b, tuple) and len(b) == 3 and count(b[0]) and count(b[2])
                and (b[1] is None or (count(b[1]) and b[1] >= b[0])))

    bands = SCORED_GATE_NARROW
    if bands is not None and (not isinstance(bands, tuple) or not all(band(b) for b in bands)):
        bad = bands if not isinstance(bands, tuple) else next(b for b in bands if not band(b))
        raise ValueError("indexer_topk.backends.legacy.SCORED_GATE_NARROW: expected None or a tuple of (fewest rows, "
                         "most rows or None, least width) triples of Python ints at least 0, the most rows no "
                         f"fewer than the fewest; {bad!r} ({_type_names(bad)}) is not")
    _check_int_setting("SCORED_GATE_MAX_ROWS", SCORED_GATE_MAX_ROWS, lambda v: v >= 1, "1 or more rows a request")
    if SCORE_GATHER_MAXNREG is not None:
        _check_int_setting("SCORE_GATHER_MAXNREG", SCORE_GATHER_MAXNREG, lambda v: 16 <= v <= 255,
                           "None or 16 to 255 registers a thread")
    topks = SCORED_GATE_TOPKS
    if topks is not None and (not isinstance(topks, tuple) or not all(_is_int(k) for k in topks)):
        raise ValueError("indexer_topk.backends.legacy.SCORED_GATE_TOPKS: expected None or a tuple of Python ints, "
                         f"got {topks!r} ({type(topks).__name__})")


@launches_kernels
def scored_split(inputs: IndexerInputs, keys, *, out: IndexerTopKResult, row_start=0, scratch=None, prof=None,
                 pdl: bool = False, group: int = 1) -> None:
    """:func:`legacy_score` then :func:`split_select` of rows ``row_start .. row_start + rows`` of
    a decode batch (FP8 keys; ``keys``: their ``[rows, width]`` key matrix, written in full), with
    the same bits in ``out``, in ``keys`` and in ``scratch`` (arguments as there), the gate ahead
    of the score kernel. ``group``: rows a score tile, 1 (one query row a request) or the tile's
    rows (2: requests of two rows, each request's rows at an even row of the batch, as
    :func:`scored_gate_group` gives it; other pairings are scored apart, slower, with the same
    bits): the gate's sample is scored from
    the cache (:func:`indexer_topk.kernels.scored_gate.score_sample_kernel`), the gate taken from
    it, and the score kernel gathers the keys of its own span that reach the gate
    (:func:`indexer_topk.kernels.logits.gather_logits_kernel`). ``pdl``: the score kernel scores
    while the sample and the gate are taken, and waits for them only to gather; the finish
    follows the score kernel."""
    keys = keys.view(torch.int32)
    topk = inputs.topk
    rows, width = keys.shape
    if rows == 0 or width == 0:
        raise ValueError("scored_split: expected at least one row and one column (legacy_indexer_topk's chunks)")
    # the kernels read each row's length, page-table row and query unmasked, score the sample as
    # FP8 and at positions below the width, and the finish writes output rows row_start + i
    if inputs.layout is not Layout.SGLANG_FP8:
        raise ValueError(f"scored_split: expected sglang_fp8 keys, got {inputs.layout}")
    if row_start < 0 or row_start + rows > inputs.rows:
        raise ValueError(f"scored_split: rows {row_start}..{row_start + rows} outside the batch's {inputs.rows}")
    tile_rows = tile_config(inputs.layout).rows
    if not _is_int(group) or group not in (1, tile_rows):
        raise ValueError(f"scored_split: a group of {group!r} rows; expected 1 or the score tile's {tile_rows}")
    if width != key_matrix_width(inputs.page_table):
        raise ValueError(f"scored_split: a key matrix of {width} columns for a page table of "
                         f"{key_matrix_width(inputs.page_table)} positions")
    bufs = _split_scratch(keys, topk, scratch, prof)
    warps = split_finish_warps(keys.shape[0])  # its settings refused before the first kernel
    _check_split_programs()  # the gathering's prefetch, read by the score kernel's launch
    gates, counts, scales, _hows, cand, hist = bufs
    ka = pack_args(inputs)
    sample = split_sample(width, topk)
    # the first kernel of the call: a plain launch, after the caller's work and the previous
    # chunk's or call's finish; the score kernel's stores before its wait rely on it (they may
    # land while the sample is scored, never while a finish still reads the matrix)
    launch(score_sample_kernel, (rows, triton.cdiv(sample, PAGE_SIZE)), ka.q, ka.w, ka.kc, ka.kf, ka.pages,
           ka.page_table, ka.page_table.stride(0), ka.seq_lens, row_start + rows, row_start, inputs.weight_scale, width,
           cand, TOPK=topk, TILE=SPLIT_TILE, SAMPLE=sample, INTERPRET=ka.interpret, PDL=pdl,
           num_warps=tile_config(inputs.layout).num_warps)
    launch(gate_rows_kernel, (rows,), cand, width, ka.seq_lens, row_start, gates, counts, scales, hist, TOPK=topk,
           TILE=SPLIT_TILE, SAMPLE=sample, BINS=SPLIT_BINS, PDL=pdl, SAMPLED=True,
           GATE_BINS=SPLIT_GATE_BINS, SPREAD=split_spread(topk), num_warps=SCORED_GATE_WARPS,
           **pdl_options(pdl))
    _launch_score(inputs, ka, keys, row_start, rows, group, gather=bufs, pdl=pdl)
    _split_finish(keys, ka.seq_lens, ka.page_table, topk, out, row_start, bufs, prof, pdl, warps)


def _split_scratch(keys, topk, scratch, prof):
    """The split select's scratch carved for ``keys``' rows (allocated where ``scratch`` is
    ``None``; checked, with ``prof``, otherwise): ``(gates, counts, scales, hows, cand, hist)``."""
    if not keys.is_contiguous():  # the kernels step rows by the width
        raise ValueError("keys: expected a contiguous key matrix")
    rows = keys.shape[0]
    need = split_scratch_size(rows, topk)
    if scratch is None:
        # torch.empty: an allocation the replay repeats (indexer_topk.replay)
        scratch = torch.empty(need, dtype=torch.int32, device=keys.device)
    elif (scratch.dtype != torch.int32 or not scratch.is_contiguous() or scratch.numel() < need
          or scratch.device != keys.device):
        raise ValueError(f"scratch: expected a contiguous int32 tensor of at least {need} entries on {keys.device}")
    if prof is not None and (prof.dtype != torch.int64 or not prof.is_contiguous() or prof.numel() < rows * PROF_FIELDS
                             or prof.device != keys.device):
        raise ValueError(f"prof: expected a contiguous int64 tensor of at least {rows * PROF_FIELDS} entries")
    scratch = scratch.view(-1)  # carved by entries, whatever the caller's shape
    gates, counts, scales, hows = scratch[: HEADER_FIELDS * rows].view(HEADER_FIELDS, rows)
    cand_end = rows * (HEADER_FIELDS + CAND_PER_TOPK * topk)
    cand = scratch[HEADER_FIELDS * rows: cand_end]
    hist = scratch[cand_end: need] if SPLIT_BINS else cand  # unread without bins
    return gates, counts, scales, hows, cand, hist


def _split_finish(keys, seq_lens, page_table, topk, out, row_start, bufs, prof, pdl, warps):
    """The split select's finishing kernel over ``keys``' rows, of ``warps`` warps
    (:func:`split_finish_warps`; see :func:`split_select`; ``bufs``: :func:`_split_scratch`'s)."""
    gates, counts, scales, hows, cand, hist = bufs
    rows, width = keys.shape
    parts = split_finish_parts(rows, topk, device_sm_count(keys.device))
    launch(finish_rows_kernel, (rows, parts), keys, width, seq_lens, page_table, page_table.stride(0),
           out.values.view(torch.int32), out.raw_indices, out.physical_indices, out.counts, row_start, gates, counts,
           scales, hows, hist, cand, counts if prof is None else prof, TOPK=topk, TILE=SPLIT_TILE,
           SAMPLE=SPLIT_SAMPLE, BINS=SPLIT_BINS, MAXSEG=SPLIT_MAXSEG, PARTS=parts, PROF=prof is not None, PDL=pdl,
           num_warps=warps, **pdl_options(pdl))


@launches_kernels
def legacy_indexer_topk(
    inputs, *, topk=None, layout=None, weight_scale=None, out: Optional[IndexerTopKResult] = None,
    workspace: Optional[torch.Tensor] = None, budget_bytes: Optional[int] = None,
    rows_per_request: Optional[int] = None,
) -> IndexerTopKResult:
    """Score all rows into a key matrix (chunked by rows under the budget), then select.

    ``inputs``: :class:`~indexer_topk.contract.IndexerInputs` (or a tuple, see
    :func:`~indexer_topk.contract.as_inputs`). The matrix is ``[chunk_rows, width]``, the
    rows the budget allows at once (``budget_bytes``, default ``INDEXER_TOPK_LOGITS_BUDGET_MB``,
    down to two rows). A ``workspace`` that holds that chunk is its storage; a smaller one
    (e.g. sized for the fused path by :func:`indexer_topk.workspace_size` on a call the policy
    sent here) is left untouched and the chunk is allocated for the call: cutting the matrix
    to the workspace's size would run the rows in many small chunks, each a pass of the
    select, for no saving the budget does not already make. ``rows_per_request=1`` says every
    row has pages of its own (a decode batch): rows are then scored one per tile.
    """
    inputs = as_inputs(inputs, topk=topk, layout=layout, weight_scale=weight_scale)
    page_table, seq_lens = inputs.page_table, inputs.seq_lens
    rows, topk, device = inputs.rows, inputs.topk, inputs.device
    if out is None:
        out = allocate_result(rows, topk, device)
    if rows == 0:
        return out
    width = key_matrix_width(page_table)
    check_workspace(workspace, 0, device)
    _check_samples()  # before the score kernel runs, not at the select stage after it
    _check_row_select()  # likewise
    _check_scored_gate()  # likewise, though only decode chunks read it
    _check_split_warps()  # likewise
    _check_split_programs()  # likewise
    chunk = chunk_rows(rows, width, budget_bytes)
    if workspace is not None and workspace.numel() < chunk * width * 4:
        workspace = None
    if workspace is not None:
        storage = workspace.view(-1)[: chunk * width * 4].view(torch.int32).view(chunk, width)
    else:
        storage = torch.empty((chunk, width), dtype=torch.int32, device=device)
    # the select kernels follow the score kernel on the GPU, the gap between them hidden (a
    # matrix of no columns is not scored: then the select follows the caller's work)
    pdl = width > 0 and pdl_launch(device)
    gate_group = scored_gate_group(inputs, rows_per_request)  # the gate ahead's tile, where a chunk takes it
    for r0 in range(0, rows, chunk):
        n = min(chunk, rows - r0)
        keys = storage[:n]
        if scored_gate_way(inputs, rows_per_request, n, width):
            scored_split(inputs, keys, out=out, row_start=r0, pdl=pdl, group=gate_group)
            lay_out_rows(out, inputs.order, topk, r0, n)
            continue
        legacy_score(inputs, keys=keys, row_start=r0, row_count=n, rows_per_request=rows_per_request)
        legacy_select(keys, seq_lens, page_table, topk=topk, out=out, row_start=r0, pdl=pdl, order=inputs.order)
    return out

