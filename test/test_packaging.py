"""What ``pip install`` of this checkout declares is what the package imports.

A clean environment holds only what is declared (and what that requires in turn): a module the
CPU path imports that nothing declares works here, where it happens to be installed, and fails
with ``ModuleNotFoundError`` after ``pip install -e ".[triton]"`` on CPU torch.
"""

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# A fused call under the interpreter (the CPU path of `indexer-topk demo`) and the command line:
# the top-level modules they leave imported.
_PROBE = """
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import indexer_topk as it
import indexer_topk.cli
w = it.make_workload("sglang_fp8", context_tokens=[256], rows_per_request=[2], topk=512)
it.indexer_topk(*w.args(), topk=512, layout="sglang_fp8", weight_scale=w.weight_scale, backend="fused")
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names))))
"""


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)).lower()


def _declared_closure(requirements):
    """Distribution names the requirements bring, with what the installed ones require in turn
    (extras of theirs left out)."""
    seen, todo = set(), [_name(r) for r in requirements]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [_name(r) for r in reqs if not re.search(r"\bextra\s*==", r)]
    return seen


def test_the_cpu_path_imports_only_declared_distributions():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = _declared_closure(project["dependencies"] + project["optional-dependencies"]["triton"])

    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    p = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    owners = md.packages_distributions()
    undeclared = {}
    for module in json.loads(p.stdout.splitlines()[-1]):
        dists = {_name(d) for d in owners.get(module, [])} - {"indexer-topk"}
        if dists and not dists & declared:
            undeclared[module] = sorted(dists)
    assert not undeclared, f"imported but not declared in pyproject.toml (nor required by what is): {undeclared}"
