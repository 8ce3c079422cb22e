"""The SGLang plugin, tested on SGLang's released source.

The test downloads the SGLang wheel (``pip download sglang==0.5.23 --no-deps``), unpacks it
into ``.sglang-src/`` (reused across runs) and imports SGLang's DSv4 indexer from it, with
import-only stubs for absent dependencies and reference-backed doubles of the GPU kernels
(see ``sglang_doubles``). The plugin is loaded by SGLang's own ``load_plugins()`` through the
package's ``sglang.srt.plugins`` entry point, and SGLang's own ``forward_c4_indexer`` runs
each call: once hooked, once as SGLang's unhooked method. Routing uses the real path policy
(built from an H200 or gfx950 probe); the backend it names is served by the exact
``"reference"`` backend, so the outcome does not depend on the Triton kernels; the
subprocess tests use the real ``default_policy()`` unmodified, and the enabled one runs our
Triton fused kernel under the interpreter.

Skipped only when the wheel cannot be downloaded.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import indexer_topk.api as api
import indexer_topk.policy as policy_module
from indexer_topk import sglang_plugin
from indexer_topk.policy import Probe

import sglang_fetch
from sglang_doubles import (
    H200,
    H200_FUSED,
    MI355X_AITER,
    CountingPolicy,
    SceneSpec,
    build_scene,
    open_sglang,
    rows_differing,
    same_selection,
)

# SGLang's import chain warns about CPU-only quantisation backends and its own deprecations.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

TEST_DIR = Path(__file__).resolve().parent
REPO = TEST_DIR.parent
# The probes under which our operator serves each layout's prefill at the scenes' small shapes,
# and the backend it names: AITER's kernel on a gfx950; on an H200 our fused kernel opted in
# (INDEXER_TOPK_FUSED_PREFILL=1), which serves every prefill whatever the routes table says.
LAYOUT_PROBE = {"aiter_mxfp4": MI355X_AITER, "sglang_mxfp4": H200_FUSED, "sglang_fp8": H200_FUSED}
# An H200 the shipped routes table applies to (132 SMs, Triton 3.6, the Hopper stream serving).
H200_TABLE = dataclasses.replace(H200, sm_count=132, triton_version="3.6.0", hopper_stream=True)
MI355X = dataclasses.replace(MI355X_AITER, aiter_symbol=False)  # its AITER lacks the fused kernel
LAYOUT_BACKEND = {"aiter_mxfp4": "aiter", "sglang_mxfp4": "fused", "sglang_fp8": "fused"}


@pytest.fixture(scope="module")
def sglang_paths():
    try:
        return sglang_fetch.fetch_sglang_source()
    except sglang_fetch.SourceUnavailable as exc:
        pytest.skip(f"SGLang {sglang_fetch.SGLANG_VERSION} wheel unavailable: {exc}")


@pytest.fixture(scope="module")
def sg(sglang_paths):
    env = open_sglang(sglang_paths)
    yield env
    env.close()


class Calls(list):
    """The plugin's calls of our operator; ``hints`` their ``rows_per_request``, ``workspaces``
    the workspace each passed, ``orders`` the order each asked for."""

    hints: list
    workspaces: list
    orders: list


@pytest.fixture
def served(monkeypatch):
    """Calls of our operator made by the plugin: one ``(backend, rows, topk, layout)`` each,
    ``backend`` as the policy named it. The exact ``"reference"`` backend computes each one:
    the policy routes as on the GPU of its probe, where our kernels or AITER would run."""
    calls = Calls()
    calls.hints, calls.workspaces, calls.orders = [], [], []
    real = api.indexer_topk

    def serve(*args, **kwargs):
        calls.append((kwargs["backend"], args[0].shape[0], kwargs["topk"], kwargs["layout"]))
        calls.hints.append(kwargs.get("rows_per_request"))
        calls.workspaces.append(kwargs.get("workspace"))
        calls.orders.append(kwargs.get("order"))
        return real(*args, **{**kwargs, "backend": "reference"})

    monkeypatch.setattr(api, "indexer_topk", serve)
    return calls


def _ensure_entry_point(monkeypatch, sg) -> None:
    """Use the installed distribution's entry point; register the same one if the package is not installed."""
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    if any(ep.name == "indexer_topk" for ep in eps):
        return
    ep = importlib.metadata.EntryPoint("indexer_topk", "indexer_topk.sglang_plugin:load", "sglang.srt.plugins")
    monkeypatch.setattr(sg.plugins, "entry_points", lambda group: [ep] if group == "sglang.srt.plugins" else [])


@pytest.fixture
def load(sg, monkeypatch):
    """``load(probe)``: SGLang's loader loads the plugin; the policy is the real one for ``probe``."""
    mixin = sg.indexer.C4IndexerBackendMixin
    saved = {name: mixin.__dict__[name] for name in ("__init__", "forward_c4_indexer")}
    monkeypatch.setattr(sglang_plugin, "_STATE", sglang_plugin._PluginState())
    sg.calls.clear()

    def _load(probe: Probe = H200):
        policy = CountingPolicy(probe)
        monkeypatch.setattr(policy_module, "default_policy", lambda: policy)
        _ensure_entry_point(monkeypatch, sg)
        monkeypatch.setattr(sg.plugins, "_plugins_loaded", False)
        sg.plugins.load_plugins()
        return policy

    yield _load
    sg.hook_registry.HookRegistry.reset()
    for name, fn in saved.items():
        setattr(mixin, name, fn)


def _scene(sg, **kw):
    return build_scene(sg, SceneSpec(**kw))


# ---------------------------------------------------------------------------------------------
# Without SGLang, and the loader itself
# ---------------------------------------------------------------------------------------------

def test_without_sglang_import_and_load_do_nothing():
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO)\n"
        "import indexer_topk.sglang_plugin as p\n"
        "assert not any(m == 'sglang' or m.startswith('sglang.') for m in sys.modules)\n"
        "sys.modules['sglang'] = None  # as if SGLang were not installed\n"
        "print(p.load())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
    assert "indexer_topk: SGLang is not installed" in proc.stderr


def test_loader_registers_both_hooks(sg, load, caplog):
    caplog.set_level(logging.INFO)
    load()
    registry = sg.hook_registry.HookRegistry
    assert sglang_plugin.FORWARD_TARGET in registry._patched
    assert sglang_plugin.INIT_TARGET in registry._patched
    mixin = sg.indexer.C4IndexerBackendMixin
    assert hasattr(mixin.forward_c4_indexer, "__wrapped__") and hasattr(mixin.__init__, "__wrapped__")
    assert sg.version.__version__ == sglang_plugin.TARGET_SGLANG_VERSION
    assert f"indexer_topk: registered DSv4 C4 indexer hooks on SGLang {sg.version.__version__}" in caplog.text
    assert "Executed general plugin: indexer_topk" in caplog.text


def test_plugins_allowlist_without_us_leaves_sglang_untouched(sg, load, monkeypatch):
    monkeypatch.setenv("SGLANG_PLUGINS", "some_other_plugin")
    load()
    assert not hasattr(sg.indexer.C4IndexerBackendMixin.forward_c4_indexer, "__wrapped__")


def test_a_registry_that_refuses_a_hook_is_left_with_neither(sg, load, monkeypatch, caplog):
    """Both hooks or neither: when SGLang's registry raises on the second, the first is withdrawn
    and load() warns and returns False (SGLang starts untouched); a later load() registers each
    hook once."""
    caplog.set_level(logging.INFO)
    registry = sg.hook_registry.HookRegistry
    real = registry.register.__func__
    seen = []

    def refuse_second(cls, target, hook, kind, *args, **kwargs):
        seen.append(target)
        if len(seen) == 2:
            raise RuntimeError("registry closed")
        return real(cls, target, hook, kind, *args, **kwargs)

    monkeypatch.setattr(registry, "register", classmethod(refuse_second))
    assert sglang_plugin.load() is False
    assert "refused the DSv4 indexer hooks (RuntimeError: registry closed); leaving SGLang untouched" in caplog.text
    ours = (sglang_plugin._freeze_after_backend_init, sglang_plugin._forward_c4_indexer_hook)
    assert not [e for target in registry._hooks.values() for e in target if e[1] in ours]
    monkeypatch.setattr(registry, "register", classmethod(real))
    assert sglang_plugin.load() is True and sglang_plugin.load() is True
    assert [e[1] for e in registry._hooks[sglang_plugin.INIT_TARGET]].count(ours[0]) == 1
    assert [e[1] for e in registry._hooks[sglang_plugin.FORWARD_TARGET]].count(ours[1]) == 1

def test_missing_hook_symbol_leaves_sglang_untouched(sg, load, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.delattr(sg.indexer.C4IndexerBackendMixin, "_forward_prepare_multi_stream")
    load()
    assert not hasattr(sg.indexer.C4IndexerBackendMixin.forward_c4_indexer, "__wrapped__")
    assert sglang_plugin.FORWARD_TARGET not in sg.hook_registry.HookRegistry._hooks
    assert "C4IndexerBackendMixin._forward_prepare_multi_stream is missing" in caplog.text
    assert "leaving SGLang's indexer untouched" in caplog.text


def test_policy_built_when_sglang_builds_the_backend(sg, load, monkeypatch):
    policy = load()
    asked = []
    monkeypatch.setattr(policy_module, "default_policy", lambda: asked.append("init") or policy)
    _scene(sg, layout="sglang_fp8")  # SGLang's backend __init__ runs here, before any capture
    assert asked and set(asked) == {"init"}
    assert not policy.routes  # built (frozen) before any call was routed


def test_a_backend_init_hook_that_fails_leaves_sglang_serving(sg, load, served, monkeypatch, caplog):
    """SGLang's ``is_hip`` raising inside the backend-init hook (a broken or stubbed SGLang):
    SGLang's start-up goes on, a warning says why, and every call stays on SGLang's path."""
    caplog.set_level(logging.INFO)
    load(H200_FUSED)  # a policy that would serve FP8 prefill with ours

    def broken():
        raise RuntimeError("no device query here")

    monkeypatch.setattr(sg.indexer, "is_hip", broken)
    scene = _scene(sg, layout="sglang_fp8")  # SGLang's backend __init__ runs the hook here
    assert "the backend-init hook failed (RuntimeError: no device query here)" in caplog.text
    sg.calls.clear()
    _assert_sglang_served(sg, scene, served)  # the hook asks is_hip no more


def test_decline_probe_times_a_call_handed_back(sg, load):
    """The GPU run's probe of what a handed-back call costs (``run_cuda.decline_host_us``): on
    an H200, FP8 prefill inside SGLang stays on SGLang's path, so the hook declines it, never
    calling our operator, and the probe reports a time and where it goes."""
    from sglang_doubles.run_cuda import decline_host_us

    policy = load()
    scene = _scene(sg, layout="sglang_fp8")
    calls = sg.calls.logits_calls()
    got = decline_host_us(scene, calls=20)
    assert got["hook_decline_us"] > 0 and len(got["hook_decline_profile"]) > 1
    assert sg.calls.logits_calls() == calls  # the stand-in original ran, not SGLang's kernels
    assert not policy.routes  # handed back by the frozen answer, the policy not asked


def test_calls_nothing_of_ours_could_serve_skip_the_policy(sg, load, served, monkeypatch):
    """On an H200 no call SGLang can hand the plugin goes to ours (the routes table keeps FP8
    on SGLang's path in every mode): the frozen policy says so once, and each call then goes
    back to SGLang without binding its arguments or asking the policy again."""
    policy = load(H200)
    scene = _scene(sg, layout="sglang_fp8")  # SGLang's backend __init__ freezes the policy here
    # FP8 has SGLang's path in every mode; an FP4 cache has none on Hopper, so ours would serve it
    assert sglang_plugin._STATE.prefill_ours == {False: False, True: True}
    assert not sglang_plugin._STATE.decode_ours
    sg.calls.clear()
    pages, _ = scene.forward()
    assert served == [] and sg.calls.logits_calls() == 1 and not policy.routes
    assert torch.equal(pages, scene.forward(original=True)[0])
    fused = CountingPolicy(H200_FUSED)  # a policy rebuilt after the freeze (tests and tools only)
    monkeypatch.setattr(policy_module, "default_policy", lambda: fused)
    scene.forward()
    assert [c[0] for c in served] == ["fused"]  # the stale answer is not used: the new policy serves
    load(H200_FUSED)
    _scene(sg, layout="sglang_fp8")
    assert sglang_plugin._STATE.prefill_ours[False]  # opted in: FP8 prefill calls ask the policy again


# ---------------------------------------------------------------------------------------------
# Prefill: served by our operator, identical to SGLang's own path
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [False, True], ids=["pages", "pages+raw"])
@pytest.mark.parametrize("layout", ["aiter_mxfp4", "sglang_mxfp4", "sglang_fp8"])
def test_prefill_matches_sglang_without_logits(sg, load, served, layout, raw):
    policy = load(LAYOUT_PROBE[layout])
    scene = _scene(sg, layout=layout, raw_indices=raw, seed=len(layout) + raw)
    sg.calls.clear()
    pages, raws = scene.forward()
    fused_calls = dict(sg.calls)
    sg.calls.clear()
    legacy_pages, legacy_raws = scene.forward(original=True)

    backend = LAYOUT_BACKEND[layout]
    assert served == [(backend, scene.rows, 512, layout)]  # one call, every row: no chunks
    # SGLang's CUDA branch reads the selection as a set: a prefill call takes ascending positions
    assert served.orders == ["score" if layout == "aiter_mxfp4" else "position"]
    assert policy.routes == {backend: 1}  # the policy was asked once
    assert same_selection(pages, legacy_pages), rows_differing(pages, legacy_pages)
    assert (pages[scene.rows:] == -1).all()  # rows past the batch untouched
    if raw:
        assert same_selection(raws, legacy_raws), rows_differing(raws, legacy_raws)
    # No logits kernel and no logits buffer on our route; SGLang's own route needs both.
    assert sg.calls.logits_calls() == 1
    assert fused_calls.get("forward_indexer_compressor") == 1
    assert not any(k in fused_calls for k in sg.calls.LOGITS + ("fp4_hip._alloc_logits",))
    # SGLang's own query quantisation ran on both routes.
    quant = "aiter.rope_rotate_activation" if layout == "aiter_mxfp4" else (
        "jit.q_indexer_fp4_quant" if layout == "sglang_mxfp4" else "jit.q_indexer_fp8_quant")
    assert fused_calls[quant] == 1


def test_our_calls_take_the_plugins_workspace(sg, load, served):
    """Calls our Triton backends serve get the plugin's own workspace (no scratch of their own),
    one buffer for every call its rows fit, a larger one for a larger batch; the captured call
    too. AITER's calls keep SGLang's."""
    load(H200_DECODE)
    small = _scene(sg, layout="sglang_mxfp4", extend=(3, 2), contexts=(900, 700), seed=31)
    small.forward()
    small.forward()
    layout, rows = "sglang_mxfp4", small.rows
    first = served.workspaces[0]
    assert first is not None and served.workspaces[1] is first
    assert first.dtype == torch.uint8 and first.numel() >= api.workspace_size(rows, 512, layout, "cpu")
    big = _scene(sg, layout=layout, extend=(9, 9, 9), contexts=(900, 700, 500), seed=32)
    pages, _ = big.forward()
    grown = served.workspaces[2]
    assert grown is not first and grown.numel() >= api.workspace_size(big.rows, 512, layout, "cpu")
    legacy_pages, _ = big.forward(original=True)
    assert same_selection(pages, legacy_pages), rows_differing(pages, legacy_pages)
    sg.capturing[0] = True
    try:
        small.forward()
    finally:
        sg.capturing[0] = False
    # a captured call's buffer is one no eager call gets (a graph replays beside eager work)
    assert served[3][0] == "fused" and all(served.workspaces[3] is not t for t in (first, grown))
    assert sglang_plugin._STATE.workspaces._kept == []  # nothing captured was outgrown


def test_aiter_calls_keep_sglangs_workspace(sg, load, served):
    load(LAYOUT_PROBE["aiter_mxfp4"])
    _scene(sg, layout="aiter_mxfp4", seed=5).forward()
    assert served[0][0] == "aiter" and served.workspaces == [None]


@pytest.mark.parametrize("layout", ["aiter_mxfp4", "sglang_fp8"])
def test_prefill_sglang_chunks_rows_we_do_not(sg, load, served, layout):
    load(LAYOUT_PROBE[layout])
    scene = _scene(sg, layout=layout, chunk_rows=8, seed=7)
    sg.calls.clear()
    pages, _ = scene.forward()
    assert sg.calls.logits_calls() == 0 and len(served) == 1 and served[0][1] == scene.rows
    legacy_pages, _ = scene.forward(original=True)
    assert sg.calls.logits_calls() == -(-scene.rows // 8)  # SGLang's path: one logits call per chunk
    assert same_selection(pages, legacy_pages), rows_differing(pages, legacy_pages)


def test_prefill_matches_sglang_torch_fp8_logits(sg, load, served):
    """SGLang's whole legacy path is its own code here: its torch FP8 logits and torch top-k."""
    load(H200_FUSED)
    scene = _scene(sg, layout="sglang_fp8", keys="gapped", contexts=(2900, 2404, 300), extend=(9, 6, 3),
                   sglang_torch_logits=True, raw_indices=True, seed=3)
    pages, raws = scene.forward()
    assert len(served) == 1 and sg.calls["indexer.fp8_paged_mqa_logits_torch"] == 0
    legacy_pages, legacy_raws = scene.forward(original=True)
    assert sg.calls["indexer.fp8_paged_mqa_logits_torch"] == 1
    assert same_selection(pages, legacy_pages), rows_differing(pages, legacy_pages)
    assert same_selection(raws, legacy_raws)


def test_nan_scores_rank_last_here_and_first_in_sglangs_torch_topk(sg, load, served):
    """One NaN FP8 key scale: SGLang's torch top-k ranks the NaN score above every number and
    selects it in each row that reads it; our operator ranks NaN last and selects numbers there.
    Every other row selects the same. docs/sglang.md states the difference in its last paragraph."""
    load(H200_FUSED)
    scene = _scene(sg, layout="sglang_fp8", seed=5)
    page = int(scene.metadata.indexer_metadata.page_table[0, 0])
    k_cache = scene.backend.token_to_kv_pool.with_scale
    k_cache[page, 64 * 128 + 3 * 4 : 64 * 128 + 4 * 4] = torch.tensor([float("nan")]).view(torch.uint8)
    nan_slot = page * 64 + 3
    pages, _ = scene.forward()
    sglang_pages, _ = scene.forward(original=True)
    assert len(served) == 1
    reads_it = (scene.metadata.indexer_metadata.page_table[:, 0] == page) & (scene.c4_lens > 3)
    long_rows = reads_it & (scene.c4_lens > 512)
    assert bool(long_rows.any())
    for r in range(scene.rows):
        ours, theirs = set(pages[r].tolist()), set(sglang_pages[r].tolist())
        if long_rows[r]:
            assert nan_slot in theirs and nan_slot not in ours and len(theirs - ours) == 1, r
        else:
            assert ours == theirs, r
    last = (REPO / "docs" / "sglang.md").read_text().strip().split("\n\n")[-1]
    assert "NaN" in last and "torch.topk" in last and "below every number" in last and "above every number" in last


def test_topk_1024(sg, load, served):
    load(H200)
    scene = _scene(sg, layout="sglang_mxfp4", topk=1024, contexts=(4900, 1000), extend=(6, 3), seed=11)
    pages, _ = scene.forward()
    legacy_pages, _ = scene.forward(original=True)
    assert served[0][2] == 1024
    assert same_selection(pages, legacy_pages), rows_differing(pages, legacy_pages)


def test_target_verify_rows_are_prefill_rows(sg, load, served):
    """MTP verification run eagerly scores like prefill (one row per draft token)."""
    load(H200)
    scene = _scene(sg, layout="sglang_mxfp4", mode="TARGET_VERIFY", extend=(4, 4, 4), seed=13)
    pages, _ = scene.forward()
    legacy_pages, _ = scene.forward(original=True)
    assert len(served) == 1
    assert same_selection(pages, legacy_pages), rows_differing(pages, legacy_pages)


def test_indexer_capturer_gets_the_raw_indices(sg, load, served, monkeypatch):
    """SGLang's top-k capturer (routing replay) records raw indices on our route too."""
    load(MI355X_AITER)
    captured = []
    capturer = type("Capturer", (), {"capture": lambda self, layer, raw: captured.append((layer, raw.clone()))})()
    monkeypatch.setattr(sg.indexer, "get_global_indexer_capturer", lambda: capturer)
    scene = _scene(sg, layout="aiter_mxfp4", seed=17)
    pages, _ = scene.forward()
    legacy_pages, _ = scene.forward(original=True)
    assert len(served) == 1 and len(captured) == 2 and captured[0][0] == 0
    rows = scene.rows
    assert same_selection(captured[0][1][:rows], captured[1][1][:rows])
    assert same_selection(pages, legacy_pages)


# ---------------------------------------------------------------------------------------------
# Decode, capture, kill switch, non-paged, failure: SGLang's own path
# ---------------------------------------------------------------------------------------------

def _assert_served_once(sg, scene, served, backend, layout):
    """One call of ours (``backend``) serves every row of ``scene``, selecting as SGLang's path does."""
    sg.calls.clear()
    pages, _ = scene.forward()
    assert served == [(backend, scene.rows, scene.spec.topk, layout)]
    legacy_pages, _ = scene.forward(original=True)
    assert same_selection(pages, legacy_pages), rows_differing(pages, legacy_pages)


def _assert_sglang_served(sg, scene, served):
    pages, _ = scene.forward()
    assert served == []
    assert sg.calls.logits_calls() == 1
    legacy_pages, _ = scene.forward(original=True)
    assert torch.equal(pages, legacy_pages)


@pytest.mark.parametrize("layout", ["aiter_mxfp4", "sglang_fp8"])
def test_decode_stays_on_sglang(sg, load, served, layout):
    policy = load(LAYOUT_PROBE[layout])
    scene = _scene(sg, layout=layout, mode="DECODE", extend=(1, 1, 1))
    sg.calls.clear()
    _assert_sglang_served(sg, scene, served)
    assert not policy.routes  # decode left before the call's metadata is read


def test_decode_passed_positionally_is_routed_by_the_policy(sg, load, served):
    """Without the keyword fast path, the policy's decode rule keeps the call on SGLang's path."""
    policy = load(H200)
    scene = _scene(sg, layout="sglang_fp8", mode="DECODE", extend=(1, 1, 1))
    sg.calls.clear()
    hooked = type(scene.backend).forward_c4_indexer
    with scene.platform():
        hooked(scene.backend, scene.x, scene.q_lora, scene.c4_indexer, scene.forward_batch)
    assert served == [] and sg.calls.logits_calls() == 1
    assert policy.routes == {"legacy": 1}


H200_DECODE = dataclasses.replace(H200, fused_decode=True)  # INDEXER_TOPK_FUSED_DECODE=1


def test_shipped_h200_table_keeps_fp8_on_sglang_and_decode_off_the_hook(sg, load, served):
    """On an H200 the shipped table says SGLang's own path for every measured FP8 shape (faster
    than ours), and outside them the proven rule keeps SGLang's path: prefill and decode stay
    there, and decode leaves the hook before the policy is asked."""
    policy = load(H200_TABLE)
    assert policy.table is not None and policy.table.shipped
    scene = _scene(sg, layout="sglang_fp8", seed=29)
    assert sglang_plugin._STATE.decode_ours is False
    sg.calls.clear()
    _assert_sglang_served(sg, scene, served)
    decode = _scene(sg, layout="sglang_fp8", mode="DECODE", extend=(1, 1, 1))
    policy.routes.clear()
    sg.calls.clear()
    _assert_sglang_served(sg, decode, served)
    assert not policy.routes


def test_a_routes_file_decides_inside_sglang(sg, load, served, tmp_path):
    """INDEXER_TOPK_ROUTES names a table (as `indexer-topk tune` writes) whose entry puts FP8
    prefill on our fused kernel: the plugin serves the call with it; the same table with the
    engine's path faster leaves the call to SGLang."""
    from indexer_topk import routes

    def table(backend):
        entry = {"layout": "sglang_fp8", "mode": "prefill", "topk": 512, "rows": 1, "c4": 64, "backend": backend,
                 "ours": "fused", "record": [{"file": "mix.json", "commit": "abc1234", "shape": "tiny"}]}
        path = tmp_path / f"{backend}.json"
        routes.write_table({"schema": 1, "device": {"vendor": "nvidia", "arch": "sm_90", "sm_count": 132},
                            "conditions": {"triton": "3.6"}, "context": "c4", "entries": [entry]}, path)
        return str(path)

    load(dataclasses.replace(H200_TABLE, routes_file=table("fused")))
    _assert_served_once(sg, _scene(sg, layout="sglang_fp8", seed=31), served, "fused", "sglang_fp8")
    served.clear()
    sglang_plugin._STATE.warmed = False
    load(dataclasses.replace(H200_TABLE, routes_file=table("engine")))
    scene = _scene(sg, layout="sglang_fp8", seed=31)
    sg.calls.clear()
    _assert_sglang_served(sg, scene, served)


def test_amd_without_aiter_symbol_stays_on_sglang(sg, load, served):
    """Without AITER's kernel and without INDEXER_TOPK_TRITON_ROCM=1 our Triton kernels are not
    used inside SGLang: every call stays on SGLang's own path (prefill, decode, capture)."""
    policy = load(MI355X)
    assert policy.route(layout="aiter_mxfp4", capturing=False) == "legacy"  # the API's proven path
    for spec in (dict(seed=37), dict(mode="DECODE", extend=(1, 1, 1)), dict(use_prefill_cuda_graph=True)):
        scene = _scene(sg, layout="aiter_mxfp4", **spec)
        sg.calls.clear()
        _assert_sglang_served(sg, scene, served)
    assert sglang_plugin._STATE.decode_ours is False


def test_amd_triton_opt_in_serves_prefill_with_fused(sg, load, served):
    load(dataclasses.replace(MI355X, triton_rocm=True))
    _assert_served_once(sg, _scene(sg, layout="aiter_mxfp4", seed=41), served, "fused", "aiter_mxfp4")


def test_aiter_host_leaves_topk_2048_to_sglang(sg, load, served):
    """AITER's kernel takes topk 512 and 1024; a 2048 call stays on SGLang's path (not on our
    legacy Triton kernels, which are opt-in on AMD)."""
    load(MI355X_AITER)
    scene = _scene(sg, layout="aiter_mxfp4", topk=2048, contexts=(9000, 300), extend=(3, 2), seed=43)
    sg.calls.clear()
    pages, _ = scene.forward()
    assert served == [] and sg.calls.logits_calls() == 1


@pytest.mark.parametrize("layout", ["sglang_fp8", "sglang_mxfp4"])
def test_decode_opted_in_is_served_by_the_fused_path(sg, load, served, layout):
    """With decode opted in, a decode step (one row per request) goes through our operator on the
    fused path, told that each request has one row (the fused backend's decode tiling), and
    selects what SGLang's own decode path selects."""
    policy = load(H200_DECODE)
    scene = _scene(sg, layout=layout, mode="DECODE", extend=(1, 1, 1), contexts=(5000, 2300, 900), seed=19)
    sg.calls.clear()
    pages, _ = scene.forward()
    assert served == [("fused", scene.rows, 512, layout)] and served.hints == [1] and served.orders == ["score"]
    assert policy.routes == {"fused": 1}
    assert sg.calls.logits_calls() == 0
    legacy_pages, _ = scene.forward(original=True)
    assert sg.calls.logits_calls() == 1
    assert same_selection(pages, legacy_pages), rows_differing(pages, legacy_pages)


@pytest.mark.parametrize("how", ["positional", "keywords", "mixed"])
@pytest.mark.parametrize("layout", ["sglang_fp8", "sglang_mxfp4"])
def test_idle_is_a_no_op_with_decode_opted_in(sg, load, served, layout, how):
    """An IDLE batch returns at once in SGLang's forward_c4_indexer: with decode opted in to our
    fused path it must stay a no-op however it is passed -- no compressor, no logits, no call of
    our operator, and SGLang's page indices left as they were."""
    policy = load(H200_DECODE)
    scene = _scene(sg, layout=layout, mode="IDLE", extend=(1, 1, 1))
    core = scene.metadata.core_metadata
    core.c4_sparse_page_indices.fill_(-7)
    sg.calls.clear()
    hooked = type(scene.backend).forward_c4_indexer
    args = (scene.backend, scene.x, scene.q_lora, scene.c4_indexer, scene.forward_batch)
    with scene.platform():
        if how == "positional":
            result = hooked(*args)
        elif how == "keywords":
            result = hooked(scene.backend, x=scene.x, q_lora=scene.q_lora, c4_indexer=scene.c4_indexer,
                            forward_batch=scene.forward_batch)
        else:
            result = hooked(*args[:4], forward_batch=scene.forward_batch)
    assert result is None and served == [] and not policy.routes
    assert sum(sg.calls.values()) == 0, dict(sg.calls)
    assert bool((core.c4_sparse_page_indices == -7).all())


def test_capture_opted_in_is_served_by_the_fused_path(sg, load, served):
    policy = load(H200_DECODE)
    scene = _scene(sg, layout="sglang_fp8", seed=23)
    sg.calls.clear()
    sg.capturing[0] = True
    try:
        pages, _ = scene.forward()
    finally:
        sg.capturing[0] = False
    assert served == [("fused", scene.rows, 512, "sglang_fp8")] and policy.routes == {"fused": 1}
    assert served.hints == [None]  # a prefill batch: requests of different row counts
    assert served.orders == ["position"]
    legacy_pages, _ = scene.forward(original=True)
    assert same_selection(pages, legacy_pages), rows_differing(pages, legacy_pages)


@pytest.mark.parametrize("probe", [
    dataclasses.replace(H200_DECODE, fused_enabled=False, kill_switch_raw="false"),  # the kill switch wins
    dataclasses.replace(MI355X_AITER, fused_decode=True),  # our Triton path is not opted in on AMD
], ids=["kill_switch", "amd_without_triton"])
def test_decode_opt_in_stays_on_sglang_where_it_cannot_apply(sg, load, served, probe):
    policy = load(probe)
    layout = "aiter_mxfp4" if probe.device == "hip" else "sglang_fp8"
    scene = _scene(sg, layout=layout, mode="DECODE", extend=(1, 1, 1))
    sg.calls.clear()
    _assert_sglang_served(sg, scene, served)
    assert policy.decode_backend == "legacy" and not policy.routes  # left at the fast path


def test_hip_verify_on_rowgroup_decode_workspace_stays_on_sglang(sg, load, served):
    """SGLang scores a target-verify as decode rows when HIP built a row-group decode workspace."""
    policy = load(MI355X_AITER)
    scene = _scene(sg, layout="aiter_mxfp4", mode="TARGET_VERIFY", extend=(4, 4, 4))
    ws = sg.fp4_hip.FP4RowgroupDecodeWorkspace(scene.metadata.indexer_metadata.page_table, 256, None, 4)
    scene.metadata.fp4_decode_workspace = ws
    sg.calls.clear()
    pages, _ = scene.forward()
    assert served == [] and sg.calls.logits_calls() == 1
    assert policy.routes == {"legacy": 1}  # told these rows are decode rows, the policy keeps them off


@pytest.mark.parametrize("how", ["torch_stream_capture", "sglang_capture_mode", "breakable_cuda_graph",
                                 "prefill_cuda_graph_metadata"])
def test_capture_stays_on_sglang(sg, load, served, how):
    policy = load(H200_FUSED)  # prefill opted in to ours, so the hook must ask, and see the capture
    scene = _scene(sg, layout="sglang_fp8", use_prefill_cuda_graph=how == "prefill_cuda_graph_metadata")
    sg.calls.clear()
    if how == "torch_stream_capture":
        sg.capturing[0] = True
        try:
            pages, _ = scene.forward()
        finally:
            sg.capturing[0] = False
    elif how == "sglang_capture_mode":
        with sg.capture_mode.model_capture_mode():
            pages, _ = scene.forward()
    elif how == "breakable_cuda_graph":
        with sg.bcg_context.enable_breakable_cuda_graph():
            pages, _ = scene.forward()
    else:
        pages, _ = scene.forward()
    assert served == [] and sg.calls.logits_calls() == 1
    assert policy.routes == {"legacy": 1}  # the policy, asked once, saw the capture
    legacy_pages, _ = scene.forward(original=True)
    assert torch.equal(pages, legacy_pages)


def test_fp8_prefill_stays_on_sglang_by_default(sg, load, served):
    """On NVIDIA SGLang's own CUDA path serves FP8 prefill unless the fused kernel is opted in:
    it is measured faster than ours. The frozen policy said so when SGLang built the backend, so
    the call asks it nothing."""
    policy = load(H200)
    assert policy.inner.route(layout="sglang_fp8", capturing=False) == "legacy"
    scene = _scene(sg, layout="sglang_fp8")
    sg.calls.clear()
    _assert_sglang_served(sg, scene, served)
    assert not policy.routes


def test_warm_up_compiles_only_what_our_routes_run(sg, load):
    """At the backend's construction the plugin compiles the kernels of the layouts our route
    serves on this GPU: none on an H200 by default (FP8 stays on SGLang's path, FP4 is refused
    below SM100), FP8 for both topk with the fused kernel opted in, once per process."""
    policy = load(H200)
    _scene(sg, layout="sglang_fp8")
    assert policy.warmed == []
    sglang_plugin._STATE.warmed = False
    policy = load(H200_FUSED)
    _scene(sg, layout="sglang_fp8")
    _scene(sg, layout="sglang_fp8")
    assert policy.warmed == [("sglang_fp8", 512), ("sglang_fp8", 1024)]


def test_kill_switch_stays_on_sglang(sg, load, served):
    policy = load(Probe(**{**H200.__dict__, "fused_enabled": False, "kill_switch_raw": "false"}))
    assert policy.fused_backend == "legacy"
    scene = _scene(sg, layout="sglang_fp8")
    sg.calls.clear()
    _assert_sglang_served(sg, scene, served)
    assert not policy.routes  # decided when SGLang built the backend: nothing of ours serves
    assert sglang_plugin._STATE.prefill_ours == {False: False, True: False}
    mx = _scene(sg, layout="sglang_mxfp4")  # the switch sends even this cache to SGLang's path
    sg.calls.clear()
    mx.forward()
    assert served == [] and sg.calls.logits_calls() == 1


def test_no_kernels_here_stays_on_sglang(sg, load, served):
    """Without a GPU or the Triton interpreter the policy answers "reference" for the package's
    own API; inside SGLang that is SGLang's own path."""
    policy = load(Probe(device="cpu", device_name="cpu", triton_version="3.x"))
    assert policy.fused_backend == "reference"
    scene = _scene(sg, layout="sglang_fp8")
    sg.calls.clear()
    _assert_sglang_served(sg, scene, served)
    assert not policy.routes  # decided when SGLang built the backend


def test_nonpaged_indexer_stays_on_sglang(sg, load, served, monkeypatch):
    """SGLang's non-paged CUDA FP8 indexer (large single-request EXTEND) is not a covered branch."""
    load(H200_FUSED)
    monkeypatch.setattr(sg.indexer, "is_cuda", lambda: True)
    monkeypatch.setattr(sg.indexer, "get_parallel", lambda: type("P", (), {"attn_cp_size": 1})())
    monkeypatch.setenv("SGLANG_OPT_DSV4_NONPAGED_INDEXER_MIN_QUERY_TOKENS", "1")
    scene = _scene(sg, layout="sglang_fp8", contexts=(2900,), extend=(10,), seed=5)
    scene.forward_batch.extend_start_loc = torch.zeros(1, dtype=torch.int32)
    sg.calls.clear()
    pages, _ = scene.forward()
    assert served == [] and sg.calls["deep_gemm.fp8_mqa_logits"] == 1
    scene.metadata.indexer_metadata.nonpaged_plan = None
    monkeypatch.setenv("SGLANG_OPT_DSV4_NONPAGED_INDEXER", "false")
    paged_pages, _ = scene.forward()  # now the paged branch, served by us
    assert len(served) == 1
    assert same_selection(pages, paged_pages), rows_differing(pages, paged_pages)


def test_operator_failure_falls_back_once_and_for_all(sg, load, served, monkeypatch, caplog):
    load(H200_FUSED)
    scene = _scene(sg, layout="sglang_fp8")

    def broken(*args, **kwargs):
        raise RuntimeError("kernel launch failed")

    monkeypatch.setattr(api, "indexer_topk", broken)
    sg.calls.clear()
    pages, _ = scene.forward()
    assert "kernel launch failed" in caplog.text
    # SGLang re-scored the call without compressing index keys a second time.
    assert sg.calls["forward_indexer_compressor"] == 1 and sg.calls.logits_calls() == 1
    assert sglang_plugin._STATE.disabled
    pages_again, _ = scene.forward()
    assert sg.calls.logits_calls() == 2  # later calls go straight to SGLang
    legacy_pages, _ = scene.forward(original=True)
    assert torch.equal(pages, legacy_pages) and torch.equal(pages_again, legacy_pages)


# ---------------------------------------------------------------------------------------------
# As a deployment loads it: a fresh process, the installed entry point, the real policy
# ---------------------------------------------------------------------------------------------

def _run_scene(sglang_paths, env_overrides, layout="sglang_fp8"):
    if not any(ep.name == "indexer_topk" for ep in importlib.metadata.entry_points(group="sglang.srt.plugins")):
        pytest.fail("indexer-topk is not installed (pip install -e .): SGLang cannot discover its entry point")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SGLANG_DSV4_FP4_FUSED_TOPK")}
    env.update(env_overrides)
    env["PYTHONPATH"] = os.pathsep.join([str(TEST_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_doubles.run_scene", *map(str, sglang_paths), "--layout", layout],
        capture_output=True, text=True, timeout=300, env=env, cwd=str(TEST_DIR),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_installed_package_serves_prefill_with_triton_fused(sglang_paths):
    """Install the package, start SGLang: nothing else. Here the policy picks our Triton fused
    kernel (the interpreter stands in for a GPU) and the documented log lines appear."""
    result, log = _run_scene(sglang_paths, {"TRITON_INTERPRET": "1"})
    assert result == {"operator_calls": {"fused": 1}, "logits_calls_hooked": 0, "same_selection": True,
                      "hooked": True}
    assert "indexer-topk: routes table: none (no routes table for a CPU): the proven rule; " in log
    assert "device: no GPU, TRITON_INTERPRET=1, triton " in log and "kill switch SGLANG_DSV4_FP4_FUSED_TOPK unset" in log
    assert "; prefill every layout: fused; decode, capture every layout: legacy" in log
    assert "indexer_topk: serving DSv4 C4 indexer top-k (backend=fused, layout=sglang_fp8, topk=512" in log


def test_kill_switch_env_var_in_a_fresh_process(sglang_paths):
    result, log = _run_scene(sglang_paths, {"TRITON_INTERPRET": "1", "SGLANG_DSV4_FP4_FUSED_TOPK": "false"})
    assert result == {"operator_calls": {}, "logits_calls_hooked": 1, "same_selection": True, "hooked": True}
    assert "indexer-topk: routes table: none: no GPU; kill switch SGLANG_DSV4_FP4_FUSED_TOPK is off; " in log
    assert "kill switch SGLANG_DSV4_FP4_FUSED_TOPK=false; every call: legacy" in log
    assert "indexer_topk: serving DSv4 C4 indexer top-k" not in log


# ---------------------------------------------------------------------------------------------
# The documentation says what the code does
# ---------------------------------------------------------------------------------------------

DOC = REPO / "docs" / "sglang.md"


def _doc_commands(prefix: str):
    lines, current = [], ""
    for raw in DOC.read_text().splitlines():
        line = raw.strip()
        if current:
            current += " " + line.rstrip("\\").strip()
        elif line.startswith(prefix):
            current = line.rstrip("\\").strip()
        if current and not line.endswith("\\"):
            lines.append(current)
            current = ""
    return lines


def test_doc_launch_lines_parse_with_sglang(sg):
    import argparse
    import shlex

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    commands = _doc_commands("sglang serve")
    assert len(commands) >= 7
    seen = set()
    for command in commands:
        argv = shlex.split(command)[2:]
        args = parser.parse_args(argv)  # raises on a flag or choice SGLang 0.5.23 does not know
        seen.add(args.model_path)
    assert seen == {"deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Pro"}
    text = DOC.read_text()
    for flags in ("--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
                  "--speculative-num-draft-tokens 4", "--enable-prefill-cp --cp-strategy interleave",
                  "--enable-two-batch-overlap"):
        assert flags in text


# The devices docs/sglang.md's route table shows, as the probes of those devices read them.
DOC_DEVICES = {
    "H200": H200_TABLE,
    "MI355X, AITER with the kernel": dataclasses.replace(MI355X_AITER, sm_count=256, triton_version="3.6.0"),
    "MI355X, AITER without it": dataclasses.replace(MI355X, sm_count=256, triton_version="3.6.0"),
    "CPU": Probe(device="cpu", triton_version="3.6.0"),  # no TRITON_INTERPRET, as a program runs
}


def _doc_rows(label: str) -> list:
    from indexer_topk.policy import PathPolicy

    rows = PathPolicy(DOC_DEVICES[label]).describe()["routes"]
    return [f"| {label} | {r['mode']} | {r['layout']} | {r['auto']} | {r['sglang'] or '—'} |" for r in rows]


@pytest.mark.parametrize("label", list(DOC_DEVICES))
def test_doc_route_table_is_what_describe_says(label):
    lines = DOC.read_text().splitlines()
    assert [line for line in lines if line.startswith(f"| {label} |")] == _doc_rows(label)


def test_doc_route_table_has_no_other_rows():
    lines = DOC.read_text().splitlines()
    start = lines.index("| device | mode | layout | `backend=\"auto\"` | inside SGLang |") + 2
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    assert lines[start:end] == [row for label in DOC_DEVICES for row in _doc_rows(label)]


def test_doc_log_lines_are_the_ones_the_code_logs():
    from indexer_topk.policy import KILL_SWITCH, PathPolicy

    text = DOC.read_text()
    assert PathPolicy(DOC_DEVICES["H200"]).log_line() in text
    assert sglang_plugin.SERVING_LOG % ("fused", "sglang_fp8", 512, 8192) in text
    warm = sglang_plugin.WARM_UP_LOG.replace("%s", "<backends>", 1).replace("%s", "<layout>", 1)
    assert warm.replace("%.1f", "<s>") in " ".join(text.split())
    assert f"{KILL_SWITCH}=false sglang serve" in text
    assert "leaving SGLang's indexer untouched" in text
