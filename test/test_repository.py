"""What the checkout tells a user holds: the scripts its documents name exist, the README's make
commands are targets, CI runs the README's test command, and every probe in benchmark/research/
has its line in that folder's README."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = re.compile(r"\bbenchmark/[\w./-]+?\.(?:py|sh)\b")


def _texts():
    """The files that name scripts: documents, session scripts, probes, tests and the package."""
    paths = [REPO / "README.md", REPO / "benchmark" / "results" / "NOTES.md", *REPO.glob("docs/*.md"),
             *REPO.glob("benchmark/*.sh"), *REPO.glob("benchmark/*.py"), *REPO.glob("benchmark/research/*"),
             *REPO.glob("test/*.py"), *REPO.glob("python/indexer_topk/**/*.py")]
    return [p for p in paths if p.is_file()]


def test_every_script_a_document_names_exists():
    missing = {}
    for path in _texts():
        for name in SCRIPT.findall(path.read_text(errors="replace")):
            if not (REPO / name).is_file():
                missing.setdefault(str(path.relative_to(REPO)), set()).add(name)
    assert not missing, missing


def test_every_probe_has_its_line_in_the_research_readme():
    research = REPO / "benchmark" / "research"
    listed = set(re.findall(r"^\| `([\w.]+)` \|", (research / "README.md").read_text(), re.M))
    present = {p.name for p in research.iterdir() if p.suffix in (".py", ".sh")}
    assert listed == present


def _make_targets():
    return set(re.findall(r"^([A-Za-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))


def test_the_readme_make_commands_are_targets():
    readme = (REPO / "README.md").read_text()
    named = set(re.findall(r"`make ([a-z][\w-]*)", readme))
    assert {"demo", "test", "help"} <= named
    assert named <= _make_targets()


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.strip() for line in quick_start.strip().splitlines()]
    assert commands == ["make demo", "make test"]
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-1] == "make test"


def _package_imports() -> dict:
    """Module -> the package's modules it imports anywhere in its source (function level too)."""
    root = REPO / "python" / "indexer_topk"
    mods = {}
    for p in root.rglob("*.py"):
        parts = p.relative_to(root.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph = {}
    for mod, path in mods.items():
        pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = pkg[: len(pkg) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    name = f"{target}.{alias.name}"
                    found.add(name if name in mods else target)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        graph[mod] = {m for m in found if m in mods and m != mod}
    return graph


def test_no_two_backend_modules_import_each_other():
    """The fused backend calls the Hopper stream's launcher; the stream's module imports nothing
    of the fused backend's, not even inside a function."""
    graph = _package_imports()
    backends = [m for m in graph if m.startswith("indexer_topk.backends.")]
    assert "indexer_topk.backends.hopper" in graph["indexer_topk.backends.fused"]
    assert [(a, b) for a in backends for b in graph[a] if a in graph.get(b, ())] == []
