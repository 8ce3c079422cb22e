#!/usr/bin/env bash
# One device call for the row select's warps by rows (ROWS_FEW_WARPS) and the finish's warps at
# one to four requests, each step under a limit of its own and all of them under TOTAL_S; logs
# under $OUT, a short table last:
# 1. the row select alone at 128-256 rows: the package's rule ("auto": 16 warps a row up to the
#    SMs) against one config at every row count (8 warps, two programs an SM), RUNS times;
# 2. the row select's GPU tests (test_row_topk.py: 130-row matrices take the 16 warps, 264-row
#    ones the 8);
# 3. the split finish's 8 warps (SPLIT_WARPS=8) at one to four requests of 128K and one of 768K.
#
#   bash benchmark/research/row_warps_round.sh
# shellcheck source=benchmark/research/round_env.sh
source "$(dirname "$0")/round_env.sh"
for run in $(seq 1 "${RUNS:-2}"); do
  [ "$(left)" -lt 40 ] && break
  timeout "$(limit "${ROWS_S:-100}")" python3 benchmark/research/row_select.py \
    --shapes "${SHAPES:-128x4096,132x4096,128x16384,256x4096}" --patterns random,increasing --ways auto,rows \
    --configs 4096:8:2:128 --iters 50 > "$OUT/row_warps_$run.log" 2>&1
  echo "== row select, run $run rc $? at ${SECONDS}s"
done
if [ "$(left)" -gt 40 ]; then
  timeout "$(limit "${TESTS_S:-230}")" python3 -m pytest -m gpu -q -p no:cacheprovider test/test_row_topk.py \
    > "$OUT/gpu_tests_row_topk.log" 2>&1
  echo "== GPU tests rc $? at ${SECONDS}s: $(tail -1 "$OUT/gpu_tests_row_topk.log")"
fi
decode_run finish_warps "${WARPS_S:-150}" --iters 50 --shapes 1x128K,2x128K,4x128K,1x768K --configs "SPLIT_WARPS=8"
echo "== table"
for f in "$OUT"/row_warps_*.log; do
  [ -f "$f" ] && { echo "-- $(basename "$f")"; sed -n '/^ms per call/,$p' "$f"; }
done
[ -f "$OUT/finish_warps.log" ] && { echo "-- finish_warps"; grep -E "^random " "$OUT/finish_warps.log" | cut -c1-160; }
exit 0
