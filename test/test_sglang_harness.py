"""The plugin's argument binder and the helpers of the GPU run on SGLang's own code
(``sglang_doubles.run_cuda``, ``sglang_doubles.imports``), on the CPU."""

from __future__ import annotations

import importlib.metadata
import inspect
import subprocess
import sys
import textwrap

import pytest
import torch

from indexer_topk.sglang_plugin import _Binder
from sglang_doubles.run_cuda import complete, maps_through_table, write_entry_point


def forward(self, x, q_lora, c4_indexer, forward_batch, alt_streams=None, enable_multi_stream=False,
            q_lora_ready=None, skip_compressor=False, q_lora_quant=None):
    return None


def _inspect_bind(fn, args, kwargs):
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


@pytest.mark.parametrize("args, kwargs", [
    (("me",), dict(x=1, q_lora=2, c4_indexer=3, forward_batch=4)),  # SGLang's call
    (("me", 1, 2, 3, 4), {}),
    (("me", 1), dict(q_lora=2, c4_indexer=3, forward_batch=4, enable_multi_stream=True)),
    ((), dict(self="me", x=1, q_lora=2, c4_indexer=3, forward_batch=4, q_lora_quant=9)),
    (("me",), dict(x=1, q_lora=2, c4_indexer=3)),  # a required argument missing
    (("me", 1), dict(x=1, q_lora=2, c4_indexer=3, forward_batch=4)),  # x given twice
    (("me",), dict(x=1, q_lora=2, c4_indexer=3, forward_batch=4, bogus=5)),  # unknown keyword
    (("me", 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11), {}),  # too many positionals
])
def test_binder_binds_as_inspect_does(args, kwargs):
    assert _Binder(forward)(args, kwargs) == _inspect_bind(forward, args, kwargs)


def test_binder_falls_back_for_signatures_it_does_not_shortcut():
    def var(self, *rest, key=1, **more):
        return None

    for args, kwargs in ((("me", 1, 2), dict(key=3, z=4)), ((), {})):
        assert _Binder(var)(args, kwargs) == _inspect_bind(var, args, kwargs)


def test_entry_point_metadata_is_found_by_importlib(tmp_path, monkeypatch):
    write_entry_point(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    found = [e for e in importlib.metadata.entry_points(group="sglang.srt.plugins")
             if e.value == "indexer_topk.sglang_plugin:load"]
    assert found and found[0].name == "indexer_topk"


def test_complete_selections():
    lens = torch.tensor([3, 1, 5])
    good = torch.tensor([[2, 0, 1, -1], [0, -1, -1, -1], [4, 3, 1, 0]])
    assert complete(good, lens, 4)
    assert not complete(torch.tensor([[2, 2, 1, -1], [0, -1, -1, -1], [4, 3, 1, 0]]), lens, 4)  # duplicate
    assert not complete(torch.tensor([[2, 0, -1, -1], [0, -1, -1, -1], [4, 3, 1, 0]]), lens, 4)  # one missing
    assert not complete(torch.tensor([[2, 0, 1, -7], [0, -1, -1, -1], [4, 3, 1, 0]]), lens, 4)  # poison left


def test_missing_packages_are_stubbed_only_for_imports_from_the_roots(tmp_path):
    """The GPU run stands in for CUDA packages SGLang's files import; an import from anywhere
    else still fails, and a hidden package cannot be imported even where installed."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "inside.py").write_text("import no_such_package_xyz\nVALUE = no_such_package_xyz.anything\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(root)!r}, "test"]
        from sglang_doubles.imports import ImportDoubles
        d = ImportDoubles()
        d.stub_missing([{str(root)!r}])
        hidden = d.hide(["json_not_imported_yet_abc", "colorsys"])
        try:
            import colorsys
            raise SystemExit("hidden package imported")
        except ModuleNotFoundError:
            pass
        d.unhide(hidden)
        import colorsys
        try:
            import no_such_package_xyz
            raise SystemExit("stubbed outside the roots")
        except ModuleNotFoundError:
            pass
        import inside
        assert d.stood_for() == ["no_such_package_xyz"], d.stood_for()
        d.uninstall()
        assert "no_such_package_xyz" not in sys.modules
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_raw_positions_map_to_their_page_indices():
    table = torch.tensor([[7, 2], [5, 0]], dtype=torch.int32)
    raw = torch.tensor([[0, 65, -1], [63, -1, -1]])
    pages = torch.tensor([[7 * 64, 2 * 64 + 1, -1], [5 * 64 + 63, -1, -1]])
    assert maps_through_table(raw, pages, table)
    assert not maps_through_table(raw, pages + torch.tensor([[0, 64, 0], [0, 0, 0]]), table)  # wrong page
    assert not maps_through_table(raw, torch.full_like(pages, -1), table)  # page indices never written
