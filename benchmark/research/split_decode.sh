#!/usr/bin/env bash
# One device call: split_decode.py's sweep of settings (SHAPES, CONFIGS), then the finishing kernel's phase
# cycles (--profile, random and rising scores); logs under $OUT.
export PYTHONPATH=python TRITON_CACHE_DIR=/tmp/tcache; mkdir -p /tmp/tcache; tar xzf .carry/tcache.tgz -C /tmp/tcache
timeout 330 python3 benchmark/research/split_decode.py --out $OUT/split_decode.json --shapes ${SHAPES:-1x768K,8x768K,64x128K} --configs "${CONFIGS:-SPLIT_WARPS=8;SPLIT_WARPS=32;SPLIT_SAMPLE=2048;SCORE_PROGRAMS_PER_SM=8;SCORE_MIN_SPAN=256;SCORE_MIN_SPAN=1024}" > $OUT/split_decode.log 2>&1; echo rc $?
timeout 120 python3 benchmark/research/split_decode.py --profile --out $OUT/split_profile.json --shapes ${SHAPES:-1x768K,8x768K,64x128K} --patterns random,increasing --configs "${PROFILE_CONFIGS:-SPLIT_BINS=0}" > $OUT/split_profile.log 2>&1; echo rc $?
grep -A200 "^pattern " $OUT/split_decode.log | cut -c1-230; grep -A12 "^finishing kernel" $OUT/split_profile.log; tail -3 $OUT/split_decode.log
