#!/usr/bin/env bash
# One device call: the score kernel of other packages (earlier ones, variants) against this
# checkout's, on one machine, with no anchor kit to build: legacy's score kernel alone at prefill
# shapes (score_rows.py, the shipped tile) and the decode step, whose gathering score kernel shares
# the score tile (split_decode.py); each side timed twice, alternating, after every side compiled
# its kernels at once. Each side prints its key matrices' and outputs' digests, so the trees
# compare bit for bit.
#
#   VARIANTS="base=.carry/base/python f=.carry/f/python" bash benchmark/research/score_ab.sh
#
# VARIANTS: NAME=FOLDER pairs, each a package timed as the side NAME beside this checkout's ("new");
# e.g. `git archive <commit> python | tar x -C .carry/base` gives .carry/base/python.
# SHAPES: score_rows.py's --shapes; DECODE_SHAPES: split_decode.py's ("" skips it). TESTS: pytest
# arguments run after the timings (`-n 15`, this checkout's package) in what is left of TOTAL_S
# (default 540) seconds, their log $OUT/gpu_tests.log. The timings' logs come back packed as
# $OUT/score_ab.tgz; the tables are printed last.
set -u -o pipefail
export OUT=${OUT:-/tmp/score_ab}
mkdir -p "$OUT"
VARIANTS=${VARIANTS:?VARIANTS: NAME=FOLDER pairs, the packages to time beside this one}
SIDES="new"
declare -A FOLDER=([new]=python)
for v in $VARIANTS; do
  name=${v%%=*}; FOLDER[$name]=${v#*=}; SIDES="$SIDES $name"
  [ -d "${FOLDER[$name]}/indexer_topk" ] || { echo "score_ab.sh: no package in ${FOLDER[$name]}"; exit 2; }
done
SHAPES=${SHAPES:-1024x16K,8192x16K,1024x64K,8192x64K,1024x256K}
DECODE_SHAPES=${DECODE_SHAPES-1x128K,8x128K,8x768K,64x128K}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache} PYTHONUNBUFFERED=1
LOGS=/tmp/score_ab_logs
mkdir -p "$LOGS"
side_path() { echo "${FOLDER[$1]}"; }
source benchmark/research/ab_env.sh  # stamp, ab_decode, ab_rounds, ab_tests
DECODE_ARGS=${DECODE_ARGS-"--seed 0 --page-table-pad 0"}  # the serving mix's bytes
score() {  # side, label, iters
  PYTHONPATH=$(side_path "$1") timeout "${SCORE_S:-120}" python3 benchmark/research/score_rows.py --shapes "$SHAPES" \
    --tiles 2:4:3 --iters "$3" --json "$LOGS/score_$1_$2.json" > "$LOGS/score_$1_$2.log" 2>&1
  stamp "score $1 $2 rc $?"
}
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
ab_rounds score ab_decode
tar czf "$OUT/score_ab.tgz" -C "$LOGS" .
ab_tests -n 15 -m gpu
for run in 1 2; do
  for side in $SIDES; do
    echo "== score $side $run"; grep -E "^ +prefill" "$LOGS/score_${side}_$run.log"
  done
done
for run in 1 2; do
  for side in $SIDES; do
    echo "== decode $side $run"; grep -E "^random" "$LOGS/decode_${side}_$run.log" | cut -c1-90
  done
done
