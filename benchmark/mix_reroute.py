#!/usr/bin/env python3
"""Finish a serving-mix run that its device time cut short, without timing anything again.

    python benchmark/mix_reroute.py RECORDS.json [--add MORE.json ...] [--earlier OLD.json] --out OUT.json

``RECORDS.json``: a serving-mix file (``benchmark/serving_mix.py``); ``--add``: files of the same
commit with shapes it lacks (a second invocation in the same device session, say), taken in
order, a shape's first record kept; ``--earlier``: a committed serving-mix file of an earlier
commit, whose records of the shapes still missing are taken as they are, each citing that file and
commit (``source``: the routes table cites them, :func:`indexer_topk.bench.mix.summarize` leaves
them out of this run's ratios, the rendered table names their commit). Then, as ``serving_mix.py --retune`` would, the routes table
of these records is built (``OUT`` with ``_routes.json`` for ``.json``) and every record whose
shape that table routes otherwise takes the time of the routed candidate, measured in the same
run on the same bytes and bitwise equal to legacy: ``route_before`` keeps the earlier route,
``ours_from`` says where the time came from. A rerouted prefill record's host fields belonged to
the earlier route, so they move to ``host_before`` (a replayed call's host time differs little
between our backends, but it was not measured for the new one). ``env.assembled`` lists what was
done. Render the result with ``serving_mix.py --render OUT.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from indexer_topk import routes  # noqa: E402
from indexer_topk.bench.mix import MixShape, shape_c4, summarize  # noqa: E402
from indexer_topk.files import relative_name  # noqa: E402
from indexer_topk.routes import write_atomic  # noqa: E402

HOST_FIELDS = ("host_us", "host_us_api", "host_us_first", "host_us_checked")


def merge(doc: dict, extra: list) -> list:
    """The records of ``doc`` then, from each extra document of the same commit, the shapes not yet
    seen; returns what was taken from where."""
    seen = {MixShape.from_record(r) for r in doc["records"]}
    notes = []
    for path, other in extra:
        if other["env"].get("commit") != doc["env"].get("commit"):
            raise SystemExit(f"{path}: commit {other['env'].get('commit')}, not {doc['env'].get('commit')}")
        taken = [r for r in other["records"] if MixShape.from_record(r) not in seen]
        seen.update(MixShape.from_record(r) for r in taken)
        doc["records"].extend(taken)
        notes.append(f"{len(taken)} records from {Path(path).name} ({other['env'].get('timestamp')})")
    return notes


def take_earlier(doc: dict, path, earlier: dict) -> list:
    """The records of ``earlier`` (an earlier commit's serving mix, at ``path``) whose shapes ``doc``
    lacks, appended to ``doc`` with ``source`` citing that file and commit; returns a note."""
    commit = earlier["env"].get("commit")
    if not commit or commit == doc["env"].get("commit"):
        raise SystemExit(f"{path}: commit {commit}: --earlier takes another commit's run (--add takes this one's)")
    if earlier["env"].get("gpu") != doc["env"].get("gpu"):  # a routes table is one device's
        raise SystemExit(f"{path}: measured on {earlier['env'].get('gpu')}, not {doc['env'].get('gpu')}")
    seen = {MixShape.from_record(r) for r in doc["records"]}
    cite = {"file": relative_name(path, REPO), "commit": commit}
    # a record that already cites another run keeps it; a failed one is no measurement to take
    taken = [dict(r, source=r.get("source") or cite) for r in earlier["records"]
             if MixShape.from_record(r) not in seen and not r.get("error")]
    doc["records"].extend(taken)
    labels = ", ".join(MixShape.from_record(r).label for r in taken) or "none"
    return [f"{len(taken)} records of shapes this run did not reach from {cite['file']} (commit {commit}): {labels}"]


def routed(table, shape: MixShape):
    """The backend ``table`` gives ``shape`` (``None``: no entry), looked up as the policy of the
    GPU that ran it does (:func:`indexer_topk.bench.mix.shape_route`; a decode step as captured),
    without asking this machine's device."""
    mode = "capture" if shape.kind == "decode" else "prefill"
    cell = table.lookup(shape.layout, mode, shape.topk, shape.rows, shape_c4(shape))
    return None if cell is None else cell[1]


def reroute(records: list, table) -> list:
    """Route each record as ``table`` does; returns notes."""
    notes = []
    for rec in records:
        if rec.get("error") or rec.get("ours_ms") is None:
            continue
        shape = MixShape.from_record(rec)
        route = routed(table, shape)
        if route is None or route == rec.get("route"):
            continue
        if route not in rec.get("candidates", {}):
            notes.append(f"{shape.label}: table routes to {route}, "
                         "which was not timed bitwise equal here; kept")
            continue
        rec["route_before"], rec["route"] = rec.get("route"), route
        rec["ours_ms"], rec["ours_from"] = rec["candidates"][route], f"candidates.{route}"
        if rec["kind"] == "prefill":
            rec["host_before"] = {k: rec.get(k) for k in HOST_FIELDS}
            for k in HOST_FIELDS:
                rec[k] = None
        notes.append(f"{shape.label}: {rec['route_before']} -> {route}")
    return notes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("records")
    p.add_argument("--add", action="append", default=[], metavar="JSON")
    p.add_argument("--out", required=True)
    p.add_argument("--earlier", default=None, metavar="JSON",
                   help="an earlier commit's serving-mix file: the shapes still missing, cited as its")
    p.add_argument("--cite", default=None, help="the records file the table cites (default: the output's name)")
    a = p.parse_args(argv)
    doc = json.loads(Path(a.records).read_text())
    notes = merge(doc, [(x, json.loads(Path(x).read_text())) for x in a.add])
    if a.earlier:
        notes += take_earlier(doc, a.earlier, json.loads(Path(a.earlier).read_text()))
    out = Path(a.out)
    write_atomic(json.dumps(doc, indent=1, default=str) + "\n", out, force=True)
    table = routes.table_from_file(out, source=a.cite or out.name)
    table_path = out.with_name(out.stem + "_routes.json")
    routes.write_table(table, table_path, force=True)
    notes += reroute(doc["records"], routes.parse_table(table, name=table_path.name))
    doc["env"]["routes"] = f"{table_path.name} (built from this run's candidates)"
    doc["env"]["assembled"] = notes
    doc["summary"] = summarize(doc["records"])
    write_atomic(json.dumps(doc, indent=1, default=str) + "\n", out, force=True)
    print("\n".join(notes))
    print(f"wrote {out} and {table_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
