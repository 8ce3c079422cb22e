#!/usr/bin/env bash
# One device call: Nsight Compute on legacy's decode step at few requests, where it is twice
# SGLang's (benchmark/results/NOTES.md, next steps): each kernel's duration, throughput,
# occupancy and warp states (score, gate, gathering, finish), then where the finishing kernel's
# warps stall by source line (research/ncu_source_summary.py, regions: its module's functions).
#
#   SHAPES="1x128K 8x768K" bash benchmark/research/ncu_decode.sh        (logs under $OUT)
set -u
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
OUT=${OUT:-/tmp/ncu_decode}
mkdir -p "$OUT" "$TRITON_CACHE_DIR"
KERNELS='regex:logits_kernel|gate_rows_kernel|gather_rows_kernel|finish_rows_kernel'
# the finish is one launch of 10-16 us on one SM: at the default interval its source view took
# 14 warp samples (dfb760c), so sample every 2^5 cycles where this ncu has the option
# (the option is --warp-sampling-interval in current releases, --sampling-interval before)
SAMPLING=""
NCU_HELP=$(ncu --help 2>/dev/null)
if grep -q -- "--warp-sampling-interval" <<< "$NCU_HELP"; then SAMPLING="--warp-sampling-interval 0"
elif grep -qE -- "(^|[[:space:]])--sampling-interval" <<< "$NCU_HELP"; then SAMPLING="--sampling-interval 0"; fi
for shape in ${SHAPES:-1x128K 8x768K}; do
  # the first step compiles (outside the profile: four launches skipped); the second is measured
  timeout -k 10 "${NCU_S:-80}" ncu --clock-control none -k "$KERNELS" --launch-skip 4 --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    python3 benchmark/research/ncu_decode.py --shape "$shape" > "$OUT/ncu_decode_$shape.txt" 2>&1
  echo "== $shape rc $?"
  grep -E "^  [a-z_]+_kernel|Duration|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued" \
    "$OUT/ncu_decode_$shape.txt" | head -40
  # shellcheck disable=SC2086
  timeout -k 10 "${NCU_S:-80}" ncu --clock-control none -k regex:finish_rows_kernel --launch-skip 1 --launch-count 1 \
    $SAMPLING --section WarpStateStats --section SourceCounters --import-source yes -f -o "$OUT/finish_src_$shape" \
    python3 benchmark/research/ncu_decode.py --shape "$shape" > /dev/null 2>&1 \
    && ncu -i "$OUT/finish_src_$shape.ncu-rep" --page source --csv --print-source cuda,sass > "$OUT/finish_src.csv" \
    && python3 benchmark/research/ncu_source_summary.py "$OUT/finish_src.csv" \
         --regions python/indexer_topk/kernels/split_topk.py > "$OUT/ncu_finish_source_$shape.txt" \
    && head -30 "$OUT/ncu_finish_source_$shape.txt"
  echo "== $shape source rc $?"
  rm -f "$OUT/finish_src_$shape.ncu-rep" "$OUT/finish_src.csv"
done
