# Two entry points: `make demo` (the main job) and `make test` (the CPU test suite).
# Both create .venv on first use with CPU PyTorch and Triton (kernels run under the Triton
# interpreter when no GPU is present).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
TRITON_SPEC ?= triton==3.9.0

.PHONY: demo test test-gpu bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH_SPEC)" "$(TRITON_SPEC)"
	$(BIN)/pip install --quiet -e ".[test,bench]"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/indexer-topk demo

test: $(VENV)/.installed
	$(BIN)/python -m pytest -m "not gpu" -q

# On a GPU machine with torch and triton already installed: PYTHONPATH=python python3 -m pytest -m gpu
test-gpu:
	PYTHONPATH=python $(PYTHON) -m pytest -m gpu -q

bench:
	PYTHONPATH=python $(PYTHON) benchmark/bench_indexer_topk.py

clean:
	rm -rf $(VENV) build *.egg-info python/*.egg-info
