"""Comparing indexer top-k outputs: bitwise between kernels, tolerant against the reference.

Two rules, used by the CLI (``demo``, ``check``), the benchmark and the tests:

* **Kernel vs kernel** (:func:`bitwise_equal`): all four outputs identical bit for bit
  (values compared as int32 bit patterns, so NaN == NaN and ``-0 != +0``). Two kernels that
  issue the same MMA sequence must agree this way.
* **Kernel vs the fp64 reference** (:func:`compare_to_reference`): the reference rounds an
  fp64 score once to fp32 while kernels accumulate in the hardware's MMA precision, so
  scores may differ in the last bits and the order of near-equal scores may differ:

  1. ``counts`` equal exactly;
  2. ``values`` equal elementwise within ``rtol`` / ``atol`` (default 1e-5 / 1e-6), NaN
     matching NaN and ``-inf`` padding matching ``-inf``. Both lists are sorted by their own
     scores, and sorting is 1-Lipschitz, so near-ties reordered *inside* the top-k still pass;
  3. the *set* of selected positions equal, except in a row whose reference ``k``-th and
     ``(k+1)``-th best scores are themselves within that tolerance (a near-tie at the
     selection boundary, where either choice is correct to the kernel's precision). Such rows
     are accepted and counted as ``near_tie_rows`` only where each position is judged by its
     own reference score: every position listed in place of a reference position scores
     within the tolerance of the reference's ``k``-th score (the cut), as does every reference
     position left out, and each listed position carries its own score; the positions must
     still be distinct and inside ``[0, seq_len)``. Scoring the listed positions needs the
     call's inputs: without them a set difference is a mismatch;
  4. every selected position carries the same physical index as in the reference (and, when
     the page table is given, ``page_table[r, raw >> 6] * 64 + (raw & 63)``);
  5. padding past ``counts``: ``-1`` indices and ``-inf`` values.

The ``(k+1)``-th reference score of each row, its *next value*, comes from
:func:`indexer_topk.reference.reference_with_next_values`. :func:`mma_tolerance` gives the
tolerances that fit a kernel: per row for FP8 on a GPU, and, given the call's inputs, never
below a few fp32 ulps of the terms a row's scores are summed from (heads that cancel).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch

from .contract import PAGE_SIZE, IndexerInputs, IndexerTopKResult, Layout

DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-6
FP8_MMA_RTOL = 2e-3
# The widest tolerance a comparison takes, relative to the scores: wider, a rounding and a
# wrong selection look alike (every boundary a near-tie). Five times the FP8 MMA rule.
MAX_RELATIVE_TOLERANCE = 1e-2
# fp32 units in the last place of a score's absolute-term sum (reference.reference_magnitudes)
# that an exact fp32 kernel may be off by. Rows whose heads cancel measured at most 0.07 of one
# under the interpreter (scores 30 to 2,000 times smaller than their terms), which rounds only
# the sum over heads; an MMA also rounds as it accumulates each head's 128 products, a few units
# more in the worst order. At the cut of random rows 4 units make the tolerance 2-7 times the
# default; a boundary off by one position still fails there, as without the inputs.
FP32_MAGNITUDE_ULPS = 4

COMPARISON_RULE = (
    "counts equal; values within rtol {rtol:g} / atol {atol:g} (NaN == NaN); selected position "
    "sets equal except where the reference's k-th and (k+1)-th scores are within that "
    "tolerance and every position swapped at the boundary scores within it of the k-th "
    "(near-tie at the boundary); physical indices consistent; -1 / -inf padding"
)


def comparison_rule(rtol: Optional[float] = None, atol: float = DEFAULT_ATOL, device="cpu",
                    magnitudes: bool = False) -> str:
    """One-line statement of the kernel-vs-reference rule :func:`mma_tolerance` applies, for
    reports. ``rtol=None`` is the default rule, which on a GPU widens for FP8 and, with
    ``magnitudes`` (``mma_tolerance`` given the inputs), for rows whose heads cancel."""
    rule = COMPARISON_RULE.format(rtol=DEFAULT_RTOL if rtol is None else rtol, atol=atol)
    if rtol is None and torch.device(device).type != "cpu":
        rule += (f"; sglang_fp8 on a GPU: rtol {FP8_MMA_RTOL:g} plus {FP8_MMA_RTOL:g} of the row's largest "
                 "score (Hopper's fp8 MMA accumulator)")
    if rtol is None and magnitudes:
        rule += (f"; atol per slot at least {FP32_MAGNITUDE_ULPS} fp32 ulps of the selected position's sum "
                 "of absolute terms (heads that cancel)")
    return rule


def check_tolerance(rtol=None, atol=None) -> None:
    """Raise ``ValueError`` naming ``rtol`` or ``atol`` for a tolerance under which a comparison
    could not fail: not finite, negative, or (``rtol``) above :data:`MAX_RELATIVE_TOLERANCE`.
    ``atol`` may be a tensor of per-row tolerances; ``None`` skips a check."""
    if rtol is not None:
        if not isinstance(rtol, (int, float)) or not 0 <= rtol <= MAX_RELATIVE_TOLERANCE:  # NaN fails too
            raise ValueError(f"rtol: expected a number in [0, {MAX_RELATIVE_TOLERANCE:g}], got {rtol!r}")
    if atol is not None:
        a = torch.as_tensor(atol, dtype=torch.float64)
        if not bool(torch.isfinite(a).all()) or bool((a < 0).any()):
            raise ValueError(f"atol: expected a finite, non-negative number, got {atol!r}")


def _check_atol_against_scores(atol: torch.Tensor, values: torch.Tensor) -> None:
    """The absolute tolerance must be small next to the call's scores: at most
    :data:`MAX_RELATIVE_TOLERANCE` of the largest finite reference score (or the default
    tolerance, where every score is 0)."""
    finite = values.double()[torch.isfinite(values)]
    largest = float(finite.abs().max()) if finite.numel() else 0.0
    limit = max(DEFAULT_ATOL, MAX_RELATIVE_TOLERANCE * largest)
    widest = float(atol.max()) if atol.numel() else 0.0
    if widest > limit:
        raise ValueError(
            f"atol: {widest:g} is not small next to the scores (largest {largest:g}); at most {limit:g} here, "
            "or every selection boundary would pass as a near-tie"
        )


def bitwise_equal(a: IndexerTopKResult, b: IndexerTopKResult) -> bool:
    """True when all four outputs have the same dtypes and shapes and are identical bit for bit
    (values compared as int32 bits)."""
    if any(x.dtype != y.dtype or x.shape != y.shape for x, y in zip(a, b)):
        return False
    va = a.values.contiguous().view(torch.int32)
    vb = b.values.contiguous().view(torch.int32)
    return (
        torch.equal(va, vb)
        and torch.equal(a.raw_indices, b.raw_indices)
        and torch.equal(a.physical_indices, b.physical_indices)
        and torch.equal(a.counts, b.counts)
    )


def first_difference(a: IndexerTopKResult, b: IndexerTopKResult) -> str:
    """Where two results first differ (``"identical"`` if they do not), for messages."""
    a = IndexerTopKResult(*(t.cpu() for t in a))
    b = IndexerTopKResult(*(t.cpu() for t in b))
    for name, x, y in zip(IndexerTopKResult._fields, a, b):
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"{name}: {x.dtype} {list(x.shape)} vs {y.dtype} {list(y.shape)}"
    bad_counts = (a.counts != b.counts).nonzero().flatten().tolist()
    if bad_counts:
        r = bad_counts[0]
        return f"{len(bad_counts)} count(s) differ; row {r}: {int(a.counts[r])} vs {int(b.counts[r])}"
    for name, x, y in (
        ("values", a.values.contiguous().view(torch.int32), b.values.contiguous().view(torch.int32)),
        ("raw_indices", a.raw_indices, b.raw_indices),
        ("physical_indices", a.physical_indices, b.physical_indices),
    ):
        diff = (x != y).nonzero()
        if len(diff):
            r, j = (int(v) for v in diff[0])
            rows = sorted(set(diff[:, 0].tolist()))
            return (
                f"{name} differ in {len(diff)} slot(s) of rows {rows[:8]}; row {r} slot {j}: "
                f"value {float(a.values[r, j])!r} vs {float(b.values[r, j])!r}, "
                f"raw {int(a.raw_indices[r, j])} vs {int(b.raw_indices[r, j])}, "
                f"physical {int(a.physical_indices[r, j])} vs {int(b.physical_indices[r, j])}"
            )
    return "identical"


def values_close(a: torch.Tensor, b: torch.Tensor, rtol: float = DEFAULT_RTOL, atol=DEFAULT_ATOL) -> torch.Tensor:
    """Elementwise ``|a - b| <= atol + rtol * |b|`` in float64, NaN matching NaN, equal infinities
    matching. ``atol`` is a float, a tensor ``[rows]`` with one tolerance per row of ``a``, or a
    tensor of ``a``'s shape, one per element."""
    ad, bd = a.double(), b.double()
    tol = torch.as_tensor(atol, dtype=torch.float64, device=ad.device)
    if tol.dim() == 1:
        tol = tol.reshape(-1, *([1] * (ad.dim() - 1)))
    return ((ad - bd).abs() <= tol + rtol * bd.abs()) | (torch.isnan(ad) & torch.isnan(bd)) | (ad == bd)


@dataclass
class Comparison:
    """Outcome of :func:`compare_to_reference`.

    Row lists hold the offending row numbers; ``near_tie_rows`` are rows whose position sets
    differ but were accepted by the boundary near-tie rule (not failures).
    """

    rows: int
    count_rows: List[int] = field(default_factory=list)
    value_rows: List[int] = field(default_factory=list)
    set_rows: List[int] = field(default_factory=list)
    physical_rows: List[int] = field(default_factory=list)
    padding_rows: List[int] = field(default_factory=list)
    near_tie_rows: List[int] = field(default_factory=list)
    messages: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.count_rows or self.value_rows or self.set_rows or self.physical_rows or self.padding_rows)

    def summary(self) -> str:
        """One line: ``ok`` (with accepted near-ties) or the kinds of mismatch and their row counts."""
        if self.ok:
            if self.near_tie_rows:
                return f"ok ({len(self.near_tie_rows)} row(s) differ only in a boundary near-tie)"
            return "ok"
        parts = []
        for name, rows in (
            ("counts", self.count_rows),
            ("values", self.value_rows),
            ("index sets", self.set_rows),
            ("physical", self.physical_rows),
            ("padding", self.padding_rows),
        ):
            if rows:
                parts.append(f"{name} in {len(rows)} row(s)")
        head = "MISMATCH: " + ", ".join(parts)
        return head + (f" [{self.messages[0]}]" if self.messages else "")

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "rows": self.rows,
            "count_rows": self.count_rows,
            "value_rows": self.value_rows,
            "set_rows": self.set_rows,
            "physical_rows": self.physical_rows,
            "padding_rows": self.padding_rows,
            "near_tie_rows": self.near_tie_rows,
            "messages": self.messages,
        }


def mma_tolerance(
    layout, device, expected: IndexerTopKResult, rtol: Optional[float] = None, atol: float = DEFAULT_ATOL,
    inputs: Optional[IndexerInputs] = None,
) -> dict:
    """Keyword arguments for :func:`compare_to_reference` that fit a kernel's arithmetic.

    ``rtol`` / ``atol`` given by a caller replace the rule below (``atol`` stays the floor of
    the per-row tolerance).

    Kernels on the MXFP4 layouts (bf16 MMA with fp32 accumulation) and every kernel under the
    Triton interpreter (fp32) agree with the fp64 reference to fp32 rounding: the defaults.
    Hopper's fp8 MMA keeps fewer accumulator bits than fp32, and its error scales with the
    magnitudes summed inside each head's dot product rather than with the (possibly cancelled)
    score, so FP8 kernels on a GPU get ``rtol`` 2e-3 plus an absolute tolerance of 2e-3 times
    the row's largest finite reference score (measured on the H200: 6e-4 relative on large
    scores, 2e-4 absolute on scores near 0.02 in rows whose best score is a few units).

    fp32 rounding too scales with the summed magnitudes, not with the score: where a row's 64
    weighted heads cancel, a score far smaller than its terms is off by more than ``rtol`` of
    itself in an exact kernel. With the call's ``inputs``, ``atol`` is given per slot
    (``[rows, topk]``): at least :data:`FP32_MAGNITUDE_ULPS` fp32 units in the last place of the
    absolute-term sum of the position the reference lists there
    (:func:`indexer_topk.reference.reference_magnitudes`), and at most the widest tolerance of
    its row, :data:`MAX_RELATIVE_TOLERANCE` of the row's largest score. A selection boundary is
    judged at the tolerance of the reference's last selected slot. Without the inputs a row that
    cancels can read as a value mismatch.
    """
    if rtol is not None:
        return {"rtol": rtol, "atol": atol}
    rows = expected.counts.shape[0]
    floor = torch.full((rows,), float(atol), dtype=torch.float64)
    rule = {"rtol": DEFAULT_RTOL, "atol": atol}
    v = expected.values.detach().double().cpu()
    finite = torch.where(torch.isfinite(v), v.abs(), torch.zeros_like(v))
    largest = finite.amax(dim=1) if v.dim() == 2 and v.shape[1] else torch.zeros(rows, dtype=torch.float64)
    if Layout(layout) is Layout.SGLANG_FP8 and torch.device(device).type != "cpu":
        floor = torch.clamp(FP8_MMA_RTOL * largest, min=atol)
        rule = {"rtol": FP8_MMA_RTOL, "atol": floor}
    if inputs is None:
        return rule
    # a slot whose terms cancel beyond what its row's widest tolerance allows is judged at that
    # limit (and may read as a mismatch): wider, any selection boundary would pass as a near-tie
    row_limit = torch.clamp(MAX_RELATIVE_TOLERANCE * largest, min=DEFAULT_ATOL)[:, None]
    widened = torch.minimum(FP32_MAGNITUDE_ULPS * slot_magnitudes(expected, inputs) * 2.0**-23, row_limit)
    return {**rule, "atol": torch.maximum(floor[:, None], widened)}


def slot_magnitudes(expected: IndexerTopKResult, inputs: IndexerInputs, row_block: int = 16) -> torch.Tensor:
    """float64 ``[rows, topk]`` (on the CPU): the absolute-term sum
    (:func:`indexer_topk.reference.reference_magnitudes`) of each position the reference
    selected, 0 past a row's count; ``row_block`` rows at a time."""
    from .reference import reference_magnitudes

    _check_inputs(inputs)
    counts = expected.counts.detach().long().cpu()
    raw = expected.raw_indices.detach().long().cpu()
    dev = inputs.k_cache.device
    out = torch.zeros(raw.shape, dtype=torch.float64)
    for r0 in range(0, counts.shape[0], row_block):
        rows = torch.arange(r0, min(r0 + row_block, counts.shape[0]))
        if not bool((counts[rows] > 0).any()):
            continue  # nothing selected: no key to read (the cache may hold no page at all)
        pos = torch.where(torch.arange(raw.shape[1])[None, :] < counts[rows, None], raw[rows], -1)
        m = reference_magnitudes(*inputs.tensors, layout=inputs.layout, weight_scale=inputs.weight_scale,
                                 rows=rows.to(dev), positions=pos.to(dev)).cpu()
        # NaN weights (a NaN row) make NaN sums; such a row's values are NaN and need no widening
        out[rows] = torch.nan_to_num(m, nan=0.0, posinf=0.0)
    return out


def _check_inputs(inputs) -> None:
    if not isinstance(inputs, IndexerInputs):
        raise ValueError(f"inputs: expected IndexerInputs (or a Workload), got {type(inputs).__name__}")


def _as_result(x) -> IndexerTopKResult:
    return x if isinstance(x, IndexerTopKResult) else IndexerTopKResult(*x)


def compare_to_reference(
    actual: IndexerTopKResult,
    expected: IndexerTopKResult,
    *,
    next_values: Optional[torch.Tensor] = None,
    inputs: Optional[IndexerInputs] = None,
    seq_lens: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    rtol: float = DEFAULT_RTOL,
    atol=DEFAULT_ATOL,
    max_messages: int = 8,
) -> Comparison:
    """Compare a kernel's outputs with the reference's under the rule in the module docstring.

    Parameters
    ----------
    actual, expected : IndexerTopKResult
        ``values`` float32 ``[rows, topk]``, ``raw_indices`` / ``physical_indices`` int32
        ``[rows, topk]``, ``counts`` int32 ``[rows]``; ``expected`` from the reference.
    next_values : torch.Tensor, optional
        float32 ``[rows]``: the reference's ``(k+1)``-th best score per row (``-inf`` where a row
        has at most ``topk`` positions), from
        :func:`indexer_topk.reference.reference_with_next_values`. Without it the
        near-tie exception is off and any set difference is a mismatch.
    inputs : IndexerInputs, optional
        The call's inputs (a :class:`~indexer_topk.workload.Workload` is one). A near-tie row
        is accepted only after the reference scores the positions the kernel lists in place
        of the reference's (:func:`indexer_topk.reference.reference_scores_at`): each must
        score within the tolerance of the cut and carry that score. Without them the near-tie
        exception is off. They also supply ``seq_lens`` and ``page_table`` where those are
        not given.
    seq_lens : torch.Tensor, optional
        int32 ``[rows]``; when given, accepted near-tie rows must select positions in
        ``[0, seq_len)``.
    page_table : torch.Tensor, optional
        int32 ``[rows, max_pages]``; when given, every selected physical index is checked
        against it as well.
    rtol, atol : float
        Tolerance for score comparisons (``|a - b| <= atol + rtol * |b|``); ``atol`` may be a
        tensor ``[rows]``, one tolerance per row (see :func:`mma_tolerance`). ``ValueError``
        for a tolerance under which the comparison could not fail (:func:`check_tolerance`, and
        ``atol`` above :data:`MAX_RELATIVE_TOLERANCE` of the largest reference score).

    Returns
    -------
    Comparison
        ``.ok`` is the verdict; ``.summary()`` a one-line description.
    """
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if tol is None:  # (check_tolerance takes None as "not given")
            raise ValueError(f"{name}: expected a tolerance, got None; mma_tolerance() gives a kernel's")
    check_tolerance(rtol, atol)
    if inputs is not None:
        _check_inputs(inputs)
        seq_lens = inputs.seq_lens if seq_lens is None else seq_lens
        page_table = inputs.page_table if page_table is None else page_table
    actual, expected = _as_result(actual), _as_result(expected)
    dev = torch.device("cpu")  # comparisons are tiny next to the call; keep the logic off-device
    a = IndexerTopKResult(*(t.detach().to(dev) for t in actual))
    e = IndexerTopKResult(*(t.detach().to(dev) for t in expected))
    atol = torch.as_tensor(atol, dtype=torch.float64).detach().to(dev)  # a float, one per row or one per slot
    rows = e.counts.shape[0]
    if not (atol.dim() == 0 or (atol.dim() == 1 and atol.shape[0] == rows)
            or (atol.dim() == 2 and atol.shape == e.values.shape)):
        raise ValueError(f"atol: per-row tolerances must be a tensor [rows] = [{rows}], per-slot ones "
                         f"[rows, topk] = {list(e.values.shape)}; got shape {list(atol.shape)}")
    _check_atol_against_scores(atol, e.values)
    cmp = Comparison(rows=rows)

    def note(msg: str):
        if len(cmp.messages) < max_messages:
            cmp.messages.append(msg)

    if a.values.shape != e.values.shape or a.counts.shape != e.counts.shape:
        cmp.count_rows = list(range(rows))
        note(f"shape: got values {list(a.values.shape)}, expected {list(e.values.shape)}")
        return cmp
    topk = e.values.shape[1] if e.values.dim() == 2 else 0

    count_bad = a.counts != e.counts
    cmp.count_rows = count_bad.nonzero().flatten().tolist()
    for r in cmp.count_rows[:2]:
        note(f"row {r}: count {int(a.counts[r])}, expected {int(e.counts[r])}")

    slot = torch.arange(topk)[None, :]
    valid = slot < e.counts.long()[:, None]

    # Padding past counts (checked against the kernel's own counts only where they agree).
    pad = ~valid
    pad_bad = pad & ((a.raw_indices != -1) | (a.physical_indices != -1) | (a.values != float("-inf")))
    pad_rows = (pad_bad.any(1) & ~count_bad).nonzero().flatten().tolist()
    cmp.padding_rows = pad_rows
    for r in pad_rows[:2]:
        j = int(pad_bad[r].nonzero()[0])
        note(
            f"row {r} slot {j}: padding should be -1/-1/-inf, got raw {int(a.raw_indices[r, j])}, "
            f"physical {int(a.physical_indices[r, j])}, value {float(a.values[r, j])!r}"
        )

    close = values_close(a.values, e.values, rtol, atol) | pad
    value_bad = ~close.all(1) & ~count_bad
    cmp.value_rows = value_bad.nonzero().flatten().tolist()
    for r in cmp.value_rows[:2]:
        j = int((~close[r]).nonzero()[0])
        note(f"row {r} slot {j}: value {float(a.values[r, j])!r}, expected {float(e.values[r, j])!r}")

    # Position sets: sort each row's valid positions (padding sorts last) and compare.
    big = torch.iinfo(torch.int64).max
    fill = torch.full(valid.shape, big, dtype=torch.int64)
    ra = torch.where(valid, a.raw_indices.long(), fill)
    re = torch.where(valid, e.raw_indices.long(), fill)
    sa, ia = ra.sort(dim=1)
    se, ie = re.sort(dim=1)
    same_set = (sa == se).all(1) & ~count_bad

    # Physical indices, paired with their raw positions.
    pa = torch.gather(a.physical_indices.long(), 1, ia)
    pe = torch.gather(e.physical_indices.long(), 1, ie)
    phys_bad = ((pa != pe) & (se != big)).any(1) & same_set
    if page_table is not None and page_table.shape[1] > 0:  # no pages: no position to check against one
        pt = page_table.detach().to(dev).long()
        raw_c = a.raw_indices.long().clamp(min=0)
        page = torch.gather(pt, 1, (raw_c // PAGE_SIZE).clamp(max=pt.shape[1] - 1))
        want = page * PAGE_SIZE + raw_c % PAGE_SIZE
        phys_bad |= ((a.physical_indices.long() != want) & valid).any(1) & ~count_bad
    cmp.physical_rows = phys_bad.nonzero().flatten().tolist()
    for r in cmp.physical_rows[:2]:
        note(f"row {r}: physical indices disagree with the raw positions")

    lens = None if seq_lens is None else seq_lens.detach().to(dev).long()
    next_values = None if next_values is None else next_values.detach().to(dev)
    near_ties = []
    for r in (~same_set & ~count_bad).nonzero().flatten().tolist():
        n = int(e.counts[r])
        got = sa[r, :n]
        in_range = bool((got >= 0).all()) and (lens is None or bool((got < lens[r]).all()))
        distinct = bool((got[1:] != got[:-1]).all()) if n > 1 else True
        boundary_tie = (
            next_values is not None
            and n == topk
            and bool(values_close(e.values[r, n - 1 : n], next_values[r : r + 1], rtol, _at_cut(atol, r, n)))
        )
        if boundary_tie and in_range and distinct and inputs is not None:
            near_ties.append(r)
            continue
        cmp.set_rows.append(r)
        extra = sorted(set(got.tolist()) - set(se[r, :n].tolist()))[:4]
        missing = sorted(set(se[r, :n].tolist()) - set(got.tolist()))[:4]
        why = "" if in_range and distinct else " (positions out of range or repeated)"
        if boundary_tie and not why:
            why = " (a boundary near-tie is accepted only with the inputs, to score each listed position)"
        note(f"row {r}: selected {extra} instead of {missing}{why}")
    if near_ties:
        for r, msg in _judge_near_ties(a, e, near_ties, inputs, rtol, atol):
            if msg is None:
                cmp.near_tie_rows.append(r)
            else:
                cmp.set_rows.append(r)
                note(msg)
        cmp.set_rows.sort()
    return cmp


def _at_cut(atol: torch.Tensor, r: int, n: int) -> torch.Tensor:
    """Row ``r``'s tolerance at its cut, the reference's ``n``-th (last) selected slot."""
    return atol if atol.dim() == 0 else atol[r] if atol.dim() == 1 else atol[r, n - 1]


def _judge_near_ties(a: IndexerTopKResult, e: IndexerTopKResult, rows, inputs: IndexerInputs, rtol, atol):
    """``(row, None)`` for each boundary near-tie row whose positions all hold up by their own
    reference scores, ``(row, message)`` for the others: a position the kernel lists in place
    of a reference position must score within the tolerance of the cut (the reference's k-th
    score) and carry its own score; a reference position it leaves out must score within the
    tolerance of the cut."""
    from .reference import reference_scores_at

    extras = []  # (row, slot, position) listed by the kernel but not by the reference
    for r in rows:
        n = int(e.counts[r])
        ref_pos = set(e.raw_indices[r, :n].tolist())
        extras += [(r, j, p) for j, p in enumerate(a.raw_indices[r, :n].tolist()) if p not in ref_pos]
    dev = inputs.k_cache.device
    own = reference_scores_at(
        *inputs.tensors, layout=inputs.layout, weight_scale=inputs.weight_scale,
        rows=torch.tensor([x[0] for x in extras], dtype=torch.int64, device=dev),
        positions=torch.tensor([x[2] for x in extras], dtype=torch.int64, device=dev),
    ).cpu()
    verdicts = []
    for r in rows:
        n = int(e.counts[r])
        tol = _at_cut(atol, r, n)
        cut = e.values[r, n - 1 : n]
        mine = [(j, p, own[i : i + 1]) for i, (rr, j, p) in enumerate(extras) if rr == r]
        listed = set(a.raw_indices[r, :n].tolist())
        msg = None
        for j, p, score in mine:
            if not bool(values_close(score, cut, rtol, tol)):
                msg = (f"row {r}: position {p}, listed at the boundary, scores {float(score)!r} by the reference, "
                       f"not within tolerance of the cut {float(cut)!r}")
            elif not bool(values_close(a.values[r, j : j + 1], score, rtol, tol)):
                msg = f"row {r}: position {p} listed with {float(a.values[r, j])!r}, its reference score is {float(score)!r}"
            if msg:
                break
        if msg is None:
            for j, p in enumerate(e.raw_indices[r, :n].tolist()):
                if p not in listed and not bool(values_close(e.values[r, j : j + 1], cut, rtol, tol)):
                    msg = (f"row {r}: position {p} (reference score {float(e.values[r, j])!r}) left out, "
                           f"not within tolerance of the cut {float(cut)!r}")
                    break
        verdicts.append((r, msg))
    return verdicts


__all__ = [
    "Comparison",
    "DEFAULT_ATOL",
    "DEFAULT_RTOL",
    "bitwise_equal",
    "check_tolerance",
    "compare_to_reference",
    "first_difference",
    "mma_tolerance",
    "slot_magnitudes",
    "comparison_rule",
    "values_close",
]
