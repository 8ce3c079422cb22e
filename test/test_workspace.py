"""Caller-owned workspaces: exact size, alignment and the legacy path's minimum, checked
before any kernel runs."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import indexer_topk as it
from indexer_topk import policy
from indexer_topk.backends.fused import fused_workspace_size, plan_fused
from indexer_topk.backends.legacy import key_matrix_width
from indexer_topk.envs import envs
from kernel_cases import assert_bitwise


@pytest.fixture
def wl():
    return it.make_workload("sglang_fp8", context_tokens=[2400, 900], rows_per_request=[2, 1], topk=512)


def _refuse_kernels(monkeypatch):
    import indexer_topk.backends.fused as fused
    import indexer_topk.backends.legacy as legacy

    class Refuse:
        def __getitem__(self, grid):
            raise AssertionError("a kernel was launched")

    monkeypatch.setattr(fused, "fused_topk_kernel", Refuse())
    monkeypatch.setattr(legacy, "logits_kernel", Refuse())


@pytest.mark.parametrize("triton", ["installed", "missing"])
@pytest.mark.parametrize("rows, topk, layout, name", [
    (-1, 512, "sglang_fp8", "rows"),
    (-(2**40), 512, "sglang_fp8", "rows"),
    (2.0, 512, "sglang_fp8", "rows"),
    (True, 512, "sglang_fp8", "rows"),
    ("4", 512, "sglang_fp8", "rows"),
    (None, 512, "sglang_fp8", "rows"),
    (4, 100, "sglang_fp8", "topk"),
    (4, 0, "sglang_fp8", "topk"),
    (4, 1024.0, "sglang_fp8", "topk"),
    (4, -512, "sglang_fp8", "topk"),
    (4, None, "sglang_fp8", "topk"),
    (4, 512, "fp4", "layout"),
    (4, 512, None, "layout"),
])
def test_workspace_size_refuses_bad_arguments_first(rows, topk, layout, name, triton, monkeypatch):
    """Negative or non-int rows, an unsupported topk or layout: a ValueError naming the
    argument, before anything else (so also where Triton is missing)."""
    from indexer_topk import backends

    if triton == "missing":
        monkeypatch.setattr(backends, "_triton_installed", lambda: False)
    with pytest.raises(ValueError, match=f"^{name}: "):
        it.workspace_size(rows, topk, layout)


def test_workspace_size_without_triton_is_unavailable(monkeypatch):
    from indexer_topk import backends

    monkeypatch.setattr(backends, "_triton_installed", lambda: False)
    with pytest.raises(it.BackendUnavailable, match="Triton is not installed"):
        it.workspace_size(0, 2048, "aiter_mxfp4")


def test_workspace_within_16_mib_on_a_132_sm_gpu(monkeypatch):
    """At rows = topk = 1024 on an H200-sized GPU (264 program slots, two rows per group) the
    scratch is the queue and, per row slot, a 2048-entry buffer (keys and positions) and a
    1024-key staging strip; the size an engine reserves, ``workspace_size(1024, 1024)``, also
    covers every smaller call (some split their rows and keep per-split lists and their merge
    tree's; decode calls take one row per item), and stays under
    16 MiB for every layout (no context length enters)."""
    from indexer_topk.backends import fused

    monkeypatch.setattr(fused, "device_sm_count", lambda device: 132)
    fused._max_plan_bytes.cache_clear()
    programs, cap, strip = 264, 1024 + 1024, 1024
    want = 256 + 8 * programs * 2 * cap + 4 * programs * 2 * strip
    assert fused.plan_fused(1024, 1024, "cpu").nbytes == want
    for layout in ("sglang_fp8", "sglang_mxfp4", "aiter_mxfp4"):
        size = fused_workspace_size(1024, 1024, layout, "cpu")
        assert want <= size <= 16 << 20
        plans = [fused.plan_fused(r, 1024, "cpu", group_rows=g).nbytes for r in range(1, 1025) for g in (1, 2)]
        assert size == max(plans)
    fused._max_plan_bytes.cache_clear()



@pytest.mark.parametrize("num_splits", [None, 4])
def test_workspace_size_of_any_rows_is_the_largest_plan_up_to_them(num_splits, monkeypatch):
    """``workspace_size`` is the largest plan of every call up to ``rows`` rows without forming
    them all (a billion rows is a question an engine may ask): equal to that maximum on a small
    GPU across the row counts where the plan still changes, and the same from there to 10**9."""
    from indexer_topk.backends import fused

    monkeypatch.setattr(fused, "device_sm_count", lambda device: 6)
    fused._max_plan_bytes.cache_clear()
    slots = fused.program_slots("cpu")
    for one_wave, limit in ((False, slots), (True, 6)):
        for group in (1, 2):
            for rows in (0, 1, 2, 5, limit * group - 1, limit * group, limit * group + 1, 3 * limit * group):
                brute = max(fused._plan(r, 1024, limit, num_splits, None, group, one_wave).nbytes
                            for r in range(1, max(rows, 1) + 1))
                assert fused._max_plan_bytes(rows, 1024, limit, num_splits, None, group, one_wave) == brute
    if num_splits is None:  # beyond every slot's group the plan is constant
        plans = []
        real_plan = fused._plan
        monkeypatch.setattr(fused, "_plan", lambda *a: plans.append(a) or real_plan(*a))
        fused._max_plan_bytes.cache_clear()
        size = fused_workspace_size(10**5, 1024, "sglang_fp8", "cpu")
        assert len(plans) <= 3 * (2 * slots + 1), "plans formed for rows where nothing changes"
        assert size == fused_workspace_size(10**9, 1024, "sglang_fp8", "cpu") == fused_workspace_size(
            4 * slots, 1024, "sglang_fp8", "cpu")
    fused._max_plan_bytes.cache_clear()

def test_fused_workspace_too_small_or_misaligned(wl, monkeypatch):
    _refuse_kernels(monkeypatch)
    n = plan_fused(wl.rows, wl.topk, "cpu").nbytes  # this call's own need
    assert fused_workspace_size(wl.rows, wl.topk, wl.layout, "cpu") >= n
    with pytest.raises(ValueError, match="^workspace: .* needed"):
        it.indexer_topk(*wl.args(), **wl.kwargs(), backend="fused", workspace=torch.zeros(n - 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="^workspace: must start"):
        it.indexer_topk(*wl.args(), **wl.kwargs(), backend="fused", workspace=torch.zeros(n + 1, dtype=torch.uint8)[1:])
    with pytest.raises(ValueError, match="^workspace: expected a uint8"):
        it.indexer_topk(*wl.args(), **wl.kwargs(), backend="fused", workspace=torch.zeros(n, dtype=torch.int8))


def test_legacy_workspace_smaller_than_two_rows_is_left_alone(wl):
    """A workspace too small for two rows of legacy's key matrix is valid input (it may have
    been sized for the fused path): legacy leaves it untouched and allocates its matrix."""
    width = key_matrix_width(wl.page_table)
    ws = torch.full((2 * width * 4 - 16,), 0xA5, dtype=torch.uint8)
    got = it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy", workspace=ws)
    assert bool((ws == 0xA5).all())
    assert_bitwise(got, it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy"))


def test_legacy_workspace_alignment(wl, monkeypatch):
    _refuse_kernels(monkeypatch)
    width = key_matrix_width(wl.page_table)
    with pytest.raises(ValueError, match="^workspace: must start"):
        it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy",
                        workspace=torch.zeros(2 * width * 4 + 16, dtype=torch.uint8)[4:])


def test_kill_switch_keeps_a_call_with_the_fused_workspace_valid():
    """SGLANG_DSV4_FP4_FUSED_TOPK=0 sends ``auto`` to legacy. A workspace of
    workspace_size(...) bytes, far smaller than legacy's key matrix under a wide (SGLang-padded)
    page table, used to make the call fail; switching the path off must not."""
    wl = it.make_workload("sglang_fp8", context_tokens=[4000], rows_per_request=[3], topk=512,
                          page_table_pad=1024 - 16)
    nbytes = it.workspace_size(wl.rows, wl.topk, wl.layout.value, "cpu")
    assert nbytes < 2 * key_matrix_width(wl.page_table) * 4
    policy.default_policy.cache_clear()
    try:
        with envs.SGLANG_DSV4_FP4_FUSED_TOPK.override("0"):
            assert it.resolve_backend("auto") == "legacy"
        got = it.indexer_topk(*wl.args(), **wl.kwargs(), backend="auto", workspace=torch.zeros(nbytes, dtype=torch.uint8))
    finally:
        policy.default_policy.cache_clear()
    assert_bitwise(got, it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy"))


# Triton 3.6's interpreter indexes a scalar (a one-element 1-d array) with int(), which numpy 2.4
# refuses; the script installs that behaviour before the kernels are imported, then runs the
# calls that failed there: workspace_size, an INFO-logged policy, legacy and fused launches.
AS_TRITON_3_6 = textwrap.dedent("""
    import numpy as np
    from triton.runtime import interpreter

    real = interpreter._patch_lang_tensor

    def index_as_in_triton_3_6(self):
        data = self.handle.data
        if np.ndim(data) != 0:  # numpy >= 2.4 on Triton 3.6's int(self.handle.data)
            raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
        return int(data)

    def patch_as_in_triton_3_6(tensor, scope):
        real(tensor, scope)
        scope.set_attr(tensor, "__index__", index_as_in_triton_3_6)

    interpreter._patch_lang_tensor = patch_as_in_triton_3_6

    import torch
    import indexer_topk as it
    from indexer_topk.compare import bitwise_equal

    wl = it.make_workload("sglang_fp8", context_tokens=[2400], rows_per_request=[2], topk=512, seed=4)
    ws = torch.zeros(it.workspace_size(wl.rows, wl.topk, wl.layout.value, "cpu"), dtype=torch.uint8)
    ref = it.indexer_topk(*wl.args(), **wl.kwargs(), backend="reference")
    legacy = it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy")
    fused = it.indexer_topk(*wl.args(), **wl.kwargs(), backend="auto", workspace=ws)
    assert bitwise_equal(legacy, fused) and torch.equal(legacy.raw_indices, ref.raw_indices)
    print("ran", it.resolve_backend("auto"))
""")


def test_interpreter_takes_scalar_indices_as_triton_3_6_gives_them():
    """On Triton 3.6 with numpy 2.4 every interpreted launch failed (InterpreterError:
    TypeError('only 0-dimensional arrays can be converted to Python scalars')) at a loop bound
    read from a kernel's scalar. Run with that interpreter behaviour in a fresh process, the
    calls run and agree."""
    package_root = Path(__import__("indexer_topk").__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", INDEXER_TOPK_LOG_LEVEL="INFO",
               PYTHONPATH=os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", AS_TRITON_3_6], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ran fused" in run.stdout and "INFO" in run.stderr


def test_scalar_index_is_left_alone_where_the_interpreter_takes_it():
    """Where the installed interpreter indexes a one-element scalar itself (Triton 3.9), or
    once wrapped, nothing is wrapped again."""
    from indexer_topk.kernels import common

    if not common.INTERPRETED:
        pytest.skip("kernels compiled for a GPU: the interpreter is not in use")
    assert common.index_one_element_scalars() is False


def test_legacy_workspace_smaller_than_its_chunk_is_left_alone(wl):
    """A workspace that holds two rows but fewer than the budget's chunk would cut the matrix
    into many small chunks: legacy leaves it untouched and allocates its chunk; a workspace
    that holds the chunk is its storage."""
    width = key_matrix_width(wl.page_table)
    small = torch.full((2 * width * 4,), 0xA5, dtype=torch.uint8)
    got = it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy", workspace=small)
    assert bool((small == 0xA5).all())
    assert_bitwise(got, it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy"))
    whole = torch.full(((wl.rows + 1) * width * 4,), 0xA5, dtype=torch.uint8)
    got = it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy", workspace=whole)
    assert not bool((whole == 0xA5).all())
    assert_bitwise(got, it.indexer_topk(*wl.args(), **wl.kwargs(), backend="legacy"))


def test_auto_refuses_a_workspace_the_fused_path_could_not_use():
    """``auto`` may send a call of these shapes to the fused path: a workspace smaller than
    ``workspace_size`` is refused on the first call whichever backend the policy picks, not only
    once a call reaches the fused path; legacy and the reference, asked by name, still accept it
    (legacy allocates its own score matrix)."""
    w = it.make_workload("sglang_fp8", context_tokens=[2048], rows_per_request=[2], topk=512, seed=4, device="cpu")
    small = torch.empty(16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="^workspace: 16 bytes, less than workspace_size"):
        it.indexer_topk(*w.args(), **w.kwargs(), backend="auto", workspace=small)
    for backend in ("legacy", "reference"):
        it.indexer_topk(*w.args(), **w.kwargs(), backend=backend, workspace=small)
    full = torch.empty(it.workspace_size(w.rows, w.topk, w.layout.value), dtype=torch.uint8)
    it.indexer_topk(*w.args(), **w.kwargs(), backend="auto", workspace=full)


def test_auto_takes_any_workspace_where_its_fused_path_is_not_ours(monkeypatch):
    """Where the policy's fused path is not ours (the kill switch: legacy; AITER's; the
    reference alone), ``auto`` never needs ``workspace_size`` bytes: a small workspace passes."""
    import types

    from indexer_topk import api

    w = it.make_workload("sglang_fp8", context_tokens=[2048], rows_per_request=[2], topk=512, seed=4, device="cpu")
    stub = types.SimpleNamespace(fused_backend="legacy", route=lambda **kw: "legacy")
    monkeypatch.setattr(api, "_default_policy", lambda: stub)
    it.indexer_topk(*w.args(), **w.kwargs(), backend="auto", workspace=torch.empty(16, dtype=torch.uint8))
