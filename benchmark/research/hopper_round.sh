#!/usr/bin/env bash
# One device round of the Hopper experiment: the exactness sweep and four shapes for one build,
# then the 768K shape for each other build, each in its own process under a time limit (a build
# that deadlocks costs its limit, not the round).
#
#   [CHECK=1] [LIMIT=s] bash benchmark/research/hopper_round.sh MAIN_BUILD [OTHER_BUILD ...]   (on the GPU machine; logs to $OUT)
set -u
cd "$(dirname "$0")"
export PYTHONPATH=../../python:.
main=$1; shift
log=${OUT:-.}/hopper_round.log
{ echo "== $main: sweep and shapes"; timeout 300 python3 hopper_probe.py --build "$main" --cases 4 \
    --baselines legacy --no-select; echo "exit $?"; } 2>&1 | tee -a "$log" | tail -14
# CHECK=1: each other build also runs the first three sweep cases (a pool of 64 that cuts constantly among them)
check=$([ "${CHECK:-0}" = 1 ] && echo --quick || echo --skip-check --cases 1)
for b in "$@"; do
  { echo "== $b: 768K"; timeout "${LIMIT:-100}" python3 hopper_probe.py --build "$b" $check --baselines ""; \
    echo "exit $?"; } 2>&1 | tee -a "$log" | tail -4
done
