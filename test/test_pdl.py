"""Programmatic dependent launch (PDL) of the legacy path's select kernels: when it is taken,
what the kernels compile to, and that it changes no bit (eager, replayed, captured)."""

import pytest
import torch

import indexer_topk as it
from indexer_topk.bench.mix import capture_graph
from indexer_topk.envs import envs
from indexer_topk.kernels import launch as launch_mod
from kernel_cases import assert_bitwise, decode_batch, load_batch
from sm90_builds import compile_script


def test_pdl_needs_compiled_kernels_on_a_cuda_gpu():
    assert not launch_mod.pdl_capable(torch.device("cpu"))
    assert not launch_mod.pdl_launch("cpu")
    if launch_mod.kernels_interpreted():  # the interpreter has no grid dependency control
        assert not launch_mod.pdl_capable("cuda")


@pytest.mark.parametrize("raw, want", [(None, True), ("1", True), ("0", False), ("off", False), ("", False),
                                       ("maybe", False)])
def test_pdl_switch(raw, want, monkeypatch):
    """On by default where capable; off, empty or unreadable launches the kernels one after
    another (the switch fails safe)."""
    monkeypatch.setattr(launch_mod, "pdl_capable", lambda device: True)
    if raw is None:
        monkeypatch.delenv("INDEXER_TOPK_PDL", raising=False)
    else:
        monkeypatch.setenv("INDEXER_TOPK_PDL", raw)
    assert launch_mod.pdl_launch("cuda") is want


def test_pdl_options():
    assert launch_mod.pdl_options(False) == {}
    assert launch_mod.pdl_options(True) == {"launch_pdl": True}


_COMPILE = """
import re
from indexer_topk.kernels.launch import pack_args, tile_config
from indexer_topk.kernels.logits import logits_kernel
from indexer_topk.kernels.row_topk import topk_rows_kernel
from indexer_topk.kernels.split_topk import gate_rows_kernel, gather_rows_kernel
from indexer_topk.workload import make_workload

MEM = r"\\b(ld|st|atom|red|cp\\.async)\\.(global|shared)"
def where(ptx, pattern):
    m = re.search(pattern, ptx)
    return m.start() if m else -1
def show(name, ptx):
    print(name, where(ptx, r"griddepcontrol\\.wait"), where(ptx, r"griddepcontrol\\.launch_dependents"), where(ptx, MEM))
for fn, const in ((gate_rows_kernel, dict(TOPK=64, TILE=1024, SAMPLE=256, BINS=64, SPREAD=16)),
                  (gather_rows_kernel, dict(TOPK=64, TILE=1024, BLOCK=256, BINS=64)),
                  (topk_rows_kernel, dict(TOPK=64, TILE=256, SAMPLE=256))):
    for pdl in (False, True):
        c = dict(const, PDL=pdl)
        sig = report._signature(fn, {}, constexprs=c)
        sig["rows"] = "i32" if "rows" in sig else None
        sig = {k: v for k, v in sig.items() if v is not None}
        show(f"{fn.__name__}:{pdl}", report._compile(fn, sig, c, 90, 4, 1).asm["ptx"])
w = make_workload("sglang_fp8", context_tokens=[2000], rows_per_request=[2], topk=32, seed=0, device="cpu")
ka = pack_args(w.inputs(), launch=False)
tensors = dict(q_ptr=ka.q, qs_ptr=ka.qs, w_ptr=ka.w, kc_ptr=ka.kc, kf_ptr=ka.kf, ks_ptr=ka.ks)
c = dict(LAYOUT=ka.layout, R=1, TMA=True, INTERPRET=False, STAGES=1)
show("logits_kernel:False", report._compile(logits_kernel, report._signature(logits_kernel, tensors, constexprs=c),
                                            c, 90, 4, 1).asm["ptx"])
# the decode step with the gate ahead of the score kernel (backends/legacy.py, scored_split)
from indexer_topk.kernels.logits import gather_logits_kernel
from indexer_topk.kernels.scored_gate import score_sample_kernel
c = dict(TOPK=64, TILE=1024, SAMPLE=256, INTERPRET=False, PDL=True)
show("score_sample_kernel:True", report._compile(
    score_sample_kernel, report._signature(score_sample_kernel, tensors, constexprs=c), c, 90, 4, 1).asm["ptx"])
c = dict(TOPK=64, TILE=1024, SAMPLE=256, BINS=64, SPREAD=16, PDL=True, SAMPLED=True)
show("gate_rows_kernel:sampled", report._compile(
    gate_rows_kernel, report._signature(gate_rows_kernel, {}, constexprs=c), c, 90, 4, 1).asm["ptx"])
c = dict(LAYOUT=ka.layout, TMA=True, INTERPRET=False, STAGES=1, TOPK=64, TILE=1024, BLOCK=256, BINS=64, PDL=True)
ptx = report._compile(gather_logits_kernel, report._signature(gather_logits_kernel, tensors, constexprs=c), c, 90, 4,
                      1).asm["ptx"]
print("gather_logits_kernel:True", where(ptx, r"griddepcontrol\\.wait"),
      where(ptx, r"griddepcontrol\\.launch_dependents"), where(ptx, r"\\b(atom|red)\\.global"))
"""


def test_pdl_kernels_wait_before_any_memory_access():
    """Compiled for sm_90 here (no device, no interpreter): with ``PDL`` the select kernels wait
    for the kernel before them ahead of their first load or store (a later access could read the
    key matrix or scratch before it is written); without it they hold no such instruction. No
    kernel of the shipped step releases the next early (``griddepcontrol.launch_dependents``;
    the gate ahead of the score kernel, checked here too, does by design): measured, an early
    release slowed decode steps of 8 to 64 requests by 6% (most likely the next kernel's programs,
    resident early, took SM room the score kernel's later programs needed), so each dependent
    starts as its producer exits."""
    at = {}
    for line in compile_script(_COMPILE).splitlines():
        name, wait, release, mem = line.split()
        at[name] = (int(wait), int(release), int(mem))
    ahead = {"score_sample_kernel:True", "gate_rows_kernel:sampled", "gather_logits_kernel:True"}
    assert set(at) == {f"{n}:{pdl}" for n in ("gate_rows_kernel", "gather_rows_kernel", "topk_rows_kernel")
                       for pdl in (False, True)} | {"logits_kernel:False"} | ahead
    # The gate ahead of the score kernel (a decode step's three kernels before the finish) is
    # the exception by design: the sample's scoring releases the gate and the score kernel at
    # once (it waits for nothing: the first kernel of a call, a plain launch), the gate releases
    # the score kernel before it waits for the sample, and the score kernel scores before it
    # waits, and waits before its first atomic (the gathering's, on the count the gate clears).
    wait, release, mem = at.pop("score_sample_kernel:True")
    assert wait == -1 and 0 <= release < mem
    wait, release, mem = at.pop("gate_rows_kernel:sampled")
    assert 0 <= release < wait < mem
    wait, release, atomic = at.pop("gather_logits_kernel:True")
    assert release == -1 and 0 <= wait < atomic
    for name, (wait, release, mem) in at.items():
        assert release == -1, name
        assert mem >= 0, name
        if name.endswith(":True"):
            assert 0 <= wait < mem, name
        else:
            assert wait == -1, name


# ---------------------------------------------------------------------------------------------
# GPU: the same bits with and without PDL
# ---------------------------------------------------------------------------------------------

def _legacy(w, pdl: bool, monkeypatch, rows_per_request=None):
    monkeypatch.setenv("INDEXER_TOPK_PDL", "1" if pdl else "0")
    out = it.allocate_result(w.rows, w.topk, "cuda")
    for t in out:
        t.view(torch.int32).fill_(-12345)
    it.indexer_topk(*w.args(), **w.kwargs(), backend="legacy", out=out, check_values=False,
                    rows_per_request=rows_per_request)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["decode", "prefill"])
def test_pdl_gives_the_same_bits_gpu(shape, monkeypatch):
    """A decode batch (the split select: three kernels after the score kernel) and a prefill
    chunk (the row select), each called eagerly twice (the second a replay of the first call's
    launches) with PDL on, then off: equal bit for bit, and the on calls did launch with PDL."""
    if not launch_mod.pdl_capable("cuda"):
        pytest.skip("PDL needs sm_90 or later and a Triton with grid dependency control")
    if shape == "decode":
        w = it.make_workload("sglang_fp8", context_tokens=[131072, 98304, 4096, 131072, 1000, 120000, 65536, 131072],
                             rows_per_request=[1] * 8, topk=1024, seed=11, device="cuda")
        hint = 1
    else:
        w = it.make_workload("sglang_fp8", context_tokens=[65536], rows_per_request=[256], topk=1024, seed=12,
                             device="cuda")
        hint = None
    seen = []
    real = launch_mod.pdl_options
    monkeypatch.setattr("indexer_topk.backends.legacy.pdl_options", lambda pdl: seen.append(pdl) or real(pdl))
    on = [_legacy(w, True, monkeypatch, hint) for _ in range(2)]
    assert seen and all(seen)
    off = _legacy(w, False, monkeypatch, hint)
    torch.cuda.synchronize()
    for got in on:
        assert_bitwise(got, off, f"{shape} with PDL")
    assert_bitwise(off, it.indexer_topk(*w.args(), **w.kwargs(), backend="legacy"), f"{shape} checked call")


@pytest.mark.gpu
def test_pdl_capture_then_replay_with_new_inputs_gpu(monkeypatch):
    """A decode step captured with PDL on, replayed with another batch's queries, keys, pages and
    shorter lengths: the eager bits of that batch without PDL."""
    if not launch_mod.pdl_capable("cuda"):
        pytest.skip("PDL needs sm_90 or later and a Triton with grid dependency control")
    w1, w2 = decode_batch("sglang_fp8", 5, "cuda"), decode_batch("sglang_fp8", 6, "cuda")
    monkeypatch.setenv("INDEXER_TOPK_PDL", "1")
    static = [t.clone() if t is not None else None for t in w1.args()]
    out = it.allocate_result(w1.rows, w1.topk, "cuda")

    def step():
        torch.ops.indexer_topk.indexer_topk_out(*static, w1.topk, "sglang_fp8", *out, None, w1.weight_scale, "legacy",
                                                False, 1)

    graph = capture_graph(step)
    new = load_batch(static, w2.args(), [5000, 24576, 1, 1024, 32768, 0, 30000, 131072])
    for t in out:
        t.view(torch.int32).fill_(-12345)
    for _ in range(3):  # back to back: each replay's first kernel follows the last one's finish
        graph.replay()
    torch.cuda.synchronize()
    with envs.INDEXER_TOPK_PDL.override(False):
        want = it.indexer_topk(*new, **w2.kwargs(), backend="legacy")
    assert_bitwise(out, want, "decode captured with PDL, replayed with new inputs")
