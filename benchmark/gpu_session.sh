#!/usr/bin/env bash
# One GPU session's measurements (an H200; about 11 minutes in all, so two device calls):
#   [STEPS=123] bash benchmark/gpu_session.sh [DIR]   # writes under DIR (default /tmp/session), then
#                                                     # DIR.tgz into $OUT when set
# STEPS names the steps to run (default all: 12345; e.g. STEPS=123, then STEPS=45).
# 1. compile every kernel the later steps use, one process per (layout, topk), side by side;
# 2. the benchmark grid: three layouts at 64K and 768K tokens, 1024 rows, topk 1024, the
#    increasing-score pattern at 768K, and 8192 rows at 768K (a chunked-prefill step);
# 3. the 1,000-call stress run (time-capped);
# 4. GPU tests of the fused path against legacy (on sm_90 the FP8 ones run the Hopper stream);
# 5. Nsight Compute on the fused backend's kernel at the reference shape, FP8 (on sm_90 the Hopper
#    stream, hopper_stream_kernel; sections, then stalls by source line);
# 6. (only when STEPS names it) decode batches, legacy against fused, each replayed from a CUDA
#    graph: 8 x 768K, 64 x 768K and 256 x 128K, three layouts (benchmark/decode_bench.py).
# Each step has its own time limit; a step past it is stopped and the next one runs.
set -u
DIR=${1:-/tmp/session}
mkdir -p "$DIR"
finish() { [ -n "${OUT:-}" ] && tar czf "$OUT/session.tgz" -C "$(dirname "$DIR")" "$(basename "$DIR")"; }
trap finish EXIT
export PYTHONPATH=python PYTHONUNBUFFERED=1
T0=$(date +%s)
step() { echo; echo "##### [$(( $(date +%s) - T0 ))s] $*"; }
want() { case "${STEPS:-12345}" in *"$1"*) return 0 ;; *) return 1 ;; esac; }
KERNELS='regex:fused_topk_kernel|hopper_stream_kernel'

if want 1; then
step "1 compile"
for layout in sglang_fp8 sglang_mxfp4 aiter_mxfp4; do
  for topk in 512 1024; do
    timeout 150 python3 benchmark/research/warm_kernels.py --layout $layout --topk $topk > "$DIR/warm_${layout}_${topk}.log" 2>&1 &
  done
done
wait
tail -qn1 "$DIR"/warm_*.log
fi

if want 2; then
step "2 grid"
timeout 110 python3 benchmark/bench_indexer_topk.py --layouts sglang_fp8,sglang_mxfp4,aiter_mxfp4 --contexts 64K,768K \
  --rows 1024 --topk 1024 --extra-patterns increasing --warmup 2 --iters 6 --out-dir "$DIR" 2>&1 | tail -25
mkdir -p "$DIR/r8192"
timeout 70 python3 benchmark/bench_indexer_topk.py --layouts sglang_fp8,sglang_mxfp4,aiter_mxfp4 --contexts 768K \
  --rows 8192 --topk 1024 --extra-patterns none --warmup 1 --iters 3 --out-dir "$DIR/r8192" 2>&1 | tail -8
fi

if want 3; then
step "3 stress"
timeout 125 python3 benchmark/stress.py --calls 1000 --minutes 1.8 --out "$DIR" 2>&1 | tail -15
fi

if want 4; then
step "4 GPU tests"
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider test/test_hopper_stream.py test/test_fused.py \
  -k "stream or mixed_groups or empty_rows or 4097" 2>&1 | tee "$DIR/gpu_tests.log" | tail -5
fi

if want 5; then
step "5 ncu"
timeout 60 ncu --clock-control none -k "$KERNELS" --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section WarpStateStats \
  python3 benchmark/research/ncu_fused.py > "$DIR/ncu_fused.txt" 2>&1
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issue Slots Busy|Warp Cycles Per Issued|Block Limit" "$DIR/ncu_fused.txt" | head -20
# where the warps stall, by source line and region (the exported source page is large: summarised here)
timeout 90 ncu --clock-control none -k "$KERNELS" --launch-skip 1 --launch-count 1 \
  --section WarpStateStats --section SourceCounters --import-source yes -o "$DIR/fused_src" \
  python3 benchmark/research/ncu_fused.py > /dev/null 2>&1 \
  && ncu -i "$DIR/fused_src.ncu-rep" --page source --csv --print-source cuda,sass > "$DIR/fused_src.csv" \
  && python3 benchmark/research/ncu_source_summary.py "$DIR/fused_src.csv" > "$DIR/ncu_fused_source.txt" \
  && head -14 "$DIR/ncu_fused_source.txt"
rm -f "$DIR/fused_src.ncu-rep" "$DIR/fused_src.csv"
fi
if [ -n "${STEPS:-}" ] && want 6; then
step "6 decode"
timeout 240 python3 benchmark/decode_bench.py --out-dir "$DIR" 2>&1 | tee "$DIR/decode.log" | tail -12
fi
step "done"
