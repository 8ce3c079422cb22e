"""Backends that cannot run say so with one exception (:mod:`indexer_topk.errors`); every
other exception is a failure, and the two are told apart by type, never by message."""

import sys

import pytest
import torch

import indexer_topk as it
from indexer_topk import api
from indexer_topk.backends import require_runnable
from indexer_topk.errors import BackendUnavailable, describe_exception, failure_reason, failure_status


@pytest.mark.parametrize(
    "exc, status",
    [
        (BackendUnavailable("backend 'aiter' is not available: no aiter"), "unavailable"),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), "error"),
        (RuntimeError("backend 'aiter' is not available: the words alone do not count"), "error"),
        (ImportError("No module named 'aiter'"), "error"),
        (NotImplementedError("not yet"), "error"),
        (ValueError("layout: only aiter_mxfp4"), "error"),
    ],
)
def test_only_backend_unavailable_means_unavailable(exc, status):
    assert failure_status(exc) == status


def test_backend_unavailable_is_a_runtime_error():
    # Callers written against the adapters' earlier RuntimeError still catch it.
    assert issubclass(BackendUnavailable, RuntimeError)
    assert it.BackendUnavailable is BackendUnavailable


def test_descriptions():
    assert describe_exception(ValueError("first line\nsecond line")) == "ValueError: first line"
    assert describe_exception(KeyError()) == "KeyError"
    assert failure_reason(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")).startswith(
        "OOM: RuntimeError: CUDA out of memory")
    assert failure_reason(RuntimeError("device-side assert triggered")) == "RuntimeError: device-side assert triggered"


def _tiny():
    return it.make_workload("sglang_fp8", context_tokens=[1000], rows_per_request=[1], topk=512, seed=1)


@pytest.mark.parametrize("imported", [False, True], ids=["kernels_not_imported", "kernels_compiled"])
@pytest.mark.parametrize("backend", ["legacy", "fused"])
def test_triton_backends_on_a_cpu_without_the_interpreter(monkeypatch, backend, imported):
    """Without TRITON_INTERPRET a kernel launch on CPU tensors fails inside Triton; the call is
    refused first, saying how to run it: by the variable before the kernels are imported, by
    how they were imported after."""
    from indexer_topk.kernels import launch

    if imported:  # imported for a GPU: the variable no longer decides
        monkeypatch.setattr(launch, "kernels_interpreted", lambda: False)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delitem(sys.modules, launch.__name__)
        monkeypatch.setenv("TRITON_INTERPRET", "0")

    def refuse(name):
        raise AssertionError(f"backend {name!r} was reached")

    monkeypatch.setattr(api, "_backend_fn", refuse)
    w = _tiny()
    with pytest.raises(BackendUnavailable, match=f"backend '{backend}' is not available: .*TRITON_INTERPRET=1"):
        it.indexer_topk(*w.args(), **w.kwargs(), backend=backend)
    # The reference needs neither Triton nor a GPU.
    monkeypatch.undo()
    assert it.indexer_topk(*w.args(), **w.kwargs(), backend="reference").counts.tolist() == [250]


def test_triton_backends_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # as if Triton were not installed
    for backend in ("legacy", "fused"):
        with pytest.raises(BackendUnavailable, match="Triton is not installed"):
            require_runnable(backend, torch.device("cpu"))
    with pytest.raises(BackendUnavailable, match="backend 'fused'.*Triton is not installed"):
        it.workspace_size(16, 512, "sglang_fp8")
    require_runnable("reference", "cpu")
    require_runnable("aiter", "cpu")  # AITER brings its own Triton; the adapter judges itself


def _import_fails_with(monkeypatch, exc):
    import indexer_topk.backends as backends

    def fail(name):
        raise exc

    monkeypatch.setattr(backends, "_import_backend", fail, raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _no_module(name):
    return ModuleNotFoundError(f"No module named {name!r}", name=name)


@pytest.mark.parametrize("backend", ["legacy", "fused"])
def test_a_missing_dependency_makes_a_backend_unavailable_naming_it(monkeypatch, backend):
    """Triton's interpreter imports numpy; without it our Triton backends cannot run here, and
    say which package is missing instead of raising a bare ModuleNotFoundError."""
    _import_fails_with(monkeypatch, _no_module("numpy"))
    with pytest.raises(BackendUnavailable, match=f"backend '{backend}' is not available: .*'numpy'.*pip install numpy"):
        require_runnable(backend, torch.device("cpu"))
    w = _tiny()
    with pytest.raises(BackendUnavailable, match="numpy"):
        it.indexer_topk(*w.args(), **w.kwargs(), backend=backend)
    if backend == "fused":
        with pytest.raises(BackendUnavailable, match="numpy"):
            it.workspace_size(16, 512, "sglang_fp8")
    assert failure_status(_catch(lambda: require_runnable(backend, "cpu"))) == "unavailable"


def test_a_missing_submodule_of_a_dependency_names_the_module(monkeypatch):
    _import_fails_with(monkeypatch, _no_module("triton.tools.tensor_descriptor"))
    with pytest.raises(BackendUnavailable, match="'triton.tools.tensor_descriptor'.*'triton'"):
        require_runnable("fused", "cpu")


@pytest.mark.parametrize("exc", [_no_module("indexer_topk.kernels.gone"), ImportError("cannot import name 'launch'"),
                                 ModuleNotFoundError("no name")])
def test_a_broken_install_stays_a_failure(monkeypatch, exc):
    """Our own module missing, or a name missing from a module, is a bug or a broken install:
    it is raised as it is (a failure), never passed off as "cannot run here"."""
    _import_fails_with(monkeypatch, exc)
    with pytest.raises(type(exc)) as info:
        require_runnable("legacy", "cpu")
    assert info.value is exc and failure_status(info.value) == "error"


def test_the_reference_and_aiter_do_not_import_our_kernels(monkeypatch):
    _import_fails_with(monkeypatch, _no_module("numpy"))
    require_runnable("reference", "cpu")
    require_runnable("aiter", "cpu")


def _catch(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError("no exception")


def test_value_words_keep_an_error_message_short():
    from indexer_topk.errors import value_words

    assert value_words(2**64 - 1) == repr(2**64 - 1) and value_words(10**5000) == "an int of 16610 bits"
    assert value_words("x" * 300) == repr("x" * 300)[:200] + "..." and value_words(True) == "True"
