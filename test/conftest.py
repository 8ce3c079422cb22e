"""Test setup: without a GPU, Triton kernels run under the interpreter.

``TRITON_INTERPRET`` must be set before any kernel module imports triton, so it is set here,
at collection time. GPU-only tests carry the ``gpu`` marker and are skipped without a device.
A run prints a line per test file as its last test finishes (``make test`` runs the files in
several processes, where pytest's own progress names no file).
"""

import os
import time
from collections import Counter

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One test process per core (make test): a second thread per process only spins against the
    # other process, which more than doubled the suite's CPU time on two cores.
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import pytest  # noqa: E402
import torch  # noqa: E402

_threads = os.environ.get("OMP_NUM_THREADS", "")
if os.environ.get("PYTEST_XDIST_WORKER") and _threads.isdigit() and int(_threads) > 0:
    torch.set_num_threads(int(_threads))

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_GPU else "cpu"


class FileProgress:
    """One line per test file when its last test is done: where a long run is, and how far."""

    def __init__(self, config):
        self.config = config
        self.start = time.monotonic()
        self.total = None
        self.done = Counter()
        self.failed = set()

    def _expect(self, nodeids):
        if self.total is None and nodeids:
            self.total = Counter(n.split("::")[0] for n in nodeids)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self._expect(ids)  # every worker collects the same tests: the first list is the list

    def pytest_collection_finish(self, session):
        self._expect([item.nodeid for item in session.items])  # one process, no workers

    def pytest_runtest_logreport(self, report):
        path = report.nodeid.split("::")[0]
        if report.failed:
            self.failed.add(report.nodeid)
        if report.when != "teardown" or not self.total:
            return
        self.done[path] += 1
        if self.done[path] != self.total[path]:
            return
        minutes, seconds = divmod(int(time.monotonic() - self.start), 60)
        failed = sum(1 for n in self.failed if n.split("::")[0] == path)
        finished = sum(1 for p, n in self.total.items() if self.done[p] == n)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        if reporter._tw.width_of_current_line:  # after pytest's dots
            reporter._tw.line()
        n = self.total[path]
        reporter.write_line(f"[{finished}/{len(self.total)} files, {minutes}m{seconds:02d}s] {path}: "
                            f"{n} test{'s' * (n != 1)}" + (f", {failed} failed" if failed else ""))


def pytest_configure(config):
    # Where pytest's own progress names no file: with -q, and with pytest-xdist (in its controller;
    # a worker's output is not shown).
    quiet = config.option.verbose < 0 or getattr(config.option, "numprocesses", None)
    if quiet and not hasattr(config, "workerinput"):
        config.pluginmanager.register(FileProgress(config), "file-progress")


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a GPU (marker gpu); run on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def leaves_no_fake_installed():
    """After every test (and its monkeypatches), no fake AITER installation is left behind
    (see test/fake_aiter)."""
    yield
    import fake_aiter

    assert fake_aiter.leftovers() == []


@pytest.fixture(autouse=True)
def env_warnings_start_afresh():
    """An unreadable environment value warns once per process; each test starts with none
    warned about, so its own reads warn as in a fresh process."""
    from indexer_topk import envs as envs_module

    envs_module._WARNED.clear()
    yield
