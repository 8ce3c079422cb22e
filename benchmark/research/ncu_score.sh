#!/usr/bin/env bash
# One device call: Nsight Compute on legacy's score kernel at prefill shapes (score_rows.py
# --once: the shipped tile, or TILE), where it runs at 783 TFLOP/s at 8192 x 16K against about 880
# at 768K (benchmark/results/NOTES.md, "Wider score tiles"): duration, throughput, occupancy, warp
# states and instructions, then where its warps stall by source line (research/ncu_source_summary.py,
# regions: score.py's functions).
#
#   SHAPES="8192x16K 8192x64K" [TILE=2:4:3] bash benchmark/research/ncu_score.sh   (logs under $OUT)
set -u
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
OUT=${OUT:-/tmp/ncu_score}
mkdir -p "$OUT" "$TRITON_CACHE_DIR"
NCU_INTERVAL=${NCU_INTERVAL:-2} source benchmark/research/ncu_source.sh  # SAMPLING, source_view
for shape in ${SHAPES:-8192x16K}; do
  args=(--once --shapes "$shape" --tiles "${TILE:-2:4:3}")
  NCU_SECTIONS=MemoryWorkloadAnalysis summary_view logits_kernel 1 "$OUT/ncu_score_$shape.txt" \
    python3 benchmark/research/score_rows.py "${args[@]}"
  source_view logits_kernel 1 python/indexer_topk/kernels/score.py "$OUT/ncu_score_source_$shape.txt" \
    python3 benchmark/research/score_rows.py "${args[@]}"
  echo "== $shape source rc $?"
done
