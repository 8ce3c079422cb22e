"""Run one C4 indexer call in a fresh process the way a deployment would load the plugin.

    python -m sglang_doubles.run_scene SGLANG_SRC [SGLANG_SRC ...] --layout sglang_fp8

Nothing is injected into the plugin or the policy: SGLang's ``load_plugins()`` discovers the
installed package's ``sglang.srt.plugins`` entry point, the real ``default_policy()`` reads
the environment. The call runs hooked and then on SGLang's unhooked method; one JSON line on
stdout reports whether our operator served it and whether the two selections agree. Logs go
to stderr at INFO, as a server's would.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from pathlib import Path

import indexer_topk.api as api

from .environment import open_sglang
from .scene import SceneSpec, build_scene, same_selection


class Served:
    """Counts our operator's calls by backend (the plugin calls ``api.indexer_topk``)."""

    def __init__(self):
        self.count = Counter()
        real = api.indexer_topk

        def counted(*a, **k):
            self.count[k.get("backend")] += 1
            return real(*a, **k)

        api.indexer_topk = counted

    def take(self) -> dict:
        """The counts since the last take, by backend."""
        out = dict(self.count)
        self.count.clear()
        return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--layout", default="sglang_fp8")
    parser.add_argument("--mode", default="EXTEND")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    sg = open_sglang(args.paths)
    served = Served()
    sg.plugins.load_plugins()
    scene = build_scene(sg, SceneSpec(layout=args.layout, contexts=(2100, 300), extend=(2, 2), mode=args.mode))
    hooked, _ = scene.forward()
    logits_calls = sg.calls.logits_calls()
    original, _ = scene.forward(original=True)
    print(json.dumps({
        "operator_calls": served.take(),
        "logits_calls_hooked": logits_calls,
        "same_selection": same_selection(hooked, original),
        "hooked": hasattr(type(scene.backend).forward_c4_indexer, "__wrapped__"),
    }))
    sg.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
