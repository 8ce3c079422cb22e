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
