"""The serving mix: every shape a DeepSeek-V4 server runs, ours beside the serving engine's path.

A *shape* (:class:`MixShape`) is one indexer call as a server makes it: a prefill chunk (the
last ``rows`` query rows of one request of ``context_tokens`` tokens) or a decode step
(``requests`` requests of one or a few rows each, each with its own pages). For each shape
:func:`run_mix` times, on the same bytes, in one process:

- **ours**: ``backend="auto"`` through the out operator
  (``torch.ops.indexer_topk.indexer_topk_out``) with a caller-owned workspace and
  ``check_values=False``, and the backend it took (``route``), in the order the SGLang plugin asks
  of that route (:func:`indexer_topk.orders.serving_order`, the record's ``order``: SGLang's own
  path returns rows unordered), as every candidate below is;
- each of our exact backends (``candidates``: ``fused``, ``legacy``, and ``aiter`` where it
  runs) the same way, each compared with legacy bit for bit;
- the serving engine's own path where it has one (SGLang's: DeepGEMM's MQA logits, then its
  ``topk_v2``; see :class:`SGLangPath`), and how much of its selection ours shares:
  ``sglang_ms``, ``null`` where SGLang has no path for the shape, absent where its path was
  not timed (no kit given, or its timing failed: ``sglang_error``), which a routes table reads
  as "the engine keeps the shapes it has a path for".

Prefill is timed eagerly, as an eager prefill runs: ``ours_ms`` is the median CUDA-event time of
single calls, host time included where the GPU waits for it, timed in rounds that take ``auto``
and the candidates in turn (:func:`interleaved_ms`; a re-routed shape's ``auto`` in turn with
legacy), so that no path is always first; ``host_us`` the mean host wall time per call over
back-to-back calls without a sync (the calls after a shape's first, which replay its launches),
and ``host_us_run_median`` the median of its runs' means (a run of :data:`HOST_RUN` calls that
the host's scheduler interrupts moves the mean, not this); ``host_us_api`` the same for the
Python API called directly (what the SGLang plugin calls: the difference is the operator's
dispatch), the two timed run by run in turn (:func:`host_us_in_turn`); ``host_us_first`` the
host time of a shape's first call with warm kernels (validation, planning and recording);
``host_us_checked`` the wall time per call with ``check_values=True`` (which syncs). Decode is
replayed from a CUDA graph, as a server runs it: ``ours_ms`` and ``sglang_ms`` on the bytes the
replay before left in L2 wherever they fit, ``ours_ms_cold`` and ``sglang_ms_cold`` with the L2
overwritten before each replay (:func:`.timing.l2_evictor`), the keys read from HBM as a
server's step reads each layer's cache; each replay behind a spin of the GPU
(:func:`.timing.queue_hold`), so that its events time its kernels, not the host's enqueueing of it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..contract import PAGE_SIZE, SGLANG_FP8_SLOT_BYTES, SGLANG_MXFP4_SLOT_BYTES
from ..orders import serving_order
from .timing import l2_evictor, median_ms, queue_hold, synchronize, time_call

# key bytes a position (AITER's MXFP4 page holds the same bytes as SGLang's, split otherwise)
DECODE_FLOOR_BYTES = {"sglang_fp8": SGLANG_FP8_SLOT_BYTES, "sglang_mxfp4": SGLANG_MXFP4_SLOT_BYTES,
                      "aiter_mxfp4": SGLANG_MXFP4_SLOT_BYTES}
HBM_BYTES_PER_S = 4.8e12


@dataclass(frozen=True)
class MixShape:
    """One indexer call of the serving mix.

    ``context_tokens``: raw tokens of each request (C4 positions are a quarter); with
    ``spread`` the requests' lengths run evenly from 4K tokens up to it (a mixed decode batch).
    ``rows_per_request``: query rows per request (prefill: the chunk; decode: 1, or 2 with an
    MTP draft row).
    """

    kind: str
    layout: str
    topk: int
    requests: int
    rows_per_request: int
    context_tokens: int
    spread: bool = False

    @classmethod
    def from_record(cls, rec: dict) -> "MixShape":
        """The shape a record of :func:`run_mix` was measured on."""
        return cls(**{k: rec[k] for k in cls.__dataclass_fields__})

    @property
    def rows(self) -> int:
        return self.requests * self.rows_per_request

    @property
    def label(self) -> str:
        ctx = f"{self.context_tokens // 1024}K"
        if self.kind == "prefill":
            text = f"prefill {self.rows} x {ctx}"
        else:
            text = f"decode {self.requests} x {'4K..' if self.spread else ''}{ctx}"
            text += f" x {self.rows_per_request} rows" if self.rows_per_request > 1 else ""
        extra = [x for x in (self.layout if self.layout != "sglang_fp8" else "",
                             f"topk {self.topk}" if self.topk != 1024 else "") if x]
        return text + (f" ({', '.join(extra)})" if extra else "")

    def context_lengths(self) -> List[int]:
        if not self.spread or self.requests == 1:
            return [self.context_tokens] * self.requests
        lo = 4096
        step = (self.context_tokens - lo) / (self.requests - 1)
        return [int(lo + i * step) // 256 * 256 for i in range(self.requests)]


def default_shapes(smoke: bool = False) -> List[MixShape]:
    """The serving mix: FP8 prefill chunks of 128 / 1024 / 8192 rows at 16K-768K tokens, 1024 x
    256K at topk 512, the MXFP4 caches at 1024 x 64K / 768K; FP8 decode at 1-64 requests x 128K /
    768K and 256 x 32K / 128K, MTP, topk 512, a mixed batch, and MXFP4 decode. ``smoke``: two
    tiny shapes for a CPU under the interpreter."""
    if smoke:
        return [MixShape("prefill", "sglang_fp8", 512, 1, 3, 3000), MixShape("decode", "sglang_fp8", 512, 2, 1, 3000)]
    K = 1024
    shapes = [MixShape("prefill", "sglang_fp8", 1024, 1, rows, ctx * K)
              for rows in (128, 1024, 8192) for ctx in (16, 64, 256, 768)]
    shapes.append(MixShape("prefill", "sglang_fp8", 512, 1, 1024, 256 * K))
    shapes += [MixShape("prefill", layout, 1024, 1, 1024, ctx * K)
               for layout in ("sglang_mxfp4", "aiter_mxfp4") for ctx in (64, 768)]
    shapes += [MixShape("decode", "sglang_fp8", 1024, n, 1, ctx * K) for n in (1, 8, 32, 64) for ctx in (128, 768)]
    shapes += [MixShape("decode", "sglang_fp8", 1024, 256, 1, ctx * K) for ctx in (32, 128)]
    shapes += [
        MixShape("decode", "sglang_fp8", 1024, 32, 2, 768 * K),
        MixShape("decode", "sglang_fp8", 512, 8, 1, 768 * K),
        MixShape("decode", "sglang_fp8", 1024, 64, 1, 768 * K, spread=True),
    ]
    shapes += [MixShape("decode", "sglang_mxfp4", 1024, n, 1, 768 * K) for n in (8, 32, 64)]
    return shapes


def make_inputs(shape: MixShape, device, seed: int = 0):
    """The shape's workload (:func:`indexer_topk.workload.make_workload`), same bytes for every path."""
    from ..workload import make_workload

    return make_workload(shape.layout, context_tokens=shape.context_lengths(),
                         rows_per_request=[shape.rows_per_request] * shape.requests, topk=shape.topk, seed=seed,
                         device=device, page_table_pad=0)


def decode_floor_ms(shape: MixShape) -> Optional[float]:
    """The time to read every key of a decode step once at HBM bandwidth."""
    if shape.kind != "decode":
        return None
    positions = sum(t // 4 for t in shape.context_lengths())
    return positions * DECODE_FLOOR_BYTES[shape.layout] / HBM_BYTES_PER_S * 1e3


def capture_graph(step: Callable[[], None]) -> "torch.cuda.CUDAGraph":
    """``step`` captured in a CUDA graph, after one run on a side stream (which compiles and
    records outside the capture, as an engine warms up before capturing)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def graph_ms(step: Callable[[], None], *, iters: int, device, cold: bool = False) -> float:
    """Median ms of ``step`` replayed from a CUDA graph (:func:`capture_graph`); replayed once
    more last, so the outputs left behind are the graph's. ``cold``: L2 overwritten before each
    replay (:func:`.timing.l2_evictor`), so the step reads its inputs from HBM. Timed as
    :func:`graph_times` times it, each replay behind :func:`.timing.queue_hold`'s spin."""
    return graph_times(step, iters=iters, device=device, cold=cold)[0]


def graph_times(step: Callable[[], None], *, iters: int, device, cold: bool = False) -> tuple:
    """:func:`graph_ms` of one captured graph: ``(warm ms, L2-cold ms or None)``, the cold one
    with ``cold``. Each replay is timed behind :func:`~indexer_topk.bench.timing.queue_hold`'s
    spin (and, cold, the L2 evictor's fill), so that its events count its kernels, not the host's
    enqueueing of it."""
    graph = capture_graph(step)
    hold = queue_hold(device)
    warm = median_ms(graph.replay, warmup=3, iters=iters, device=device, before=hold)
    evict = l2_evictor(device) if cold else None
    ms_cold = None
    if evict is not None:
        def evict_and_hold() -> None:
            evict()
            if hold is not None:
                hold()

        ms_cold = median_ms(graph.replay, warmup=1, iters=iters, device=device, before=evict_and_hold)
    evict = evict_and_hold = None  # the evictor's buffer goes before the next shape's allocations
    graph.replay()
    synchronize(device)
    return warm, ms_cold


HOST_RUN = 20  # back-to-back calls between syncs when timing host time


def host_us_in_turn(steps: Dict[str, Callable[[], None]], calls: int, device) -> Dict[str, Tuple[float, List[float]]]:
    """``{name: (mean, runs)}``: the mean host wall time per call (us) of each of ``steps`` over
    ``calls`` calls, and each run's mean, made in runs of :data:`HOST_RUN` back-to-back calls with a
    sync before each run (as :func:`host_us`), the steps taking runs in turn, in reverse order every
    other round, so that no step is always timed first. Timed one after the other, the operator
    read up to twice the Python API's host time at shapes of tens of milliseconds on one H100 host
    (``benchmark/results/NOTES.md``): an order or a cost, which only timing them in turn tells apart."""
    elapsed = {name: 0.0 for name in steps}
    runs: Dict[str, List[float]] = {name: [] for name in steps}
    done = 0
    while done < calls:
        n = min(HOST_RUN, calls - done)
        for name in list(steps)[:: 1 if done // HOST_RUN % 2 == 0 else -1]:
            step = steps[name]
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(n):
                step()
            took = time.perf_counter() - t0
            elapsed[name] += took
            runs[name].append(took / n * 1e6)
        done += n
    synchronize(device)
    return {name: (elapsed[name] / calls * 1e6, runs[name]) for name in steps}


def host_us(step: Callable[[], None], calls: int, device, runs: Optional[List[float]] = None) -> float:
    """Mean host wall time per call of ``calls`` calls, made back to back in runs of
    :data:`HOST_RUN` without a sync; between runs a sync, not counted, keeps a full launch queue
    (a GPU slower than the host) from blocking the host and counting GPU time as host time.
    ``runs``: a list that gets each run's mean (us per call)."""
    mean, per_run = host_us_in_turn({"step": step}, calls, device)["step"]
    if runs is not None:
        runs.extend(per_run)
    return mean


def selection_overlap(theirs: torch.Tensor, ours: torch.Tensor) -> float:
    """Fraction of the entries ``theirs`` selects (``>= 0``, ``[rows, k]``) that ``ours`` selects too."""
    mine = ours.long().sort(dim=1).values
    other = theirs.long()
    at = torch.searchsorted(mine, other).clamp(max=mine.shape[1] - 1)
    hit = (mine.gather(1, at) == other) & (other >= 0)
    total = int((other >= 0).sum())
    return float(hit.sum()) / total if total else 1.0


class OurPath:
    """One of our backends on one workload through the out operator, as an engine calls it."""

    def __init__(self, w, backend: str, workspace: Optional[torch.Tensor], device, rows_per_request: Optional[int],
                 order: str = "score"):
        from ..contract import allocate_result

        self.w, self.backend, self.device = w, backend, device
        self.out = allocate_result(w.rows, w.topk, device)
        self.workspace = workspace
        self.args = w.args()
        self.rpr = rows_per_request
        self.order = order

    def step(self, check_values: bool = False) -> None:
        w = self.w
        torch.ops.indexer_topk.indexer_topk_out(*self.args, w.topk, w.layout.value, *self.out, self.workspace,
                                                w.weight_scale, self.backend, check_values, self.rpr, self.order)

    def direct(self) -> None:
        """:meth:`step` through the Python API, without the operator's dispatch."""
        from .. import api

        w = self.w
        api.indexer_topk(*self.args, topk=w.topk, layout=w.layout.value, weight_scale=w.weight_scale,
                         backend=self.backend, out=self.out, workspace=self.workspace, check_values=False,
                         rows_per_request=self.rpr, order=self.order)


def route_of(w, shape: MixShape) -> str:
    """The backend ``auto`` takes for this shape on inputs ``w``: a decode step as captured in a
    CUDA graph."""
    return _auto_route(shape, w.page_table.shape[1] * PAGE_SIZE)


def _auto_route(shape: MixShape, c4_len: int) -> str:
    from ..policy import default_policy

    decode = shape.kind == "decode"
    return default_policy().route(layout=shape.layout, topk=shape.topk, is_decode=decode, capturing=decode,
                                  rows=shape.rows, c4_len=c4_len)


INTERLEAVE_ROUNDS = 4  # rounds of eager timings that take a shape's paths in turn


def timed_in_graphs(shape: MixShape, device) -> bool:
    """Whether the mix times ``shape`` as CUDA-graph replays (a decode step on a GPU, as a server
    runs it) rather than as eager calls."""
    return shape.kind == "decode" and torch.device(device).type == "cuda"


def interleaved_ms(steps: Dict[str, Callable[[], None]], *, iters: int, device,
                   rounds: int = INTERLEAVE_ROUNDS) -> Dict[str, float]:
    """Median per-call time in ms (:func:`time_call`) of each of ``steps``, timed in ``rounds``
    rounds of ``ceil(iters / rounds)`` calls each (one warm-up call first) that take the steps in
    turn, in reverse order every other round. Timed one path after the other, the routed call (timed
    first) read up to a fifth away from the same backend timed next as a candidate in the same
    run, on two cards (``benchmark/results/NOTES.md``): an order, not a path."""
    per: Dict[str, List[float]] = {name: [] for name in steps}
    calls = max(1, -(-int(iters) // rounds))
    for r in range(rounds):
        for name in list(steps)[:: 1 if r % 2 == 0 else -1]:
            per[name] += time_call(steps[name], warmup=1, iters=calls, device=device)
    return {name: statistics.median(times) for name, times in per.items()}


def time_ours(path: OurPath, shape: MixShape, *, iters: int, host_calls: int, host: bool = True,
              ms: Optional[float] = None) -> Dict[str, float]:
    """The timing fields of one of our paths on one shape (see the module docstring); ``host``
    False leaves out the host-time fields and a decode shape's L2-cold time (a candidate's time
    is all a routes table needs).
    ``ms``: an eager time already measured (:func:`interleaved_ms`), kept instead of timing again."""
    from .. import api

    dev = path.device
    if timed_in_graphs(shape, dev):
        path.step()  # compiles and records outside the capture
        warm, cold = graph_times(path.step, iters=iters, device=dev, cold=host)
        return {"ms": warm} if cold is None else {"ms": warm, "ms_cold": cold}
    if ms is None:
        path.step()  # compiles and records, outside the timing (an ``ms`` given was timed after that)
    synchronize(dev)
    if not host:
        return {"ms": median_ms(path.step, warmup=2, iters=iters, device=dev) if ms is None else ms}
    api._KNOWN.clear()  # the shape's first call again, kernels warm
    t0 = time.perf_counter()
    path.step()
    first = (time.perf_counter() - t0) * 1e6
    if ms is None:
        ms = median_ms(path.step, warmup=2, iters=iters, device=dev)
    host = host_us_in_turn({"operator": path.step, "api": path.direct}, host_calls, dev)
    fields = {"ms": ms, "host_us_first": first, "host_us": host["operator"][0],
              "host_us_run_median": statistics.median(host["operator"][1]), "host_us_api": host["api"][0]}
    synchronize(dev)
    t0 = time.perf_counter()
    checked = max(5, host_calls // 20)
    for _ in range(checked):
        path.step(check_values=True)
    synchronize(dev)
    fields["host_us_checked"] = (time.perf_counter() - t0) / checked * 1e6
    return fields


def _inputs_and_legacy(shape: MixShape, device, seed: int):
    """``(inputs, rows_per_request hint, a fused workspace, legacy's path run once)`` of one shape."""
    import indexer_topk

    w = make_inputs(shape, device, seed)
    hint = shape.rows_per_request if shape.kind == "decode" else None
    workspace = torch.empty(indexer_topk.workspace_size(w.rows, w.topk, w.layout.value, device=device),
                            dtype=torch.uint8, device=device)
    order = serving_order(shape.layout, route_of(w, shape), w.rows, w.page_table.shape[1] * PAGE_SIZE, device,
                          decode=shape.kind == "decode")
    base = OurPath(w, "legacy", None, device, hint, order)  # its own matrix, as an engine's fallback has
    base.step()
    return w, hint, workspace, base


def retime_auto(rec: dict, *, device="cuda", iters: int = 10, host_calls: int = 200, seed: int = 0) -> dict:
    """Time ``auto`` again on the shape of ``rec`` (a record of :func:`run_mix`), as routed by the
    process's policy now (a routes table built from the run, say), and update ``rec``: its
    ``route``, ``ours_ms``, host fields and ``matches_legacy``; the earlier route is kept as
    ``route_before``. The other fields (candidates, SGLang's) stand: the same bytes, the same bits."""
    from ..compare import bitwise_equal

    shape = MixShape.from_record(rec)
    w, hint, workspace, base = _inputs_and_legacy(shape, device, seed)
    path = OurPath(w, "auto", workspace, device, hint, base.order)
    eager = None
    if not timed_in_graphs(shape, device):
        path.step()  # compiles and records, outside the timing
        eager = interleaved_ms({"auto": path.step, "legacy": base.step}, iters=iters, device=device)["auto"]
    fields = time_ours(path, shape, iters=iters, host_calls=host_calls, ms=eager)
    rec["route_before"] = rec.get("route")
    rec.update(route=route_of(w, shape), ours_ms=fields["ms"], matches_legacy=bitwise_equal(path.out, base.out),
               **_auto_fields(fields))
    return rec


def _auto_fields(fields: Dict[str, float]) -> Dict[str, float]:
    """What a record keeps of ``auto``'s :func:`time_ours` fields besides its time: the host
    times, and the L2-cold time as ``ours_ms_cold``."""
    kept = {k: v for k, v in fields.items() if k.startswith("host_us")}
    if "ms_cold" in fields:
        kept["ours_ms_cold"] = fields["ms_cold"]
    return kept


def shape_c4(shape: MixShape) -> int:
    """C4 positions a row of ``shape`` may score: the width of the page table its inputs have
    (:func:`make_inputs` pads none), what the policy routes by."""
    return max(1, -(-max(shape.context_lengths()) // 4 // PAGE_SIZE)) * PAGE_SIZE


def shape_route(rec: dict) -> str:
    """The backend ``auto`` takes now for the shape of record ``rec`` (no inputs built)."""
    shape = MixShape.from_record(rec)
    return _auto_route(shape, shape_c4(shape))


def run_mix(shapes: Sequence[MixShape], *, device="cuda", candidates: Sequence[str] = ("fused", "legacy", "aiter"),
            sglang: Optional["SGLangPath"] = None, iters: int = 10, host_calls: int = 200, seed: int = 0,
            progress: Optional[Callable[[int, int, MixShape], None]] = None,
            on_record: Optional[Callable[[dict], None]] = None, warmup: bool = True) -> List[dict]:
    """Time every shape (see the module docstring); one record per shape.

    ``warmup`` (on a GPU): the first shape is measured once more before the run and that record
    dropped. Without it the first shape pays what any first measurement of a process pays (GPU
    clocks coming up from idle, the allocator's first blocks, lazy loads on both paths), seen in
    the committed runs as a first shape several times slower than in the runs before
    (``benchmark/results/NOTES.md``).

    ``candidates``: our backends timed beside ``auto`` (those that cannot run here are left
    out); ``sglang``: the engine's path, or ``None``; ``progress(i, n, shape)`` before each
    shape; ``on_record(record)`` after each (the caller may save as it goes). A shape that
    fails is recorded with its ``error`` and the run goes on.
    """
    from ..compare import bitwise_equal
    from ..errors import BackendUnavailable, failure_reason

    if warmup and shapes and torch.device(device).type == "cuda":
        run_mix(shapes[:1], device=device, candidates=candidates, sglang=sglang, iters=iters, host_calls=host_calls,
                seed=seed, warmup=False)
    records = []
    for i, shape in enumerate(shapes):
        if progress is not None:
            progress(i, len(shapes), shape)
        graphs = timed_in_graphs(shape, device)
        rec = {**asdict(shape), "rows": shape.rows, "timing": "graph" if graphs else "eager",
               "route": None, "ours_ms": None, "host_us": None, "matches_legacy": None,
               "sglang_overlap": None, "candidates": {}, "legacy_ms": None, "decode_floor_ms": decode_floor_ms(shape),
               "order": None}
        try:
            w, hint, workspace, base = _inputs_and_legacy(shape, device, seed)
            synchronize(device)
            legacy_bits = [t.clone() for t in base.out]
            rec["order"] = base.order
            outs, paths = {}, {}
            for name in ["auto", *candidates]:
                path = base if name == "legacy" else OurPath(w, name, workspace, device, hint, base.order)
                try:
                    path.step()  # compiles and records; a backend that cannot run here says so now
                except BackendUnavailable as exc:
                    rec.setdefault("unavailable", {})[name] = str(exc)[:200]
                    continue
                except Exception as exc:  # noqa: BLE001 - a broken candidate must not lose auto's record
                    if name == "auto":
                        raise
                    rec.setdefault("candidates_all", {})[name] = {"error": failure_reason(exc)}
                    continue
                paths[name] = path
            eager = {} if graphs else interleaved_ms({n: p.step for n, p in paths.items()}, iters=iters,
                                                     device=device)
            for name, path in paths.items():
                fields = time_ours(path, shape, iters=iters, host_calls=host_calls, host=name == "auto",
                                   ms=eager.get(name))
                same = bitwise_equal(path.out, type(path.out)(*legacy_bits))
                outs[name] = path.out
                if name == "auto":
                    rec.update(route=route_of(w, shape), ours_ms=fields["ms"], matches_legacy=same,
                               **_auto_fields(fields))
                else:
                    rec.setdefault("candidates_all", {})[name] = {"ms": fields["ms"], "matches_legacy": same}
                    if same:
                        rec["candidates"][name] = fields["ms"]
                    if name == "legacy":
                        rec["legacy_ms"] = fields["ms"]
            if sglang is not None and not sglang.serves(shape):
                rec["sglang_ms"] = None  # SGLang has no path for this shape here
            elif sglang is not None:
                try:
                    ms, selected, ms_cold = sglang.time(w, shape, iters=iters)
                    rec["sglang_ms"] = ms
                    if ms_cold is not None:
                        rec["sglang_ms_cold"] = ms_cold
                    ours = outs["auto"].raw_indices if shape.kind == "prefill" else outs["auto"].physical_indices
                    rec["sglang_overlap"] = selection_overlap(selected, ours)
                except Exception as exc:  # noqa: BLE001 - the engine's path failing is a finding, not a stop
                    rec["sglang_error"] = failure_reason(exc)
            base = path = paths = outs = workspace = w = None
        except Exception as exc:  # noqa: BLE001 - one broken shape must not lose the rest of the run
            rec["error"] = failure_reason(exc)
        if device != "cpu" and torch.cuda.is_available():
            torch.cuda.empty_cache()
        records.append(rec)
        if on_record is not None:
            on_record(rec)
    return records


def load_anchor_kit(kit: str, shapes: Sequence[str] = ()):
    """``(deep_gemm, sglang_cuda_anchor, topk_v2 ops)`` from the SGLang CUDA anchor kit at
    ``kit``, built (``deep_gemm`` importable, ``topk_v2`` in its default build folder). The ops
    are SGLang's ``plan_topk_v2`` / ``topk_transform_paged_v2``: ``.plan(lens)``,
    ``.transform(logits, lens, table, out_pages, page_size, plan, out_raw=None)``; ``shapes``
    (``"ROWSxWIDTH"``) only name the dispatch the kit reports."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    kit = str(Path(kit).resolve())
    if kit not in sys.path:
        sys.path.insert(0, kit)
    import deep_gemm
    import sglang_cuda_anchor as anchor

    topk = anchor.load_topk_v2(SimpleNamespace(topk_v2=str(Path(kit) / "sglang_topk_v2"), topk_v2_build_dir=None),
                               {}, list(shapes))
    return deep_gemm, anchor, topk


class SGLangPath:
    """SGLang 0.5.23's own NVIDIA path for the FP8 cache, from the SGLang CUDA anchor kit.

    Prefill: DeepGEMM's paged MQA logits (non-paged, after gathering the request's keys, from
    8192 rows, as SGLang does), then ``topk_v2``'s plan and ``transform_paged`` with raw
    indices. Decode: the same paged logits with their schedule built once per batch, then the
    plan (once per batch) and ``transform_paged``, replayed from a CUDA graph.
    ``deep_gemm`` must be importable (the kit builds it) and ``kit`` is the kit's folder.
    """

    NONPAGED_MIN_ROWS = 8192

    def __init__(self, kit: str):
        deep_gemm, self.anchor, self.topk = load_anchor_kit(kit)
        self.dg = deep_gemm
        self.paged, self.ragged, _, _ = self.anchor.dg_api(deep_gemm, False)
        self.nsm = deep_gemm.get_num_sms()

    def serves(self, shape: MixShape) -> bool:
        return shape.layout == "sglang_fp8"

    def time(self, w, shape: MixShape, *, iters: int):
        """``(ms, selection, L2-cold ms)``: eager prefill or graph-replayed decode; the selection
        is raw positions (prefill) or page indices (decode), ``[rows, topk]`` int32, ``-1``
        padded; the cold time (:func:`graph_times`) for decode, ``None`` for prefill."""
        dev = w.q.device
        q, _qs, kc, _ks, wts, pt, sl = w.args()
        width = pt.shape[1] * 64
        kv = kc.view(kc.shape[0], 64, 1, kc.shape[1] // 64)
        wd = (wts.float() * w.weight_scale).contiguous()
        pages = torch.full((w.rows, w.topk), -7, dtype=torch.int32, device=dev)
        raw = torch.full((w.rows, w.topk), -7, dtype=torch.int32, device=dev)
        if shape.kind == "decode":
            next_n = shape.rows_per_request  # SGLang's next_n: 2 with one MTP draft row
            qd = q.view(shape.requests, next_n, *q.shape[1:])
            cl = sl.view(shape.requests, next_n)
            table = pt.view(shape.requests, next_n, -1)[:, 0].contiguous()
            schedule = self.dg.get_paged_mqa_logits_metadata(cl, 64, self.nsm)  # once per batch in SGLang
            plan = self.topk.plan(sl)  # once per batch in SGLang

            def step():
                logits = self.paged(qd, kv, wd, cl, table, schedule, width)
                self.topk.transform(logits, sl, pt, pages, 64, plan)

            step()
            warm, cold = graph_times(step, iters=iters, device=dev, cold=True)
            return warm, pages, cold
        cl = sl.view(-1, 1)
        plan = self.topk.plan(sl)  # SGLang plans once per forward batch, for every layer
        if w.rows < self.NONPAGED_MIN_ROWS:
            qd = q.unsqueeze(1)
            schedule = self.dg.get_paged_mqa_logits_metadata(cl, 64, self.nsm)

            def step():
                logits = self.paged(qd, kv, wd, cl, pt, schedule, width)
                self.topk.transform(logits, sl, pt, pages, 64, plan, raw)
        else:
            final = int(sl.max())
            npg = -(-final // 64)
            rows_pages = pt[int(sl.argmax()), :npg].long()
            starts = torch.zeros_like(sl)
            ends = torch.where(sl > w.topk, sl, starts)

            def step():
                blk = kc[rows_pages]  # SGLang gathers the request's keys contiguously first
                k8 = blk[:, : 64 * 128].reshape(-1, 128)[:final].view(torch.float8_e4m3fn)
                ks = blk[:, 64 * 128:].contiguous().view(torch.float32).reshape(-1)[:final]
                logits = self.ragged(q, (k8, ks), wd, starts, ends, npg * 64)
                self.topk.transform(logits, sl, pt, pages, 64, plan, raw)

        step()
        synchronize(dev)
        return median_ms(step, warmup=2, iters=iters, device=dev), raw, None


def sglang_ratios(records: Sequence[dict]) -> List[tuple]:
    """``(record, ours / SGLang)`` of each record of this run that timed both. A record citing
    another run (``source``, taken from an earlier commit's file where this run did not reach
    its shape) is left out: the ratios are this run's."""
    return [(x, x["ours_ms"] / x["sglang_ms"]) for x in records
            if x.get("ours_ms") and x.get("sglang_ms") and not x.get("source")]


def summarize(records: Sequence[dict]) -> dict:
    """Ratios of the mix (:func:`sglang_ratios`), their geometric means and worst per kind; for
    decode also those of the L2-cold replays (``decode_l2_cold``) where both sides have one."""
    out = {}
    for kind in ("prefill", "decode"):
        r = [ratio for x, ratio in sglang_ratios(records) if x.get("kind") == kind]
        out[kind] = {"shapes_with_sglang": len(r), "geomean_ours_over_sglang":
                     statistics.geometric_mean(r) if r else None, "worst": max(r) if r else None}
    cold = [x["ours_ms_cold"] / x["sglang_ms_cold"] for x, _ in sglang_ratios(records)
            if x.get("kind") == "decode" and x.get("ours_ms_cold") and x.get("sglang_ms_cold")]
    if cold:
        out["decode_l2_cold"] = {"shapes_with_sglang": len(cold), "geomean_ours_over_sglang":
                                 statistics.geometric_mean(cold), "worst": max(cold)}
    return out


__all__ = ["MixShape", "OurPath", "SGLangPath", "capture_graph", "decode_floor_ms", "default_shapes", "graph_ms",
           "graph_times", "host_us", "make_inputs", "run_mix",
           "retime_auto", "route_of", "selection_overlap", "sglang_ratios", "shape_route", "summarize", "time_ours"]
