"""Host time of a call the SGLang plugin hands back to SGLang (the routes table says "engine").

    PYTHONPATH=python:test python benchmark/research/plugin_decline.py [--calls 2000]

On SGLang 0.5.23's own classes (``test/sglang_doubles``, the release fetched by
``test/sglang_fetch.py``) with the H200 policy, times the plugin's AROUND hook on a prefill call
whose original is a stand-in that does nothing: what the plugin adds to each call it declines.
Prints the mean per call and the hook's profile (cProfile, cumulative time).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import time

import sglang_fetch
from sglang_doubles.environment import open_sglang
from sglang_doubles.policy import H200
from sglang_doubles.scene import SceneSpec, build_scene

from indexer_topk import policy as policy_module
from indexer_topk import sglang_plugin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    policy = policy_module.PathPolicy(H200)
    policy_module.default_policy = lambda: policy
    sg = open_sglang(sglang_fetch.fetch_sglang_source())
    sg.plugins.load_plugins()
    scene = build_scene(sg, SceneSpec(layout="sglang_fp8", contexts=(2100, 300), extend=(2, 2)))
    original = type(scene.backend).forward_c4_indexer.__wrapped__
    handed_back = []
    stand_in = functools.wraps(original)(lambda *a, **k: handed_back.append(1))
    kwargs = dict(x=scene.x, q_lora=scene.q_lora, c4_indexer=scene.c4_indexer, forward_batch=scene.forward_batch)
    hook = sglang_plugin._forward_c4_indexer_hook
    for _ in range(100):
        hook(stand_in, scene.backend, **kwargs)
    start = time.perf_counter()
    for _ in range(args.calls):
        hook(stand_in, scene.backend, **kwargs)
    per_call = (time.perf_counter() - start) / args.calls
    assert len(handed_back) == args.calls + 100, "the hook served a call it should hand back"
    print(f"plugin decline: {per_call * 1e6:.1f} us a call (mean of {args.calls})")
    profile = cProfile.Profile()
    profile.runcall(lambda: [hook(stand_in, scene.backend, **kwargs) for _ in range(args.calls)])
    pstats.Stats(profile).sort_stats("cumtime").print_stats(12)
    sg.close()


if __name__ == "__main__":
    main()
