#!/usr/bin/env bash
# One device call for the gathering's prefetch (each block's keys loaded while the block before is
# appended), each switch against the shipped build: SPLIT_GATHER_PREFETCH=0 (the gathering kernel
# without it; shipped on since 152d37c) and SCORED_GATE_PREFETCH=1 (inside the score kernel that
# gathers; shipped off), each step under a limit of its own and all under TOTAL_S; logs under
# $OUT, a short table last:
# 1. split_decode.py on the mix's bytes, warm and L2-cold, every digest against the shipped
#    step's: the gathering kernel (MTP steps, 65 one-row requests of 128K) and the gathering inside
#    the score kernel (the gate ahead at one to 32 requests of 128K and 768K);
# 2. the prefetch's CPU-side twin on the GPU: test_scored_gate.py's GPU tests with the setting on.
#
#   bash benchmark/research/prefetch_round.sh
# shellcheck source=benchmark/research/round_env.sh
source "$(dirname "$0")/round_env.sh"
decode_run prefetch "${AB_S:-300}" --iters 30 --cold --configs "SPLIT_GATHER_PREFETCH=0;SCORED_GATE_PREFETCH=1" \
  --shapes "${SHAPES:-32x768Kx2,8x768Kx2,65x128K,32x768K,8x768K,8x128K,1x128K}"
timeout "$(limit "${TESTS_S:-220}")" python3 -c '
import sys
import pytest
from indexer_topk.backends import legacy as L
L.SPLIT_GATHER_PREFETCH = L.SCORED_GATE_PREFETCH = 1
sys.exit(pytest.main(["-m", "gpu", "-q", "-p", "no:cacheprovider", "test/test_scored_gate.py"]))
' > "$OUT/gpu_tests_prefetch.log" 2>&1
echo "== GPU tests rc $? at ${SECONDS}s: $(tail -1 "$OUT/gpu_tests_prefetch.log")"
echo "== table"
sed -n '/^pattern /,$p' "$OUT/prefetch.log" | cut -c1-160
exit 0
