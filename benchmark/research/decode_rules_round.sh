#!/usr/bin/env bash
# One device call for the decode step's rules still placed by too few shapes, each an A/B in
# one process on the serving mix's bytes (split_decode.py: graph replays, device time per
# kernel, bits against the shipped settings), each step under a limit of its own and all of
# them under TOTAL_S; logs under $OUT, a short table last:
# 1. the gate ahead of the score kernel on and off, where it has not been timed: 64 requests at
#    256K, 1 and 8 requests at 192K (between the 128K it loses at and the 256K it wins at);
# 2. the same at topk 512 and 2048 at 8 x 256K;
# 3. the finish's 8 warps against 16 (SPLIT_WARPS) at 128K and 768K;
# 4. the row select at 256 x 32K (8,192-key rows: the mix's worst decode shape) with a tile of
#    8,192 keys, one program of 16 warps an SM, against the sampled 4,096-key tile;
# 5. the row select's sort width by rows on the GPU: auto (the rule) against the forced widths.
#
#   bash benchmark/research/decode_rules_round.sh
# shellcheck source=benchmark/research/round_env.sh
source "$(dirname "$0")/round_env.sh"
ON="SCORED_GATE_MIN_WIDTH=0"  # every shape; OFF: none
OFF="SCORED_GATE_MIN_WIDTH=1048576,SCORED_GATE_NARROW=None"
decode_run gate_widths "${GATE_S:-170}" --iters 20 --shapes "${GATE_SHAPES:-1x192K,8x192K,64x256K}" --configs "$ON;$OFF"
decode_run gate_topk512 "${TOPK_S:-80}" --iters 20 --shapes 8x256K --topk 512 --configs "$OFF"
decode_run gate_topk2048 "${TOPK_S:-80}" --iters 20 --shapes 8x256K --topk 2048 --configs "$OFF"
decode_run finish_warps "${WARPS_S:-90}" --iters 20 --shapes 1x128K,8x128K,64x128K,8x768K --configs "SPLIT_WARPS=8"
decode_run row_tile "${TILE_S:-70}" --iters 20 --shapes 256x32K --configs "ROWS_TILE=8192,ROWS_WARPS=16,ROWS_PROGRAMS_PER_SM=1"
if [ "$(left)" -gt 40 ]; then
  timeout $(($(left) - 10)) python3 benchmark/research/row_select.py --shapes 512x4096,1024x16384 --patterns random \
    --ways auto,rows --configs 4096:8:2:128:64,4096:8:2:128:32 > "$OUT/sort_rule.log" 2>&1
  echo "== sort rule rc $? at ${SECONDS}s"
fi
echo "== table"
for f in gate_widths gate_topk512 gate_topk2048 finish_warps row_tile; do
  [ -f "$OUT/$f.log" ] && { echo "-- $f"; sed -n '/^pattern /,$p' "$OUT/$f.log"; }
done
[ -f "$OUT/sort_rule.log" ] && { echo "-- sort rule"; sed -n '/^ms per call/,$p' "$OUT/sort_rule.log"; }
exit 0
