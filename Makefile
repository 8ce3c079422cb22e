# Two entry points: `make demo` (the main job) and `make test` (the CPU test suite).
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
ARGS ?=

.PHONY: demo test test-gpu bench clean

$(VENV)/.installed: pyproject.toml
	@echo "==> First run: creating $(VENV) with CPU PyTorch, Triton and indexer-topk (1-2 minutes, once)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> [1/3] $(TORCH_SPEC), CPU build, from $(TORCH_CPU_INDEX)"
	@$(BIN)/pip install --retries 0 --index-url $(TORCH_CPU_INDEX) "$(TORCH_SPEC)" || { \
	  echo "==> $(TORCH_CPU_INDEX) did not serve $(TORCH_SPEC); installing it from the default index" \
	       "(on Linux x86_64 that is the CUDA build, several GB)"; \
	  $(BIN)/pip install "$(TORCH_SPEC)"; }
	@echo "==> [2/3] $(TRITON_SPEC)"
	$(BIN)/pip install "$(TRITON_SPEC)"
	@echo "==> [3/3] indexer-topk (editable) with its test and benchmark extras"
	$(BIN)/pip install -e ".[test,bench]"
	@touch $@
	@echo "==> $(VENV) is ready; $(BIN)/indexer-topk runs the command line from this checkout"

demo: $(VENV)/.installed
	@echo "==> demo: without a GPU, a small batch under the Triton interpreter (5-30 s)"
	$(BIN)/indexer-topk demo $(ARGS)

test: $(VENV)/.installed
	@echo "==> CPU test suite: about 7 minutes on two idle cores, more on a busy machine"
	@echo "    (kernels run under the Triton interpreter; the first run also downloads SGLang's"
	@echo "    release to test the plugin on SGLang's own code)"
	$(BIN)/python -m pytest -m "not gpu" -q $(ARGS)

# On a GPU machine with torch and triton already installed (see the README): GPU tests and benchmark.
test-gpu:
	PYTHONPATH=python $(PYTHON) -m pytest -m gpu -q $(ARGS)

bench:
	PYTHONPATH=python $(PYTHON) benchmark/bench_indexer_topk.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info python/*.egg-info
