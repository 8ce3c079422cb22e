#!/usr/bin/env bash
# One device call: the decode settings that wait on a device, each an A/B against the shipped
# step in one process (split_decode.py: graph replays on the serving mix's bytes, device time per
# kernel, digests), each under its own time limit, in order of what they decide; logs under
# $OUT, a table last. Each config compiles its own kernels (20-30 s each, less with a carried
# .carry/tcache.tgz).
#
# 1. The one-row span floor (shipped 256) against 512, and the finish's 8 warps, at 1 and 8 x 128K.
# 2. The finish's bins at topk 2048 (shipped: topk bins) against a quarter of them, at 8 x 768K.
# 3. A gate sample of 1,024 and 512 keys, and the gate ahead's gate with 8 warps.
# 4. A spread of 1.5 * topk at topk 1024, where a row near the bins' limit is likeliest
#    (64 and 256 x 128K). Steps 2 and 4 then again with --profile: how each row finished.
#
#   bash benchmark/research/decode_ab_round.sh                  (logs under $OUT)
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
mkdir -p "$TRITON_CACHE_DIR"; [ -f .carry/tcache.tgz ] && tar xzf .carry/tcache.tgz -C "$TRITON_CACHE_DIR"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
SD="python3 benchmark/research/split_decode.py --seed 0 --page-table-pad 0 --iters 50"

ab() {  # ab NAME LIMIT_S ARGS...: one split_decode.py run
  local name=$1 limit=$2
  shift 2
  timeout "$limit" $SD "$@" --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "== $name rc $? at ${SECONDS}s"
}

ab span 130 --shapes 1x128K,8x128K --configs "SCORE_MIN_SPAN_ONE_ROW=512;SPLIT_WARPS=8"
ab spread2048 90 --shapes 8x768K --topk 2048 --configs "SPLIT_SPREAD_HALVES=0"
ab spread2048_rows 50 --shapes 8x768K --topk 2048 --configs "SPLIT_SPREAD_HALVES=0" --profile
ab sample 150 --shapes 1x128K,8x128K,1x768K,8x768K \
  --configs "SPLIT_SAMPLE=1024;SPLIT_SAMPLE=512;SCORED_GATE_WARPS=8"
ab spread1024 100 --shapes 64x128K,256x128K --configs "SPLIT_SPREAD_HALVES=3"
ab spread1024_rows 50 --shapes 64x128K,256x128K --configs "SPLIT_SPREAD_HALVES=3" --profile

echo "== table (graph ms and kernels; then each row's way of finishing: bins, search, trimmed)"
for f in span spread2048 sample spread1024; do
  [ -f "$OUT/$f.log" ] && { echo "-- $f"; sed -n '/^pattern /,$p' "$OUT/$f.log"; }
done
for f in spread2048_rows spread1024_rows; do
  [ -f "$OUT/$f.log" ] && { echo "-- $f"; grep -E " rows +[0-9]+ bins" "$OUT/$f.log" | cut -c1-90 | sort -u; }
done
exit 0
