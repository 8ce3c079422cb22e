#!/usr/bin/env bash
# One device call: split_decode.py sweeps at the shipped decode shapes, then the adversarial patterns; logs under $OUT.
export PYTHONPATH=python TRITON_CACHE_DIR=/tmp/tcache; mkdir -p /tmp/tcache; tar xzf .carry/tcache.tgz -C /tmp/tcache
timeout 330 python3 benchmark/research/split_decode.py --out $OUT/split_decode.json --configs "SPLIT_WARPS=8;SPLIT_WARPS=32;SPLIT_GATHER_WARPS=8;SPLIT_PROGRAMS_PER_SM=2;SPLIT_PROGRAMS_PER_SM=8;SPLIT_BLOCK=2048;SCORE_PROGRAMS_PER_SM=2;SCORE_PROGRAMS_PER_SM=8;SCORE_MIN_SPAN=256;SCORE_MIN_SPAN=1024;SPLIT_SAMPLE=2048" > $OUT/split_decode.log 2>&1; echo rc $?
timeout 120 python3 benchmark/research/split_decode.py --out $OUT/split_decode_inc.json --patterns increasing,equal --shapes 1x768K,8x768K,64x128K > $OUT/split_decode_inc.log 2>&1; echo rc $?
grep -A200 "^pattern " $OUT/split_decode.log | cut -c1-230; grep -A20 "^pattern " $OUT/split_decode_inc.log | cut -c1-230; tail -3 $OUT/split_decode.log
