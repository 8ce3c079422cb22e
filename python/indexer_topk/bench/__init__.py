"""Benchmark harness: time, peak memory, effective TFLOP/s and agreement of the backends.

The GPU benchmark (``benchmark/bench_indexer_topk.py``, ``indexer-topk bench``) sweeps
layouts x raw context (64K-1M tokens) x prefill rows x ``topk``. Each case is one request
whose chunk of ``rows`` query tokens sits at the end of the context, so every row scores
about ``context / 4`` C4 positions; every backend runs on the same inputs.

Measurement rules (also written into every JSON record and the markdown header):

* time: median of per-call CUDA-event timings after warm-up calls, with the outputs and the
  fused workspace preallocated and ``check_values=False`` (no host syncs inside the call);
* peak memory: ``torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats();
  base = torch.cuda.memory_allocated()``, one call, ``(max_memory_allocated() - base) / 2**20``
  -- what the call allocates above its inputs, outputs and workspace (for the legacy path:
  the FP32 score matrix and the top-k scratch);
* effective TFLOP/s: ``2 * rows * c4_len * 64 * 128 / time`` (``c4_len`` the longest row's);
* agreement: ``matches_legacy`` is :func:`indexer_topk.compare.bitwise_equal` against the
  legacy backend's outputs on the same inputs.

One module per reason to change:

``timing``       the clocks: per-call times, medians, peak memory, TFLOP/s, and their rules
``environment``  the fields every record carries about the machine and the versions
``runs``         one backend on one workload -> one record (also the CLI's ``demo``)
``grid``         the cases of a sweep and running them
``report``       JSON, markdown, the plot and the console table
``cli``          the benchmark's command line
"""
