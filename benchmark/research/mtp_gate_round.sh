#!/usr/bin/env bash
# One device call for the gate ahead of the score kernel at requests of two rows (a draft row of
# multi-token prediction each, SCORED_GATE_MAX_ROWS=2) against the shipped four-kernel step
# (SCORED_GATE_MAX_ROWS = 1), each step under a limit of its own and all under TOTAL_S; logs under
# $OUT, a short table last (run at c7b9dee, where 2 was shipped and 1 the config):
# 1. split_decode.py on the mix's bytes at one to 32 requests of 768K and 4-32 of 128K, two rows a
#    request, warm and L2-cold, every digest against the shipped step's;
# 2. the two-row GPU tests of test_scored_gate.py (the four-kernel step's bits at 1 x 768K,
#    8 x 768K and 32 x 128K on four score patterns).
#
#   bash benchmark/research/mtp_gate_round.sh
# shellcheck source=benchmark/research/round_env.sh
source "$(dirname "$0")/round_env.sh"
decode_run mtp_gate "${AB_S:-300}" --iters 50 --cold --configs "SCORED_GATE_MAX_ROWS=2" \
  --shapes "${SHAPES:-32x768Kx2,8x768Kx2,1x768Kx2,32x128Kx2,16x128Kx2,4x128Kx2}"
timeout "$(limit "${TESTS_S:-200}")" python3 -m pytest -m gpu -q -p no:cacheprovider test/test_scored_gate.py \
  -k "two_row_tiles_gpu" > "$OUT/gpu_tests_two_rows.log" 2>&1
echo "== GPU tests rc $? at ${SECONDS}s: $(tail -1 "$OUT/gpu_tests_two_rows.log")"
echo "== table"
sed -n '/^pattern /,$p' "$OUT/mtp_gate.log" | cut -c1-160
exit 0
