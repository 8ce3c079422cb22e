"""Backends behind :func:`indexer_topk.indexer_topk`, one module each, all with one signature::

    fn(args, *, topk, layout, weight_scale, out, workspace) -> IndexerTopKResult

where ``args = (q, q_scale, k_cache, k_scale, weights, page_table, seq_lens)`` has already been
validated. Modules are imported on first use only (``api._backend_fn``), so importing the
package never imports Triton kernels or vendor libraries.
"""
