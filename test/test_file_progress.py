"""conftest's FileProgress: a line per test file when its last test is done, under pytest-xdist."""

from types import SimpleNamespace

from conftest import FileProgress


class Reporter:
    def __init__(self):
        self.lines = []
        self._tw = SimpleNamespace(width_of_current_line=0, line=lambda: self.lines.append(""))

    def write_line(self, line):
        self.lines.append(line)


def progress():
    reporter = Reporter()
    config = SimpleNamespace(pluginmanager=SimpleNamespace(get_plugin=lambda name: reporter))
    return FileProgress(config), reporter


def report(nodeid, when, failed=False):
    return SimpleNamespace(nodeid=nodeid, when=when, failed=failed)


def run(fp, nodeid, failed_in=None):
    for when in ("setup", "call", "teardown"):
        fp.pytest_runtest_logreport(report(nodeid, when, failed=when == failed_in))


def test_a_line_when_each_file_is_done_in_any_order():
    fp, reporter = progress()
    ids = ["test/a.py::x", "test/a.py::y", "test/b.py::z"]
    fp.pytest_xdist_node_collection_finished(node=None, ids=ids)
    fp.pytest_xdist_node_collection_finished(node=None, ids=ids[:1])  # a second worker: same tests
    run(fp, "test/a.py::x")
    assert reporter.lines == []
    run(fp, "test/b.py::z", failed_in="call")
    run(fp, "test/a.py::y")
    lines = [line for line in reporter.lines if line]
    assert len(lines) == 2
    assert lines[0].startswith("[1/2 files, ") and lines[0].endswith("test/b.py: 1 test, 1 failed")
    assert lines[1].startswith("[2/2 files, ") and lines[1].endswith("test/a.py: 2 tests")


def test_one_process_counts_from_its_own_collection():
    fp, reporter = progress()
    fp.pytest_collection_finish(SimpleNamespace(items=[SimpleNamespace(nodeid="test/c.py::t[1]")]))
    run(fp, "test/c.py::t[1]", failed_in="setup")
    assert reporter.lines[-1].endswith("test/c.py: 1 test, 1 failed")


def test_nothing_collected_prints_nothing():
    fp, reporter = progress()
    fp.pytest_collection_finish(SimpleNamespace(items=[]))
    run(fp, "test/d.py::t")
    assert reporter.lines == []
