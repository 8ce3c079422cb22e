#!/usr/bin/env bash
# One device call without the anchor kit: overlap_probe.py (legacy's score and select over chunks of
# rows on two streams, against the same chunks on one), the row select with and without its sort
# (row_select.py: the 64- and 32-bit networks against rows left in ascending positions), the
# gathering's programs at 65-127 one-row requests of 128K (split_decode.py, 16 programs an SM up
# to 127 rows against the shipped 64), then Nsight Compute on the sglang_mxfp4 decode step at
# 8 x 768K with the score kernel's stalls by source line (ncu_decode.sh). Each step under its own
# limit; logs under $OUT, the probe's table last.
#
#   bash benchmark/research/overlap_round.sh
#
# PROBE_S, SORT_S, SPLIT_S, NCU_S: the steps' limits in seconds (0 skips a step; the probe's compiles are
# cold on a fresh machine, and it writes its JSON as it goes); PROBE_ARGS: overlap_probe.py's options.
set -u
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
OUT=${OUT:-/tmp/overlap_round}
mkdir -p "$OUT" "$TRITON_CACHE_DIR"
PROBE_S=${PROBE_S:-300} SORT_S=${SORT_S:-100} SPLIT_S=${SPLIT_S:-120} NCU_S=${NCU_S:-80}
# step NAME LIMIT LOG LINES COMMAND...: COMMAND under LIMIT seconds (0 skips it), its output in
# $OUT/LOG, then the log's last LINES lines
step() {
  local name=$1 limit=$2 log=$3 lines=$4
  shift 4
  if [ "$limit" = 0 ]; then
    echo "== $name skipped"
    return
  fi
  timeout -k 10 "$limit" "$@" > "$OUT/$log" 2>&1
  echo "== $name rc $?"
  [ "$lines" = 0 ] || tail -n "$lines" "$OUT/$log"
}
# shellcheck disable=SC2086
step "overlap probe" "$PROBE_S" overlap_probe.log 0 \
  python3 benchmark/research/overlap_probe.py --out "$OUT/overlap_probe.json" ${PROBE_ARGS:-}
step "row select's sort" "$SORT_S" row_sort.log 6 \
  python3 benchmark/research/row_select.py --ways rows --patterns random \
  --configs 4096:8:2:128:64,4096:8:2:128:32,4096:8:2:128:pos --shapes 128x4096,1024x4096,8192x4096,1024x16384 \
  --json "$OUT/row_sort.json"
step "gathering programs" "$SPLIT_S" programs_127.log 12 \
  python3 benchmark/research/split_decode.py --seed 0 --page-table-pad 0 --iters 30 --cold \
  --configs "SPLIT_MORE_PROGRAMS_ROWS=127" --shapes 65x128K,96x128K,127x128K --out "$OUT/programs_127.json"
# ncu_decode.sh limits each of its two profiles to NCU_S; the step's limit leaves room for both
step "ncu" "$(( NCU_S ? 2 * NCU_S + 30 : 0 ))" ncu_mxfp4.log 0 \
  env SHAPES=8x768K LAYOUT=sglang_mxfp4 SOURCE_KERNEL=logits_kernel SOURCE_MODULE=python/indexer_topk/kernels/score.py \
  NCU_S="$NCU_S" OUT="$OUT" bash benchmark/research/ncu_decode.sh
[ "$NCU_S" = 0 ] || grep -E "^== |Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued" \
  "$OUT/ncu_mxfp4.log" | head -24
grep -E "two streams / one" "$OUT/overlap_probe.log" 2>/dev/null
sed -n '/^| shape/,$p' "$OUT/overlap_probe.log" 2>/dev/null
