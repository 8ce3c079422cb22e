"""A policy's decisions in words: the one text the log line, ``info`` and ``describe()`` show.

Each line names a mode (or modes) and layout(s) and what serves their calls: outside SGLang (what
``backend="auto"`` runs) and, for the layouts SGLang can hand the plugin on this device, inside
SGLang. Where a routes table decides by shape, the line counts its measured shapes per backend
and names what serves every other shape.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

from ..contract import Layout
from . import MODES

ENGINE_WORDS = "SGLang's path"


def _words(policy, layout: Layout, mode: str, engine_path: Optional[bool]) -> str:
    measured, other = policy.outcomes(layout, mode, engine_path)

    def name(b):
        return ENGINE_WORDS if b is None else b

    if other == "aiter":
        alt = policy.pick(mode, None, layout, 2048, engine_path)
        return f"aiter (topk 512, 1024), {name(alt)} for topk 2048"
    counts = Counter(b for b in measured if b != other)
    parts = [f"{name(b)} at {'all' if n == len(measured) else f'{n} of'} {len(measured)} measured shapes"
             for b, n in counts.items()]
    return ", ".join(parts + [f"else {name(other)}"]) if parts else name(other)


def route_rows(policy) -> list:
    """``[{"mode", "layout", "auto", "sglang"}]``: what ``backend="auto"`` runs and what serves
    the call inside SGLang (``None`` for a layout SGLang cannot hand over here); rows equal for
    every layout merge across modes, then equal rows across layouts."""
    from ..policy import engine_layouts, sglang_has_path

    probe = policy.probe
    inside = engine_layouts(probe)
    per = {(m, x.value): (_words(policy, x, m, None),
                          _words(policy, x, m, sglang_has_path(x, probe)) if x.value in inside else None)
           for m in MODES for x in Layout}
    groups: list = []
    for m in MODES:
        same = next((g for g in groups if all(per[(g[0], x.value)] == per[(m, x.value)] for x in Layout)), None)
        if same is not None:
            same.append(m)
        else:
            groups.append([m])
    rows = []
    for g in groups:
        modes = "every mode" if len(g) == len(MODES) else ", ".join(g)
        by_value: dict = {}
        for x in Layout:
            by_value.setdefault(per[(g[0], x.value)], []).append(x.value)
        for (auto, sglang), layouts in by_value.items():
            rows.append({"mode": modes, "auto": auto, "sglang": sglang,
                         "layout": "every layout" if len(layouts) == len(Layout) else ", ".join(layouts)})
    if len(rows) == 1 and rows[0]["mode"] == "every mode" and rows[0]["layout"] == "every layout":
        rows[0]["mode"] = "every call"
    return rows


def why_not_aiter(p) -> str:
    """Why AITER's fused kernel does not serve on this AMD GPU."""
    from ..policy import AITER_ARCH

    if p.gfx_arch is None:
        return "the AMD GPU's architecture is unknown"
    if p.gfx_arch != AITER_ARCH:
        return f"AITER's fused kernel needs {AITER_ARCH}, this GPU is {p.gfx_arch}"
    if p.aiter_error:
        return f"AITER could not be imported ({p.aiter_error})"
    return "the installed AITER lacks flydsl_pa_mqa_topk_fp4_prefill"


def why_not_triton(p) -> str:
    """Why our Triton kernels cannot run on this GPU."""
    if p.triton_version is None:
        return f"Triton cannot be imported ({p.triton_error})"
    if p.device_error:
        return f"the GPU's properties could not be read ({p.device_error})"
    return "Triton cannot run here"


def kill_switch_off(p) -> str:
    """The kill switch is off: set so, or set to a value it cannot read."""
    from ..envs import envs
    from ..policy import KILL_SWITCH

    raw = {} if p.kill_switch_raw is None else {KILL_SWITCH: p.kill_switch_raw}  # unset is readable, empty is not
    if not envs.SGLANG_DSV4_FP4_FUSED_TOPK.readable(raw):
        return f"kill switch {KILL_SWITCH}={p.kill_switch_raw!r} is not a recognised value, so the fused path is off"
    return f"kill switch {KILL_SWITCH} is off"


def hardware_words(p) -> str:
    """The device and Triton of a :class:`indexer_topk.policy.Probe`, in a few words."""
    if p.device == "cuda":
        hw = p.device_name + (" sm_{}{}".format(*p.compute_capability) if p.compute_capability else "")
    elif p.device == "hip":
        hw = f"{p.device_name} {p.gfx_arch or 'gfx?'}, aiter fused top-k {'found' if p.aiter_symbol else 'absent'}"
    else:
        hw = "no GPU" + (", TRITON_INTERPRET=1" if p.triton_interpret else ", TRITON_INTERPRET not 1")
    return f"{hw}, {'triton ' + p.triton_version if p.triton_version else 'no triton'}"


def route_lines(policy) -> list:
    """The table in force, the device and kill switch, then one line per row of :func:`route_rows`."""
    from ..policy import KILL_SWITCH

    raw = policy.probe.kill_switch_raw
    switch = KILL_SWITCH + (" unset" if raw is None else f"={raw.strip()}")
    out = [f"routes table: {policy.table_note}", f"device: {hardware_words(policy.probe)}; kill switch {switch}"]
    for r in route_rows(policy):
        scope = r["mode"] if r["mode"] == "every call" else f"{r['mode']} {r['layout']}"
        out.append(f"{scope}: {r['auto']}" + (f"; in SGLang: {r['sglang']}" if r["sglang"] else ""))
    return out


__all__ = ["ENGINE_WORDS", "hardware_words", "kill_switch_off", "route_lines", "route_rows", "why_not_aiter", "why_not_triton"]
