#!/usr/bin/env bash
# One device call for the decode rules judged L2-cold, each step under a limit of its own and all
# of them under TOTAL_S; logs under $OUT, a short table last:
# 1. the split select's GPU tests (test_split_topk.py, but the 45 against the torch way) with
#    every finish at 8 warps (SPLIT_WARPS=8), the warps the finish now takes up to four rows;
# 2. the gate ahead of the score kernel on and off, L2-cold beside warm, at 32K-128K and 1-32
#    requests, RUNS processes (the rule may follow the cold step: a served step's keys come
#    from HBM);
# 3. the finish's warps by rows (shipped: 8 up to four rows) against 16 at every batch
#    (SPLIT_FEW_WARPS=None), at one to eight requests;
# 4. what the spin ahead of each timed replay changes (split_decode.py --hold-cycles 0 against
#    the default), warm and L2-cold, at one and eight requests of 128K.
#
#   bash benchmark/research/cold_rules_round.sh
# shellcheck source=benchmark/research/round_env.sh
source "$(dirname "$0")/round_env.sh"
timeout "$(limit "${TESTS_S:-150}")" python3 -c '
import sys
import pytest
from indexer_topk.backends import legacy as L
L.SPLIT_WARPS, L.SPLIT_FEW_WARPS = 8, None
sys.exit(pytest.main(["-m", "gpu", "-q", "-p", "no:cacheprovider", "test/test_split_topk.py", "-k", "not equals_torch_way"]))
' > "$OUT/gpu_tests_split_8_warps.log" 2>&1
echo "== GPU tests at 8 warps rc $? at ${SECONDS}s: $(tail -1 "$OUT/gpu_tests_split_8_warps.log")"
ON="SCORED_GATE_MIN_WIDTH=0"
OFF="SCORED_GATE_MIN_WIDTH=1048576,SCORED_GATE_NARROW=None"
for run in $(seq 1 "${RUNS:-2}"); do
  decode_run "gate_cold_$run" "${GATE_S:-150}" --iters 50 --cold --configs "$ON;$OFF" \
    --shapes "${SHAPES:-1x128K,2x128K,4x128K,8x128K,8x64K,16x64K,32x32K}"
done
decode_run finish_warps "${WARPS_S:-100}" --iters 50 --cold --shapes 1x128K,4x128K,8x128K,1x768K \
  --configs "SPLIT_FEW_WARPS=None"
decode_run hold_off "${HOLD_S:-60}" --iters 50 --cold --shapes 1x128K,8x128K --hold-cycles 0
decode_run hold_on "${HOLD_S:-60}" --iters 50 --cold --shapes 1x128K,8x128K
echo "== table"
for f in "$OUT"/gate_cold_*.log "$OUT/finish_warps.log" "$OUT"/hold_*.log; do
  [ -f "$f" ] && { echo "-- $(basename "$f")"; sed -n '/^pattern /,$p' "$f" | cut -c1-150; }
done
exit 0
