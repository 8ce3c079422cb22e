#!/usr/bin/env bash
# One device call for the A/Bs the notes' next steps wait on, each step under a limit of its own
# and all of them under TOTAL_S; logs under $OUT, a short table last:
# 1. the gate ahead of the score kernel on and off at one to twelve requests of 128K, warm and
#    L2-cold (split_decode.py --cold), RUNS processes;
# 2. where each kernel of those steps runs within a replay (split_decode.py --timeline);
# 3. the row select at 128-256 rows with one program of 16 warps an SM against two of 8
#    (row_select.py configs TILE:WARPS:PROGRAMS_PER_SM:MAXNREG; 0: the compiler's registers);
# 4. the finish's 8 warps (SPLIT_WARPS=8) at 1-64 requests.
#
#   bash benchmark/research/pending_ab_round.sh
# shellcheck source=benchmark/research/round_env.sh
source "$(dirname "$0")/round_env.sh"
ON="SCORED_GATE_MIN_WIDTH=0"
OFF="SCORED_GATE_MIN_WIDTH=1048576,SCORED_GATE_NARROW=None"
SHAPES=${SHAPES:-1x128K,2x128K,4x128K,8x128K,12x128K}
for run in $(seq 1 "${RUNS:-2}"); do
  decode_run "gate_cold_$run" "${GATE_S:-150}" --iters 50 --cold --shapes "$SHAPES" --configs "$ON;$OFF"
done
decode_run timeline "${TIMELINE_S:-90}" --iters 20 --timeline --shapes 4x128K,8x128K,12x128K --configs "$ON;$OFF"
if [ "$(left)" -gt 40 ]; then
  timeout "$(limit "${ROWS_S:-120}")" python3 benchmark/research/row_select.py --shapes 128x4096,128x16384,256x4096 \
    --patterns random --ways rows --configs 4096:8:2:128,4096:16:1:0,4096:16:1:128 > "$OUT/row_few.log" 2>&1
  echo "== row select few rows rc $? at ${SECONDS}s"
fi
decode_run finish_warps "${WARPS_S:-100}" --iters 50 --shapes 1x128K,8x128K,64x128K,8x768K --configs "SPLIT_WARPS=8"
echo "== table"
for f in "$OUT"/gate_cold_*.log "$OUT/timeline.log" "$OUT/finish_warps.log"; do
  [ -f "$f" ] && { echo "-- $(basename "$f")"; sed -n '/^pattern /,$p;/^each kernel/,$p' "$f" | cut -c1-150; }
done
[ -f "$OUT/row_few.log" ] && { echo "-- row_few"; sed -n '/^ms per call/,$p' "$OUT/row_few.log"; }
exit 0
