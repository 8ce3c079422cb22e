#!/usr/bin/env bash
# One device call, after decode_rules_round.sh on the same warm machine (its Triton cache in
# TRITON_CACHE_DIR): the gate ahead of the score kernel on and off, on the mix's bytes, each
# group of shapes in RUNS processes of its own (split_decode.py, graph replays, --iters 50, bits
# against the shipped settings), logs $OUT/gate_<group>_<run>.log. These are the runs behind
# SCORED_GATE_MIN_WIDTH and SCORED_GATE_NARROW (backends/legacy.py; benchmark/results/NOTES.md,
# "The gate ahead by width and batch"); at 6739a3a "off" was SCORED_GATE_MIN_WIDTH=1048576 alone,
# the bands came after. SETS: "name:shapes[:extra config]" entries, ';'-separated.
#
#   RUNS=2 bash benchmark/research/gate_band_runs.sh
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
mkdir -p "$TRITON_CACHE_DIR" "$OUT"
ON="SCORED_GATE_MIN_WIDTH=0"
OFF="SCORED_GATE_MIN_WIDTH=1048576,SCORED_GATE_NARROW=None"
SETS=${SETS:-"128k:1x128K,8x128K,32x128K,8x160K;rows:16x128K,64x128K,128x128K,32x64K,64x64K,4x128K;band:2x128K,6x128K,12x128K,24x128K,1x64K,8x64K,16x64K,1x32K,8x32K,32x32K;span:1x128K,4x128K,8x128K,8x192K,1x256K,8x256K,8x768K:$ON,SCORE_MIN_SPAN=256"}
IFS=';' read -ra group <<< "$SETS"
for g in "${group[@]}"; do
  IFS=':' read -r name shapes extra <<< "$g"
  for run in $(seq 1 "${RUNS:-2}"); do
    timeout "${RUN_S:-200}" python3 benchmark/research/split_decode.py --seed 0 --page-table-pad 0 --iters 50 \
      --shapes "$shapes" --configs "$ON;${extra:+$extra;}$OFF" --out "$OUT/gate_${name}_$run.json" \
      > "$OUT/gate_${name}_$run.log" 2>&1
    echo "== $name run $run rc $? at ${SECONDS}s"
  done
done
for f in "$OUT"/gate_*_*.log; do echo "-- $f"; sed -n '/^pattern /,$p' "$f" | cut -c1-80; done
exit 0
