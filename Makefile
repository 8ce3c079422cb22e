# `make demo` (the main job) and `make test` (the CPU test suite); `make help` lists every target.
#
# The first run of either creates .venv (1-2 minutes, once): CPU PyTorch from PyTorch's CPU
# wheel index, Triton (its interpreter runs the kernels without a GPU) and this package,
# editable. ARGS passes options on, e.g.
#   make demo ARGS="--layout sglang_mxfp4 --context 8K"
#   make test ARGS="test/test_cli.py -x"
# and .venv/bin/indexer-topk runs any command (info, check, ...) from this checkout.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
TRITON_SPEC ?= triton==3.9.0
# The default index's Linux x86_64 torch is the CUDA build (several GB with its CUDA
# libraries); this index serves the CPU build. Without it, the default index is the fallback.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# Test processes side by side (pytest-xdist): one per core, at most 8.
JOBS ?= $(shell n=$$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2); [ "$$n" -gt 8 ] && n=8; echo $$n)
ARGS ?=

# .venv's python where make created one; else $(PYTHON) (a GPU machine with torch and triton
# installed, and no .venv).
RUN_PYTHON = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))

# The stamp is named for what it installed (pyproject.toml's content and the pinned versions), so a
# pyproject.toml touched without a change installs nothing, and a changed one updates .venv quietly.
STAMP := $(VENV)/.installed-$(shell { cat pyproject.toml; echo "$(TORCH_SPEC) $(TRITON_SPEC)"; } | cksum | cut -d' ' -f1)

.PHONY: help demo test test-gpu bench clean

help:
	@echo "make demo      the demo: a DSv4-shaped batch through every path, side by side (ARGS=\"--help\" for options)"
	@echo "make test      the CPU test suite, $(JOBS) processes side by side (ARGS: pytest options and files)"
	@echo "make test-gpu  the GPU tests (marker gpu), on a machine with a GPU"
	@echo "make bench     the GPU benchmark grid (ARGS=\"--help\" for options)"
	@echo "make clean     remove $(VENV) and build outputs"
	@echo "demo and test create $(VENV) on their first run (CPU PyTorch, Triton, this package, editable);"
	@echo "test-gpu and bench use $(VENV)'s python where it exists, else $(PYTHON)."

$(STAMP):
	@if [ -x $(BIN)/python ]; then \
	  echo "==> pyproject.toml or the pinned versions differ from what $(VENV) has: updating it"; \
	  $(MAKE) --no-print-directory _install Q=-q; \
	else \
	  echo "==> First run: creating $(VENV) with CPU PyTorch, Triton and indexer-topk (1-2 minutes, once)"; \
	  $(PYTHON) -m venv $(VENV) && $(MAKE) --no-print-directory _install STEP=1 && \
	  echo "==> $(VENV) is ready; $(BIN)/indexer-topk runs the command line from this checkout"; \
	fi
	@rm -f $(VENV)/.installed $(VENV)/.installed-*
	@touch $@

# The three installs; STEP=1 prints each step, Q=-q keeps pip quiet (an update of an existing .venv).
.PHONY: _install
_install:
	@[ -z "$(STEP)" ] || echo "==> [1/3] $(TORCH_SPEC), CPU build, from $(TORCH_CPU_INDEX)"
	@$(BIN)/pip install $(Q) --retries 0 --index-url $(TORCH_CPU_INDEX) "$(TORCH_SPEC)" || { \
	  echo "==> $(TORCH_CPU_INDEX) did not serve $(TORCH_SPEC); installing it from the default index" \
	       "(on Linux x86_64 that is the CUDA build, several GB)"; \
	  $(BIN)/pip install $(Q) "$(TORCH_SPEC)"; }
	@[ -z "$(STEP)" ] || echo "==> [2/3] $(TRITON_SPEC)"
	@$(BIN)/pip install $(Q) "$(TRITON_SPEC)"
	@[ -z "$(STEP)" ] || echo "==> [3/3] indexer-topk (editable) with its test and benchmark extras"
	@$(BIN)/pip install $(Q) -e ".[test,bench]"

demo: $(STAMP)
	@echo "==> demo: without a GPU, a small batch under the Triton interpreter (5-30 s)"
	$(BIN)/indexer-topk demo $(ARGS)

test: $(STAMP)
	@echo "==> CPU test suite in $(JOBS) processes: about 40 minutes on two cores, more on a busy"
	@echo "    machine; a line per test file as it completes (kernels run under the Triton interpreter;"
	@echo "    the first run also downloads SGLang's release to test the plugin on SGLang's own code)"
	$(BIN)/python -m pytest -m "not gpu" -q -n $(JOBS) $(ARGS)

# On a GPU machine with torch and triton already installed (see the README): GPU tests and benchmark.
test-gpu:
	PYTHONPATH=python $(RUN_PYTHON) -m pytest -m gpu -q $(ARGS)

bench:
	PYTHONPATH=python $(RUN_PYTHON) benchmark/bench_indexer_topk.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info python/*.egg-info
