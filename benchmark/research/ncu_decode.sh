#!/usr/bin/env bash
# One device call: Nsight Compute on legacy's decode step at few requests, where it is twice
# SGLang's (benchmark/results/NOTES.md, next steps): each kernel's duration, throughput,
# occupancy and warp states (score, gate, gathering, finish), then where the finishing kernel's
# warps stall by source line (research/ncu_source_summary.py, regions: its module's functions).
#
#   SHAPES="1x128K 8x768K" bash benchmark/research/ncu_decode.sh        (logs under $OUT)
#
# LAYOUT: the cache layout (sglang_fp8); SOURCE_KERNEL and SOURCE_MODULE: the kernel whose warp
# stalls are summed by source line and the module whose functions are the regions (the finishing
# kernel and kernels/split_topk.py; logits_kernel and kernels/score.py for the score tile).
# KIND=prefill (SHAPES as 1x16Kx128: one request's last 128 rows) with KERNELS and LAUNCHES (the
# kernels a call launches, e.g. 'regex:logits_kernel|topk_rows_kernel' and 2) profiles prefill calls.
set -u
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
OUT=${OUT:-/tmp/ncu_decode}
mkdir -p "$OUT" "$TRITON_CACHE_DIR"
LAYOUT=${LAYOUT:-sglang_fp8}
SOURCE_KERNEL=${SOURCE_KERNEL:-finish_rows_kernel}
SOURCE_MODULE=${SOURCE_MODULE:-python/indexer_topk/kernels/split_topk.py}
# a decode step's four kernels either way: with the gate ahead of the score kernel (FP8 from one
# request of 128K: score_sample, gate_rows, gather_logits, finish_rows) or after it (logits,
# gate_rows, gather_rows, finish_rows); "logits_kernel" matches gather_logits_kernel too
KERNELS=${KERNELS:-'regex:logits_kernel|gate_rows_kernel|gather_rows_kernel|finish_rows_kernel|score_sample_kernel'}
LAUNCHES=${LAUNCHES:-4}
KIND=${KIND:-decode}
source benchmark/research/ncu_source.sh  # SAMPLING, source_view
for shape in ${SHAPES:-1x128K 8x768K}; do
  # the first call compiles (outside the profile: its launches skipped); the second is measured
  timeout -k 10 "${NCU_S:-80}" ncu --clock-control none -k "$KERNELS" --launch-skip "$LAUNCHES" \
    --launch-count "$LAUNCHES" --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats \
    python3 benchmark/research/ncu_decode.py --shape "$shape" --layout "$LAYOUT" --kind "$KIND" \
    > "$OUT/ncu_decode_${LAYOUT}_$shape.txt" 2>&1
  echo "== $shape rc $?"
  grep -E "^  [a-z_]+_kernel|Duration|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued" \
    "$OUT/ncu_decode_${LAYOUT}_$shape.txt" | head -40
  NCU_S=${NCU_S:-80} source_view "$SOURCE_KERNEL" 1 "$SOURCE_MODULE" \
    "$OUT/ncu_${SOURCE_KERNEL}_${LAYOUT}_$shape.txt" python3 benchmark/research/ncu_decode.py --shape "$shape" \
    --layout "$LAYOUT" --kind "$KIND"
  echo "== $shape source rc $?"
done
