"""Routes tables: the shipped one, lookups, validation, loading, building from records, writing."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

from indexer_topk import routes
from indexer_topk.policy import PathPolicy, Probe, probe_environment
from indexer_topk.routes import RoutesError
from indexer_topk.routes.modes import call_mode

REPO = Path(__file__).resolve().parents[1]
H200 = Probe(device="cuda", device_name="NVIDIA H200", compute_capability=(9, 0), triton_version="3.6.0",
             sm_count=132, hopper_stream=True)
CITE = [{"file": "mix.json", "commit": "abc1234", "shape": "a shape"}]


def entry(**kw):
    e = {"layout": "sglang_fp8", "mode": "prefill", "topk": 1024, "rows": 128, "c4": 16384, "backend": "fused",
         "ours": "fused", "record": CITE}
    e.update(kw)
    return e


def doc(*entries, **kw):
    d = {"schema": 1, "device": {"vendor": "nvidia", "arch": "sm_90", "sm_count": 132, "name": "NVIDIA H200"},
         "conditions": {"triton": "3.6", "hopper_stream": True}, "context": "c4", "entries": list(entries)}
    d.update(kw)
    return d


def policy(probe=H200):
    return PathPolicy(probe, logger=logging.getLogger("indexer_topk.test"))


# ---------------------------------------------------------------------------------------------
# The shipped table
# ---------------------------------------------------------------------------------------------

def _builder():
    spec = importlib.util.spec_from_file_location("routes_from_records", REPO / "benchmark" / "routes_from_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MIX = "benchmark/results/serving_mix_nvidia-h200.json"


def test_shipped_table_is_what_the_committed_serving_mix_gives():
    """The shipped H200 table is rebuilt, entry for entry, from the committed serving mix
    (``benchmark/routes_from_records.py --mix``), and ships in the package."""
    [table] = routes.shipped_tables()
    assert table.name == "nvidia-h200.json" and table.shipped
    built = routes.table_from_file(REPO / MIX, source=MIX)
    assert {k: table.doc[k] for k in ("device", "conditions", "context", "entries", "commit")} == {
        k: built[k] for k in ("device", "conditions", "context", "entries", "commit")}
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"indexer_topk.routes" = ["*.json"]' in pyproject


def test_shipped_table_cites_committed_files_and_commits():
    [table] = routes.shipped_tables()
    cited = {(r["file"], r["commit"]) for e in table.entries for r in e["record"]}
    # the serving mix, and for the shapes its session did not reach, the earlier run it cites
    assert {file for file, _ in cited} == {MIX, "benchmark/results/serving_mix/cfb45cb/serving_mix_run1.json"}
    for file, commit in cited:
        assert (REPO / file).is_file(), file
        proc = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True)
        assert proc.returncode == 0, commit


@pytest.mark.parametrize("layout, mode, rows, c4, want", [
    # measured points of the serving mix (SGLang's path faster at every FP8 shape there)
    ("sglang_fp8", "prefill", 1024, 196608, ("engine", "fused")),
    ("sglang_fp8", "prefill", 128, 16384, ("engine", "legacy")),
    ("sglang_fp8", "prefill", 8192, 4096, ("engine", "legacy")),
    ("sglang_fp8", "prefill", 8192, 196608, ("engine", "fused")),
    ("sglang_fp8", "prefill", 8, 196608, None),  # below the measured rows: the proven rule
    ("sglang_mxfp4", "prefill", 1024, 196608, ("fused", "fused")),  # SGLang has no FP4 path below SM100
    ("aiter_mxfp4", "prefill", 1024, 16384, ("legacy", "legacy")),
    # decode: legacy's split select where the mix measured it faster than the fused stream
    ("sglang_fp8", "decode", 1, 196608, ("engine", "legacy")),
    ("sglang_fp8", "decode", 8, 196608, ("engine", "legacy")),
    ("sglang_fp8", "capture", 256, 8192, ("engine", "legacy")),
    ("sglang_fp8", "decode", 32, 196608, ("engine", "legacy")),  # the trimmed split select, its finish shared by parts
    ("sglang_fp8", "capture", 256, 32768, ("engine", "fused")),
    ("sglang_mxfp4", "decode", 8, 196608, ("legacy", "legacy")),
    ("sglang_mxfp4", "decode", 64, 196608, ("fused", "fused")),
])
def test_shipped_table_routes(layout, mode, rows, c4, want):
    [table] = routes.shipped_tables()
    assert table.lookup(layout, mode, 1024, rows, c4) == want


def test_shipped_table_applies_to_its_device_class_only():
    [table] = routes.shipped_tables()
    assert table.mismatch(H200) is None
    for other, words in [
        (dataclasses.replace(H200, sm_count=114), "114 SMs"),  # an H100 PCIe
        (dataclasses.replace(H200, compute_capability=(10, 0)), "sm_100"),
        (dataclasses.replace(H200, triton_version="3.9.0"), "Triton 3.9.0"),
        (dataclasses.replace(H200, hopper_stream=False), "Hopper stream on, here it is off"),
        (Probe(device="cpu", triton_version="3.6.0", triton_interpret=True), "no GPU"),
        (Probe(device="hip", device_name="AMD Instinct MI355X", gfx_arch="gfx950", sm_count=256), "gfx950"),
    ]:
        why = table.mismatch(other)
        assert why is not None and words in why, why


# ---------------------------------------------------------------------------------------------
# Lookup
# ---------------------------------------------------------------------------------------------

GRID = doc(
    entry(rows=8, c4=1024, backend="legacy", ours="legacy"),
    entry(rows=128, c4=1024, backend="fused", ours="fused"),
    entry(rows=8, c4=65536, backend="engine", ours="legacy"),
    # (128, 65536) is not measured: in log space it is ln(16) from (8, 65536), ln(64) from (128, 1024)
    entry(rows=1024, c4=1024, backend="engine", ours="fused"),
    entry(mode="decode", rows=8, c4=1024, backend="fused", ours="fused"),
    entry(mode="decode", rows=64, c4=1024, backend="legacy", ours="legacy"),
)


@pytest.mark.parametrize("mode, rows, c4, want", [
    ("prefill", 8, 1024, ("legacy", "legacy")),
    ("prefill", 31, 1024, ("legacy", "legacy")),  # below the geometric mean of 8 and 128 (32)
    ("prefill", 32, 1024, ("fused", "fused")),  # at it: the larger bucket
    ("prefill", 128, 8191, ("fused", "fused")),  # nearest context: 1024 (the mean is 8192)
    ("prefill", 128, 65536, ("engine", "legacy")),  # an unmeasured cell: the nearest measured point
    ("prefill", 7, 1024, None),  # below the smallest rows: no entry (the proven rule)
    ("prefill", 8, 1023, None),  # below the smallest context
    ("prefill", 10**6, 10**9, ("engine", "fused")),  # prefill beyond the largest: the largest bucket
    ("prefill", None, None, ("engine", "fused")),  # unknown sizes count as the largest
    ("prefill", 8, None, ("engine", "legacy")),
    ("decode", 8, 1024, ("fused", "fused")),
    ("decode", 22, 1024, ("fused", "fused")),  # geometric mean of 8 and 64 is 22.6
    ("decode", 23, 1024, ("legacy", "legacy")),
    ("decode", 65, 1024, None),  # decode beyond the measured rows: the proven rule
    ("decode", 8, 2048, None),
    ("decode", 8, None, None),  # an unknown length: the proven rule
    ("capture", 8, 1024, None),  # no capture entries
])
def test_lookup_nearest_bucket_in_log_space(mode, rows, c4, want):
    table = routes.parse_table(GRID)
    assert table.lookup("sglang_fp8", mode, 1024, rows, c4) == want


def test_lookup_by_topk_and_layout():
    table = routes.parse_table(doc(entry(topk=1024, rows=8, c4=64, backend="legacy", ours="legacy"),
                                   entry(topk=2048, rows=8, c4=64, backend="fused", ours="fused")))
    from indexer_topk import Layout

    assert table.lookup(Layout.SGLANG_FP8, "prefill", 1024, 8, 64) == ("legacy", "legacy")
    assert table.lookup("sglang_fp8", "prefill", 512, 8, 64) == ("legacy", "legacy")  # nearest measured topk
    assert table.lookup("sglang_fp8", "prefill", 2048, 8, 64) == ("fused", "fused")
    assert table.lookup("sglang_fp8", "prefill", None, 8, 64) == ("fused", "fused")  # unknown: the largest
    assert table.lookup("sglang_fp8", "prefill", 256, 8, 64) is None  # not a topk the contract takes
    assert table.lookup("sglang_mxfp4", "prefill", 1024, 8, 64) is None  # a layout it has no entry for
    assert table.lookup(None, "prefill", 1024, 8, 64) is None


def test_call_mode():
    assert call_mode(False, False, None) == "prefill"
    assert call_mode(True, False, None) == "decode"
    assert call_mode(False, False, "idle") == "decode"
    assert call_mode(True, True, None) == "capture"
    assert call_mode(False, False, "extend") == "prefill"


# ---------------------------------------------------------------------------------------------
# Validation and loading: a bad table names what is wrong
# ---------------------------------------------------------------------------------------------

BAD = [
    ("[]", "the document"),
    (dict(schema=2), "schema"),
    (dict(device={"vendor": "intel", "arch": "x", "sm_count": 1}), "device.vendor"),
    (dict(device={"vendor": "nvidia", "arch": "", "sm_count": 1}), "device.arch"),
    (dict(device={"vendor": "nvidia", "arch": "sm_90", "sm_count": True}), "device.sm_count"),
    (dict(device={"vendor": "nvidia", "arch": "sm_90", "sm_count": 0}), "device.sm_count"),
    (dict(conditions={"triton": "3.6.0"}), "conditions.triton"),
    (dict(conditions={"hopper_stream": "yes"}), "conditions.hopper_stream"),
    (dict(context="tokens"), "context"),
    (dict(entries=[]), "entries"),
    (dict(entries=[entry(layout="bf16")]), "entries[0].layout"),
    (dict(entries=[entry(mode="verify")]), "entries[0].mode"),
    (dict(entries=[entry(topk=256)]), "entries[0].topk"),
    (dict(entries=[entry(rows=-1)]), "entries[0].rows"),
    (dict(entries=[entry(rows=1.5)]), "entries[0].rows"),
    (dict(entries=[entry(c4=True)]), "entries[0].c4"),
    (dict(entries=[entry(ours="reference")]), "entries[0].ours"),
    (dict(entries=[entry(ours="legacy", backend="fused")]), "entries[0].backend"),
    (dict(entries=[entry(record=[])]), "entries[0].record"),
    (dict(entries=[entry(record=[{"file": "x", "commit": ""}])]), "entries[0].record"),
    (dict(entries=[entry(), entry()]), "entries[1]"),
    # equal in Python to what the table means, not the same JSON value
    (dict(schema=True), "schema"),
    (dict(schema=1.0), "schema"),
    (dict(conditions={"hopper_stream": 1}), "conditions.hopper_stream"),
    (dict(entries=[entry(topk=512.0)]), "entries[0].topk"),
]


@pytest.mark.parametrize("change, field", BAD, ids=[f for _, f in BAD])
def test_invalid_table_names_the_field(change, field):
    bad = json.loads(change) if isinstance(change, str) else doc(entry(), **change)
    with pytest.raises(RoutesError, match=field.replace("[", r"\[").replace("]", r"\]")):
        routes.parse_table(bad)


@pytest.mark.parametrize("content", [None, b"\xff\xfe garbage", b"{not json", b""])
def test_unreadable_file_is_a_routes_error(tmp_path, content):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(RoutesError, match="t.json"):
        routes.load_table(path)
    with pytest.raises(RoutesError):
        routes.load_table(tmp_path)  # a directory
    with pytest.raises(RoutesError):
        routes.load_table("bad\x00name.json")



def test_a_file_too_large_for_a_table_is_refused_unread(tmp_path, monkeypatch):
    """An endless file (``/dev/zero`` where it exists) or one past the cap is refused after
    reading at most the cap: it is not read until memory runs out."""
    monkeypatch.setattr(routes, "MAX_TABLE_BYTES", 64)
    big = tmp_path / "big.json"
    big.write_text(json.dumps(doc(entry())))
    with pytest.raises(RoutesError, match="more than 64 bytes"):
        routes.load_table(big)
    if os.path.exists("/dev/zero"):  # endless: refused as no regular file, before a read
        with pytest.raises(RoutesError, match="not a regular file"):
            routes.load_table("/dev/zero")
    with pytest.raises(RoutesError, match="more than 64 bytes"):
        routes.table_from_file(big)


@pytest.mark.parametrize("axis", ["rows", "c4"])
def test_entries_past_int64_are_refused_by_name(axis):
    """A row count or context no tensor can hold is a field error, not an overflow in the
    grid's cut points; a huge value is named by its size."""
    for value, shown in ((2**63, "9223372036854775808"), (10**400, "an int of 1329 bits")):
        with pytest.raises(RoutesError, match=rf"entries\[0\]\.{axis}: expected a positive int below 2\*\*63, got {shown}"):
            routes.parse_table(doc(entry(**{axis: value})))
    assert routes.parse_table(doc(entry(**{axis: 2**63 - 1})))

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_pipe_is_refused_without_blocking(tmp_path):
    """A named pipe with no writer would block the reader (the policy's build, under its lock)."""
    fifo = tmp_path / "table.json"
    os.mkfifo(fifo)
    with pytest.raises(RoutesError, match="not a regular file"):
        routes.load_table(fifo)
    with pytest.raises(RoutesError, match="not a regular file"):
        routes.table_from_file(fifo)

# ---------------------------------------------------------------------------------------------
# INDEXER_TOPK_ROUTES: the policy uses the file, or warns once and falls back
# ---------------------------------------------------------------------------------------------

def test_routes_file_is_used(tmp_path):
    path = routes.write_table(doc(entry(rows=1, c4=64, backend="fused", ours="fused")), tmp_path / "mine.json")
    p = policy(dataclasses.replace(H200, routes_file=str(path)))
    assert p.table is not None and p.table.path == str(path) and "INDEXER_TOPK_ROUTES" in p.table_note
    assert p.route(layout="sglang_fp8", topk=1024, rows=8, c4_len=64, capturing=False) == "fused"
    assert probe_environment({"INDEXER_TOPK_ROUTES": str(path)}).routes_file == str(path)
    assert probe_environment({"INDEXER_TOPK_ROUTES": ""}).routes_file is None


@pytest.mark.parametrize("make", ["missing", "garbage", "invalid", "other_device", "directory"])
def test_bad_routes_file_warns_once_and_falls_back(tmp_path, caplog, make):
    path = tmp_path / f"{make}.json"
    if make == "garbage":
        path.write_bytes(b"\x00\x01 not json")
    elif make == "invalid":
        path.write_text(json.dumps(doc(entry(topk=7))))
    elif make == "other_device":
        routes.write_table(doc(entry(), device={"vendor": "amd", "arch": "gfx950", "sm_count": 256}), path)
    elif make == "directory":
        path.mkdir()
    probe = dataclasses.replace(H200, routes_file=str(path))
    with caplog.at_level(logging.WARNING, logger="indexer_topk.test"):
        first, second = policy(probe), policy(probe)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(path) in warnings[0].getMessage()
    for p in (first, second):  # the shipped table, as without the file
        assert p.table is not None and p.table.shipped
        assert p.route(layout="sglang_fp8", topk=1024, rows=1024, c4_len=196672, capturing=False) == "fused"
    cpu = policy(Probe(device="cpu", triton_version="3.9.0", triton_interpret=True, routes_file=str(path)))
    assert cpu.table is None and cpu.route(layout="sglang_fp8", capturing=False) == "fused"  # the proven rule


# ---------------------------------------------------------------------------------------------
# Building a table from serving-mix records
# ---------------------------------------------------------------------------------------------

def record(kind="prefill", rows=128, tokens=65536, candidates=None, **kw):
    r = {"kind": kind, "layout": "sglang_fp8", "topk": 1024, "requests": 1, "rows_per_request": rows, "rows": rows,
         "context_tokens": tokens, "timing": "eager" if kind == "prefill" else "graph",
         "candidates": {"fused": 1.0, "legacy": 2.0} if candidates is None else candidates}
    r.update(kw)
    return r


DEVICE = routes.DeviceClass("nvidia", "sm_90", 132, "NVIDIA H200")


def build(*records, **kw):
    d = routes.table_from_records(records, DEVICE, "mix.json", commit="abc1234", **kw)
    return {(e["layout"], e["mode"], e["rows"], e["c4"]): (e["backend"], e["ours"]) for e in d["entries"]}, d


def test_records_to_entries():
    got, d = build(
        record(rows=128, sglang_ms=0.5),  # SGLang faster
        record(rows=256, sglang_ms=1.04),  # ours 1.0 is not 5% faster: the engine keeps it
        record(rows=512, sglang_ms=1.06),  # ours more than 5% faster
        record(rows=1024, sglang_ms=None),  # SGLang has no path: ours
        record(rows=8, candidates={"legacy": 0.3, "fused": 0.6}),  # not timed: the nearest timed point's decision
        record(kind="decode", rows=64, tokens=131072),  # no point of its kind timed SGLang: "engine"
    )
    assert got == {
        ("sglang_fp8", "prefill", 128, 16384): ("engine", "fused"),
        ("sglang_fp8", "prefill", 256, 16384): ("engine", "fused"),
        ("sglang_fp8", "prefill", 512, 16384): ("fused", "fused"),
        ("sglang_fp8", "prefill", 1024, 16384): ("fused", "fused"),
        ("sglang_fp8", "prefill", 8, 16384): ("engine", "legacy"),
        ("sglang_fp8", "decode", 64, 32768): ("engine", "fused"),
        ("sglang_fp8", "capture", 64, 32768): ("engine", "fused"),
    }
    by_rows = {e["rows"]: e for e in d["entries"] if e["mode"] == "prefill"}
    assert {r["shape"] for r in by_rows[8]["record"]} >= {routes._shape_words(record(rows=8)),
                                                         routes._shape_words(record(rows=128))}
    assert all(r["file"] == "mix.json" and r["commit"] == "abc1234" for e in d["entries"] for r in e["record"])
    routes.parse_table(d)


def test_records_at_one_point_merge_by_median():
    got, _ = build(record(candidates={"fused": 1.0, "legacy": 0.9}), record(candidates={"fused": 1.0, "legacy": 1.2}),
                   record(candidates={"fused": 1.0, "legacy": 1.3}), record(candidates={}, sglang_ms=None))
    assert got[("sglang_fp8", "prefill", 128, 16384)] == ("fused", "fused")


@pytest.mark.parametrize("bad, field", [
    (record(kind="verify"), "kind"), (record(layout="bf16"), "layout"), (record(topk=7), "topk"),
    (record(rows=0), "rows"), (record(tokens=2), "context_tokens"), (record(candidates={"sglang": 1.0}), "candidates"),
    (record(candidates={"fused": -1.0}), "candidates"), (record(sglang_ms="fast"), "sglang_ms"), ("x", "records"),
    (record(sglang_ms=float("nan")), "sglang_ms"), (record(candidates={"fused": float("nan")}), "candidates"),
    (record(source="mix.json"), "source"), (record(source={"file": "mix.json"}), "source"),
    (record(topk=1024.0), "topk"), (record(candidates={"fused": True}), "candidates"),
    (record(candidates={"fused": float("inf")}), "candidates"), (record(sglang_ms=True), "sglang_ms"),
])
def test_bad_record_names_the_field(bad, field):
    with pytest.raises(RoutesError, match=field):
        build(bad)


def test_table_from_file(tmp_path):
    env = {"device": "cuda:0", "gpu": "NVIDIA H200", "sm_count": 132, "arch": "sm_90", "torch": "2.11", "triton": "3.6.0",
           "commit": "abc1234"}
    path = tmp_path / "mix.json"
    path.write_text(json.dumps({"env": env, "records": [record(sglang_ms=None)]}))
    d = routes.table_from_file(path)
    assert d["device"] == DEVICE.to_json() and d["conditions"] == {"triton": "3.6", "hopper_stream": True}
    assert d["commit"] == "abc1234" and d["versions"] == {"torch": "2.11", "triton": "3.6.0"}
    assert routes.parse_table(d).mismatch(H200) is None
    path.write_text(json.dumps({"env": {**env, "arch": None}, "records": []}))
    with pytest.raises(RoutesError, match="arch"):
        routes.table_from_file(path)
    path.write_text("[1, 2]")
    with pytest.raises(RoutesError, match="env"):
        routes.table_from_file(path)


def test_builder_script_writes_from_a_mix_file(tmp_path):
    env = {"gpu": "NVIDIA H200", "sm_count": 132, "arch": "sm_90", "triton": "3.6.0", "commit": "abc1234"}
    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps({"env": env, "records": [record(sglang_ms=0.1)]}))
    out = tmp_path / "table.json"
    assert _builder().main(["--mix", str(mix), "--out", str(out)]) == 0
    assert routes.load_table(out).lookup("sglang_fp8", "prefill", 1024, 128, 16384) == ("engine", "fused")
    assert _builder().main(["--mix", str(mix), "--out", str(out), "--check"]) == 0


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------

def test_write_is_validated_atomic_and_refuses_to_overwrite(tmp_path):
    path = tmp_path / "sub" / "t.json"
    d = doc(entry())
    routes.write_table(d, path)
    assert routes.load_table(path).entries == d["entries"]
    assert [p.name for p in path.parent.iterdir()] == ["t.json"]  # no temporary left behind
    with pytest.raises(FileExistsError):
        routes.write_table(d, path)
    routes.write_table(doc(entry(rows=7)), path, force=True)
    assert routes.load_table(path).entries[0]["rows"] == 7
    with pytest.raises(RoutesError):
        routes.write_table(doc(entry(topk=3)), path, force=True)
    assert routes.load_table(path).entries[0]["rows"] == 7  # an invalid table never replaces a good one
    assert [p.name for p in path.parent.iterdir()] == ["t.json"]


def test_shipped_folder_is_recognised():
    assert routes.is_shipped_path(routes.SHIPPED_DIR / "nvidia-h200.json")
    assert routes.is_shipped_path(routes.SHIPPED_DIR / "new.json")
    assert not routes.is_shipped_path(REPO / "nvidia-h200.json")
