#!/usr/bin/env bash
# One device call: builds of the split select side by side on the same GPU, each in its own
# process: graph-replayed decode steps with device time per kernel and the kernels' registers,
# the same with programmatic dependent launch off, and the finishing kernel's phase cycles (its
# PROF build). A build is a directory holding python/ and the scripts split_decode.py imports
# (benchmark/research/split_decode.py, decode_probe.py, benchmark/decode_bench.py), e.g. from
# `git archive <rev> python benchmark/research benchmark/decode_bench.py | tar -x -C <dir>`.
#
#   BUILDS="before=.carry/prev now=." bash benchmark/research/finish_ab.sh      (logs under $OUT)
#
# SEED, SHAPES, TOPK: the workload (the serving mix's bytes: SEED=0 PAD=0); the outputs' digests of
# each build are printed, equal where the builds' bits are. TIMES_ONLY=1: the first step only.
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
mkdir -p "$TRITON_CACHE_DIR"; [ -f .carry/tcache.tgz ] && tar xzf .carry/tcache.tgz -C "$TRITON_CACHE_DIR"
BUILDS=${BUILDS:-"now=."}
SHAPES=${SHAPES:-8x768K,1x768K,32x768K}
SEED=${SEED:-1}
for b in $BUILDS; do
  name=${b%%=*}; dir=${b#*=}; script=$dir/benchmark/research/split_decode.py
  timeout ${AB_S:-120} python3 $script --shapes $SHAPES ${TOPK:+--topk $TOPK} --seed $SEED --page-table-pad ${PAD:-1} --iters 20 --registers \
    --out $OUT/finish_ab_$name.json > $OUT/finish_ab_$name.log 2>&1
  echo "== $name rc $?"; grep -E "^random|regs" $OUT/finish_ab_$name.log | tail -$((1 + $(echo $SHAPES | tr , ' ' | wc -w) + 3))
  grep -oE "^random [^ ]+ .*digest=[0-9a-f]+" $OUT/finish_ab_$name.log | sed -E 's/:.*digest=/ digest /'
  [ -n "${TIMES_ONLY:-}" ] && continue
  INDEXER_TOPK_PDL=0 timeout ${AB_S:-120} python3 $script --shapes ${PDL_SHAPES:-8x768K} ${TOPK:+--topk $TOPK} --seed $SEED --iters 20 \
    --out $OUT/finish_ab_${name}_nopdl.json > $OUT/finish_ab_${name}_nopdl.log 2>&1
  echo "== $name, PDL off, rc $?"; grep -E "^random" $OUT/finish_ab_${name}_nopdl.log | tail -1
  timeout ${PROF_S:-90} python3 $script --profile --registers --shapes ${PROF_SHAPES:-8x768K,32x768K} ${TOPK:+--topk $TOPK} --seed $SEED \
    > $OUT/finish_ab_${name}_profile.log 2>&1
  echo "== $name, profile, rc $?"; grep -E "^random|finish_rows" $OUT/finish_ab_${name}_profile.log | tail -4
done
