"""Routes tables: the measured fastest exact path for each call shape on one device class, as data.

A table is one JSON document. The package ships one per measured device class beside this
module; ``INDEXER_TOPK_ROUTES=<file>`` names another (say, one ``indexer-topk tune`` wrote)::

    {
      "schema": 1,
      "device": {"vendor": "nvidia", "arch": "sm_90", "sm_count": 132, "name": "NVIDIA H200"},
      "conditions": {"triton": "3.6", "hopper_stream": true},
      "source": "<the records file(s) it was built from>",
      "commit": "<the checkout that built it>",
      "versions": {"torch": "...", "triton": "3.6.0"},
      "context": "c4",
      "engine_margin": 0.05,
      "entries": [
        {"layout": "sglang_fp8", "mode": "prefill", "topk": 1024, "rows": 1024, "c4": 196608,
         "backend": "engine", "ours": "fused",
         "record": [{"file": "...", "commit": "...", "shape": "..."}]}
      ]
    }

``device`` is the device class a table applies to: vendor (``nvidia``, ``amd``), architecture
(``sm_90``, ``gfx950``) and SM (compute unit) count must equal the GPU's; ``conditions`` must
hold too: the installed Triton's ``major.minor`` and, where given, whether the fused backend's
Hopper stream serves (kernel times move with both). An entry's key is its ``layout``, ``mode``
(``prefill``: eager prefill rows; ``decode``: eager decode rows; ``capture``: any call recorded
into a CUDA/HIP graph), ``topk``, ``rows`` (the call's query rows) and ``c4`` (the context in
C4 positions, raw tokens // 4; a call's page-table columns x 64). ``backend`` is the fastest
exact path measured there, ``"engine"`` for the serving engine's own; ``ours`` the fastest of
this package's exact backends (``fused``, ``legacy``, ``aiter``); ``record`` cites the
measurements behind it (file, commit, the record's shape).

Lookup (:meth:`Table.lookup`) of a call: the entries of its layout, mode and ``topk`` (a
``topk`` the table lacks takes the nearest measured one in log space; an unknown ``topk`` the
largest) form a grid of the measured row counts and contexts. The call takes the nearest row
count and the nearest context, each in log space (a value at the geometric mean of two buckets
takes the larger); a grid cell nothing measured takes the nearest measured point (log space,
both axes). Below the smallest measured row count or context there is no entry (the caller's
proven rule); above the largest, prefill takes the largest bucket (an unknown size counts as
the largest) and decode and capture have no entry. Lookups cost two bisections and a tuple
index: the grids are built once, when the table is loaded.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from ..contract import SUPPORTED_TOPK, Layout
from ..errors import value_words
from ..files import write_atomically

SCHEMA = 1
MODES = ("prefill", "decode", "capture")
OURS = ("fused", "legacy", "aiter")
ENGINE = "engine"
SHIPPED_DIR = Path(__file__).resolve().parent
VENDORS = {"cuda": "nvidia", "hip": "amd"}
# The engine's own path keeps a shape unless ours measured more than this fraction faster: the
# engine's path is the one it was validated with, and its timings often come from another run.
ENGINE_MARGIN = 0.05
# A table is tens of kilobytes; a file past this is not one (and an endless one, such as a
# device file, would otherwise be read until memory runs out, in every process that loads it).
MAX_TABLE_BYTES = 16 << 20
# Modes whose calls beyond the largest measured shape take the largest bucket (prefill work
# only grows there); decode and capture beyond it take the proven rule.
GROWS = frozenset({"prefill"})

Cell = Tuple[str, str]  # (backend, ours)


class RoutesError(ValueError):
    """A routes table or records file that cannot be used, naming the file and the field."""


@dataclass(frozen=True)
class DeviceClass:
    """Vendor, architecture and SM count: what a table's timings hold for."""

    vendor: str
    arch: str
    sm_count: int
    name: str = ""

    def key(self) -> Tuple[str, str, int]:
        return (self.vendor, self.arch, self.sm_count)

    def words(self) -> str:
        return f"{self.name or self.vendor} {self.arch}, {self.sm_count} SMs"

    def to_json(self) -> dict:
        return {"vendor": self.vendor, "arch": self.arch, "sm_count": self.sm_count, "name": self.name}


def device_class_of(probe) -> Optional[DeviceClass]:
    """The device class of a :class:`indexer_topk.policy.Probe`, or ``None`` (no GPU, or its
    architecture or SM count unknown)."""
    vendor = VENDORS.get(probe.device)
    arch = None
    if probe.device == "cuda" and probe.compute_capability:
        arch = "sm_{}{}".format(*probe.compute_capability)
    elif probe.device == "hip":
        arch = probe.gfx_arch
    if vendor is None or not arch or not probe.sm_count:
        return None
    return DeviceClass(vendor, arch, int(probe.sm_count), probe.device_name)


def _triton_minor(version: Optional[str]) -> Optional[str]:
    parts = str(version or "").split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]) else None


# ---------------------------------------------------------------------------------------------
# The lookup structure
# ---------------------------------------------------------------------------------------------

def _log_distance(a: Tuple[int, int], b: Tuple[int, int]) -> float:
    return math.hypot(math.log(a[0] / b[0]), math.log(a[1] / b[1]))


class _Grid:
    """The entries of one layout, mode and topk, as a grid of nearest buckets."""

    __slots__ = ("rows", "rows_cut", "c4", "c4_cut", "cells", "grows")

    def __init__(self, points: Mapping[Tuple[int, int], Cell], grows: bool):
        measured = sorted(points)
        rows = sorted({r for r, _ in measured})
        c4 = sorted({c for _, c in measured})
        self.rows, self.c4, self.grows = tuple(rows), tuple(c4), grows
        self.rows_cut = tuple(math.sqrt(a * b) for a, b in zip(rows, rows[1:]))
        self.c4_cut = tuple(math.sqrt(a * b) for a, b in zip(c4, c4[1:]))
        self.cells = tuple(
            tuple(points.get((r, c)) or points[min(measured, key=lambda p: _log_distance(p, (r, c)))] for c in c4)
            for r in rows
        )

    def find(self, rows: Optional[int], c4: Optional[int]) -> Optional[Cell]:
        i = self._bucket(rows, self.rows, self.rows_cut)
        j = self._bucket(c4, self.c4, self.c4_cut)
        return None if i is None or j is None else self.cells[i][j]

    def _bucket(self, value: Optional[int], axis, cut) -> Optional[int]:
        """The bucket of ``value`` along one axis: unknown or beyond the largest measured takes
        the largest where the grid grows (prefill), else none; below the smallest, none."""
        if value is None:
            return len(axis) - 1 if self.grows else None
        if value < axis[0] or (value > axis[-1] and not self.grows):
            return None
        return bisect.bisect_right(cut, value)


class Table:
    """A validated routes table (see the module docstring), ready for lookups.

    Attributes
    ----------
    name : str
        The file's name (``nvidia-h200.json``) or ``"records"`` for one built in memory.
    path : str, optional
    shipped : bool
        One of the package's own tables.
    device : DeviceClass
    conditions : dict
    entries : list of dict
        As in the file.
    """

    __slots__ = ("name", "path", "shipped", "doc", "device", "conditions", "entries", "_grids")

    def __init__(self, doc: dict, *, name: str, path: Optional[str] = None, shipped: bool = False):
        self.name, self.path, self.shipped, self.doc = name, path, shipped, doc
        self.device, self.conditions, self.entries = _validate(doc, name)
        grids: Dict[tuple, _Grid] = {}
        by_group: Dict[tuple, Dict[Tuple[int, int], Cell]] = {}
        for e in self.entries:
            by_group.setdefault((e["layout"], e["mode"], e["topk"]), {})[(e["rows"], e["c4"])] = (e["backend"], e["ours"])
        for (layout, mode, topk), points in by_group.items():
            grid = _Grid(points, mode in GROWS)
            grids[(layout, mode, topk)] = grid
        for layout in Layout:
            for mode in MODES:
                measured = sorted(t for (lay, m, t) in grids if lay == layout.value and m == mode)
                if not measured:
                    continue
                for topk in (None,) + SUPPORTED_TOPK:
                    near = measured[-1] if topk is None else min(measured, key=lambda t: (abs(math.log(t / topk)), t))
                    for key in (layout, layout.value):
                        grids.setdefault((key, mode, topk), grids[(layout.value, mode, near)])
        self._grids = grids

    def lookup(self, layout, mode: str, topk: Optional[int], rows: Optional[int], c4: Optional[int]) -> Optional[Cell]:
        """``(backend, ours)`` for a call, or ``None`` where the table has no entry for it."""
        grid = self._grids.get((layout, mode, topk))
        return None if grid is None else grid.find(rows, c4)

    def cells(self, layout, mode: str) -> List[Cell]:
        """Every measured ``(backend, ours)`` of ``layout`` and ``mode``, over all topk."""
        layout = Layout(layout).value
        return [(e["backend"], e["ours"]) for e in self.entries if e["layout"] == layout and e["mode"] == mode]

    def mismatch(self, probe) -> Optional[str]:
        """Why this table does not apply to ``probe``'s process, or ``None`` when it does."""
        here = device_class_of(probe)
        if here is None or here.key() != self.device.key():
            what = here.words() if here is not None else "this device (no GPU, or its architecture or SM count unknown)"
            return f"it is for {self.device.words()}, not {what}"
        want = self.conditions.get("triton")
        if want is not None and _triton_minor(probe.triton_version) != want:
            return f"it was measured with Triton {want}, this process has Triton {probe.triton_version or 'none'}"
        stream = self.conditions.get("hopper_stream")
        if stream is not None and bool(stream) != bool(probe.hopper_stream):
            return f"it was measured with the Hopper stream {'on' if stream else 'off'}, here it is {'on' if probe.hopper_stream else 'off'}"
        return None

    def words(self) -> str:
        cond = []
        if "triton" in self.conditions:
            cond.append(f"Triton {self.conditions['triton']}")
        if self.conditions.get("hopper_stream"):
            cond.append("Hopper stream")
        return f"{self.name} ({', '.join([self.device.words()] + cond)}; {len(self.entries)} entries)"


# ---------------------------------------------------------------------------------------------
# Validation and loading
# ---------------------------------------------------------------------------------------------

def _need(cond: bool, name: str, where: str, what: str, got: Any) -> None:
    if not cond:
        raise RoutesError(f"{name}: {where}: expected {what}, got {value_words(got)}")


def _one_of(x, choices) -> bool:
    # by type as well as value: JSON's true equals 1 and 512.0 equals 512 in Python, and
    # neither is what a table means by them
    return any(type(x) is type(c) and x == c for c in choices)


def _positive_ms(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < math.inf


def _positive_int(x) -> bool:
    # below 2**63: a count a tensor can hold (and the grid's float cut points can take)
    return isinstance(x, int) and not isinstance(x, bool) and 0 < x < 2**63


def _validate(doc: Any, name: str):
    _need(isinstance(doc, dict), name, "the document", "a JSON object", type(doc).__name__)
    _need(_one_of(doc.get("schema"), (SCHEMA,)), name, "schema", SCHEMA, doc.get("schema"))
    dev = doc.get("device")
    _need(isinstance(dev, dict), name, "device", "an object", dev)
    _need(dev.get("vendor") in VENDORS.values(), name, "device.vendor", "nvidia or amd", dev.get("vendor"))
    _need(isinstance(dev.get("arch"), str) and dev["arch"], name, "device.arch", "a string like sm_90", dev.get("arch"))
    _need(_positive_int(dev.get("sm_count")), name, "device.sm_count", "a positive int", dev.get("sm_count"))
    device = DeviceClass(dev["vendor"], dev["arch"], dev["sm_count"], str(dev.get("name") or ""))
    cond = doc.get("conditions", {})
    _need(isinstance(cond, dict), name, "conditions", "an object", cond)
    _need(cond.get("triton") is None or _triton_minor(cond["triton"]) == cond["triton"], name, "conditions.triton",
          "a major.minor string like 3.6", cond.get("triton"))
    _need(_one_of(cond.get("hopper_stream"), (None, True, False)), name, "conditions.hopper_stream", "true or false",
          cond.get("hopper_stream"))
    _need(doc.get("context") == "c4", name, "context", "'c4'", doc.get("context"))
    entries = doc.get("entries")
    _need(isinstance(entries, list) and entries, name, "entries", "a non-empty list", entries)
    seen = set()
    for i, e in enumerate(entries):
        where = f"entries[{i}]"
        _need(isinstance(e, dict), name, where, "an object", e)
        _need(e.get("layout") in [x.value for x in Layout], name, f"{where}.layout", "a layout", e.get("layout"))
        _need(e.get("mode") in MODES, name, f"{where}.mode", f"one of {MODES}", e.get("mode"))
        _need(_one_of(e.get("topk"), SUPPORTED_TOPK), name, f"{where}.topk", f"one of {SUPPORTED_TOPK}", e.get("topk"))
        for axis in ("rows", "c4"):
            _need(_positive_int(e.get(axis)), name, f"{where}.{axis}", "a positive int below 2**63", e.get(axis))
        _need(e.get("ours") in OURS, name, f"{where}.ours", f"one of {OURS}", e.get("ours"))
        _need(e.get("backend") in (ENGINE, e["ours"]), name, f"{where}.backend", f"'engine' or ours ({e['ours']!r})",
              e.get("backend"))
        rec = e.get("record")
        _need(isinstance(rec, list) and rec and all(
            isinstance(r, dict) and all(isinstance(r.get(k), str) and r[k] for k in ("file", "commit", "shape")) for r in rec
        ), name, f"{where}.record", "a non-empty list of {file, commit, shape}", rec)
        key = (e["layout"], e["mode"], e["topk"], e["rows"], e["c4"])
        _need(key not in seen, name, where, "one entry per layout, mode, topk, rows and c4", key)
        seen.add(key)
    return device, dict(cond), entries


def parse_table(doc: Any, *, name: str = "records", path: Optional[str] = None, shipped: bool = False) -> Table:
    """A :class:`Table` from a parsed JSON document; :class:`RoutesError` names what is wrong."""
    return Table(doc, name=name, path=path, shipped=shipped)


def _read_capped(p: Path, path, what: str) -> str:
    """The text of a regular file of at most :data:`MAX_TABLE_BYTES`; :class:`RoutesError` naming
    ``path`` otherwise (a pipe would block the reader, a device file never end)."""
    if not p.is_file():  # (False for a missing file and a path it cannot stat too)
        raise RoutesError(f"{path}: not a regular file, not {what}")
    try:
        with p.open("rb") as f:
            data = f.read(MAX_TABLE_BYTES + 1)
        text = data.decode("utf-8")
    except (OSError, ValueError) as exc:  # ValueError: undecodable bytes
        raise RoutesError(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from None
    if len(data) > MAX_TABLE_BYTES:
        raise RoutesError(f"{path}: more than {MAX_TABLE_BYTES} bytes, not {what}")
    return text


def load_table(path, *, shipped: bool = False) -> Table:
    """Read and validate one table file; :class:`RoutesError` (a ``ValueError``) if it cannot
    be read, is not JSON or is not a valid table."""
    p = Path(path)
    text = _read_capped(p, path, "a routes table")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise RoutesError(f"{path}: not JSON ({exc})") from None
    return Table(doc, name=p.name, path=str(p), shipped=shipped)


@functools.lru_cache(maxsize=None)
def shipped_tables() -> Tuple[Table, ...]:
    """The package's own tables, loaded once per process."""
    return tuple(load_table(p, shipped=True) for p in sorted(SHIPPED_DIR.glob("*.json")))


def is_shipped_path(path) -> bool:
    """Whether ``path`` lies in the package's own routes folder (``tune`` never writes there)."""
    try:
        return Path(path).resolve().parent == SHIPPED_DIR
    except OSError:
        return False


_WARNED: set = set()


def _warn_once(warn: Callable[[str], Any], message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warn(message)


def select_table(probe, *, warn: Callable[[str], Any]) -> Tuple[Optional[Table], str]:
    """The table in force for ``probe``'s process and a note naming it, or ``(None, why)``.

    ``probe.routes_file`` (``INDEXER_TOPK_ROUTES``) comes first; a file that cannot be read, is
    not a valid table or is for another device warns once (``warn``) and the shipped tables are
    tried next. Never raises.
    """
    user = getattr(probe, "routes_file", None)
    if user:
        try:
            table = load_table(user)
            why = table.mismatch(probe)
        except Exception as exc:  # noqa: BLE001 - a bad file must never fail a call
            why = str(exc)
        else:
            if why is None:
                return table, f"{table.words()} from INDEXER_TOPK_ROUTES"
        _warn_once(warn, f"indexer-topk: INDEXER_TOPK_ROUTES={user!r} is not used: {why}; "
                         "the shipped routes or the proven rule apply")
    try:
        tables = shipped_tables()
    except RoutesError as exc:  # a broken install: say so once, route by the proven rule
        _warn_once(warn, f"indexer-topk: a shipped routes table is broken ({exc}); the proven rule applies")
        tables = ()
    here, near = device_class_of(probe), []
    for table in tables:
        why = table.mismatch(probe)
        if why is None:
            return table, table.words()
        if here is not None and table.device.key() == here.key():
            near.append(f"{table.name}: {why}")  # its device class, but not its conditions
    what = here.words() if here else "a CPU" if probe.device == "cpu" else "this GPU (architecture or SM count unknown)"
    return None, f"no routes table for {what}" + (f" ({'; '.join(near)})" if near else "")


# ---------------------------------------------------------------------------------------------
# Building a table from benchmark records
# ---------------------------------------------------------------------------------------------

RECORD_KINDS = {"prefill": ("prefill",), "decode": ("decode", "capture")}


def _shape_words(r: Mapping) -> str:
    return (f"{r['layout']} {r['kind']}: {r.get('requests', '?')} request(s) x {r.get('rows_per_request', '?')} rows "
            f"= {r['rows']} rows, {r['context_tokens']} tokens, topk {r['topk']}")


def _check_record(r: Any, i: int, source: str) -> None:
    where = f"records[{i}]"
    _need(isinstance(r, dict), source, where, "an object", r)
    _need(r.get("kind") in RECORD_KINDS, source, f"{where}.kind", "prefill or decode", r.get("kind"))
    _need(r.get("layout") in [x.value for x in Layout], source, f"{where}.layout", "a layout", r.get("layout"))
    _need(_one_of(r.get("topk"), SUPPORTED_TOPK), source, f"{where}.topk", f"one of {SUPPORTED_TOPK}", r.get("topk"))
    for k in ("rows", "context_tokens"):
        _need(_positive_int(r.get(k)) and (k != "context_tokens" or r[k] >= 4), source, f"{where}.{k}",
              "a positive int below 2**63 (context: at least 4 tokens)", r.get(k))
    cands = r.get("candidates")
    _need(isinstance(cands, dict) and all(k in OURS and _positive_ms(v) for k, v in cands.items()),
          source, f"{where}.candidates", f"{{backend: ms}} with backends from {OURS}", cands)
    ms = r.get("sglang_ms")
    _need(ms is None or _positive_ms(ms), source, f"{where}.sglang_ms", "ms or null", ms)
    cite = r.get("source")
    _need(cite is None or (isinstance(cite, dict) and all(isinstance(cite.get(k), str) and cite[k] for k in ("file", "commit"))),
          source, f"{where}.source", "{file, commit}", cite)


def table_from_records(records: Iterable[Mapping], device_class: DeviceClass, source: str, *,
                       commit: Optional[str] = None, versions: Optional[Mapping] = None,
                       conditions: Optional[Mapping] = None, engine_margin: float = ENGINE_MARGIN) -> dict:
    """A routes table (the JSON document) from serving-mix records.

    Parameters
    ----------
    records : iterable of dict
        The serving mix's records: ``kind`` (``prefill`` records feed mode ``prefill``,
        ``decode`` records, graph-replayed, feed ``decode`` and ``capture``), ``layout``,
        ``topk``, ``rows`` (total query rows), ``context_tokens`` (raw tokens per request),
        ``candidates`` (``{backend: ms}``, our exact backends only) and ``sglang_ms`` (SGLang's
        own path; ``null`` where it has none; a record without the key did not time it). A
        record may carry ``source`` ``{"file", "commit"}`` to cite instead of ``source`` and
        ``commit``.
    device_class : DeviceClass
    source, commit : str
        The records file and the commit that measured them, cited by every entry.
    versions, conditions : dict, optional
        The header's ``versions`` and ``conditions`` (see the module docstring).
    engine_margin : float
        The engine's path keeps a shape unless ours measured more than this fraction faster.

    Several records of one layout, kind, topk, rows and C4 context are merged: each backend's
    median time. Where no record at a point timed SGLang's path, the point takes the engine
    decision of the nearest point (log space) where ours and SGLang's were both timed, citing its
    records; where there is none, ``"engine"`` (the engine keeps its own path wherever it has one).
    """
    points: Dict[tuple, dict] = {}
    for i, r in enumerate(records):
        _check_record(r, i, source)
        if not r["candidates"] and "sglang_ms" not in r:
            continue
        cite = dict(r.get("source") or {"file": source, "commit": commit or "unknown"})
        cite["shape"] = _shape_words(r)
        key = (r["layout"], r["kind"], r["topk"], r["rows"], r["context_tokens"] // 4)
        p = points.setdefault(key, {"cands": {}, "engine": [], "no_engine": 0, "cites": [], "engine_cites": []})
        for name, ms in r["candidates"].items():
            p["cands"].setdefault(name, []).append(float(ms))
        if r["candidates"]:
            p["cites"].append(cite)
        if "sglang_ms" in r:
            if r["sglang_ms"] is None:
                p["no_engine"] += 1
            else:
                p["engine"].append(float(r["sglang_ms"]))
            p["engine_cites"].append(cite)

    decided: Dict[tuple, Tuple[bool, list]] = {}  # key -> (engine faster, its citations)
    for key, p in points.items():
        if not p["cands"]:
            continue
        ours_ms = min(statistics.median(v) for v in p["cands"].values())
        if p["engine"]:
            decided[key] = (not ours_ms < statistics.median(p["engine"]) * (1.0 - engine_margin), p["engine_cites"])
        elif p["no_engine"]:
            decided[key] = (False, p["engine_cites"])
    entries = []
    for key in sorted(points, key=lambda k: (k[0], k[1], k[2], k[3], k[4])):
        p = points[key]
        if not p["cands"]:
            continue  # the engine alone was timed here: nothing of ours to route
        med = {n: statistics.median(v) for n, v in p["cands"].items()}
        ours = min(med, key=lambda n: (med[n], OURS.index(n)))
        if key in decided:
            engine, engine_cites = decided[key]
        else:
            near = [k for k in decided if k[:3] == key[:3]]
            if near:
                nearest = min(near, key=lambda k: (_log_distance(k[3:], key[3:]), k))
                engine, engine_cites = decided[nearest]
            else:
                engine, engine_cites = True, []
        cites = []
        for c in p["cites"] + engine_cites:
            if c not in cites:
                cites.append(c)
        for mode in RECORD_KINDS[key[1]]:
            entries.append({"layout": key[0], "mode": mode, "topk": key[2], "rows": key[3], "c4": key[4],
                            "backend": ENGINE if engine else ours, "ours": ours, "record": cites})
    entries.sort(key=lambda e: (e["layout"], MODES.index(e["mode"]), e["topk"], e["rows"], e["c4"]))
    doc = {
        "schema": SCHEMA,
        "device": device_class.to_json(),
        "conditions": dict(conditions or {}),
        "source": source,
        "commit": commit or "unknown",
        "versions": dict(versions or {}),
        "context": "c4",
        "engine_margin": engine_margin,
        "entries": entries,
    }
    Table(doc, name="records")  # validate what was built
    return doc


def device_from_env(env: Mapping) -> Tuple[DeviceClass, dict]:
    """The device class and conditions of a records file's ``env`` header (``arch``,
    ``sm_count``, ``gpu``, ``triton``; ``hopper_stream`` where recorded, else on for sm_90,
    where the stream serves by default)."""
    arch = env.get("arch")
    vendor = "nvidia" if str(arch).startswith("sm_") else "amd" if str(arch).startswith("gfx") else None
    if vendor is None or not _positive_int(env.get("sm_count")):
        raise RoutesError(f"records env: expected arch (sm_XX or gfxNNN) and sm_count, got {arch!r}, {env.get('sm_count')!r}")
    cond = {}
    if _triton_minor(env.get("triton")):
        cond["triton"] = _triton_minor(env.get("triton"))
    if vendor == "nvidia":
        cond["hopper_stream"] = bool(env.get("hopper_stream", arch == "sm_90"))
    return DeviceClass(vendor, arch, env["sm_count"], str(env.get("gpu") or "")), cond


def table_from_file(path, *, source: Optional[str] = None) -> dict:
    """The routes table of one serving-mix records file ``{"env": {...}, "records": [...]}``."""
    p = Path(path)
    text = _read_capped(p, path, "a records file")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise RoutesError(f"{path}: cannot be read as JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("env"), dict) or not isinstance(doc.get("records"), list):
        raise RoutesError(f"{path}: expected {{'env': {{...}}, 'records': [...]}}")
    env = doc["env"]
    device, cond = device_from_env(env)
    versions = {k: env[k] for k in ("torch", "triton") if env.get(k)}
    return table_from_records(doc["records"], device, source or str(path), commit=env.get("commit"),
                              versions=versions, conditions=cond)


def dumps_table(doc: Mapping) -> str:
    """A table as JSON text: the header indented, one entry per line (a diff shows the entry)."""
    head = {k: v for k, v in doc.items() if k != "entries"}
    text = json.dumps(head, indent=1)[:-2]
    rows = ",\n".join("  " + json.dumps(e) for e in doc.get("entries", []))
    return f'{text},\n "entries": [\n{rows}\n ]\n}}\n'


def write_table(doc: Mapping, path, *, force: bool = False) -> Path:
    """Validate ``doc`` and write it to ``path`` atomically (a temporary file in the same folder,
    then a rename), so an interrupted write leaves the old file or none. Refuses an existing
    file unless ``force``."""
    Table(dict(doc), name=str(path))
    return write_atomic(dumps_table(doc), path, force=force)


def write_atomic(text: str, path, *, force: bool = False) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename; refuses an existing file
    unless ``force``."""
    p = Path(path)
    if p.exists() and not force:
        raise FileExistsError(f"{p} exists; pass force=True (--force) to replace it")
    return write_atomically(p, lambda f: f.write(text))


__all__ = [
    "ENGINE", "ENGINE_MARGIN", "MODES", "OURS", "SCHEMA", "DeviceClass", "RoutesError", "Table",
    "device_class_of", "device_from_env", "dumps_table", "is_shipped_path", "load_table", "parse_table", "select_table",
    "shipped_tables", "table_from_file", "table_from_records", "write_atomic", "write_table",
]
