#!/usr/bin/env bash
# One device call: Nsight Compute on the legacy row select (the select stage of prefill chunks of
# 128 rows and more, and of decode batches of 256), where SGLang's topk_v2 is 5-7x faster
# (benchmark/results/NOTES.md): its duration, throughput, occupancy and warp states, then where
# its warps stall by source line (research/ncu_source_summary.py, regions: row_topk.py's
# functions; select.py's lines, the sorting network's, are listed by file).
#
#   SHAPES="8192x4096 1024x16384" [ORDER=position] [BINS="0 32"] bash benchmark/research/ncu_rows.sh   (logs under $OUT)
set -u
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
OUT=${OUT:-/tmp/ncu_rows}
mkdir -p "$OUT" "$TRITON_CACHE_DIR"
NCU_INTERVAL=${NCU_INTERVAL:-2} source benchmark/research/ncu_source.sh  # SAMPLING, source_view
for shape in ${SHAPES:-8192x4096}; do
  for bins in ${BINS:-default}; do
    args=(--shape "$shape" --order "${ORDER:-score}")
    [ "$bins" != default ] && args+=(--bins "$bins")
    tag=${shape}_b$bins
    summary_view topk_rows_kernel 1 "$OUT/ncu_rows_$tag.txt" python3 benchmark/research/ncu_rows.py "${args[@]}"
    source_view topk_rows_kernel 1 python/indexer_topk/kernels/row_topk.py "$OUT/ncu_rows_source_$tag.txt" \
      python3 benchmark/research/ncu_rows.py "${args[@]}"
    echo "== $tag source rc $?"
  done
done
