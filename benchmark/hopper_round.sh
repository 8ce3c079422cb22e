#!/usr/bin/env bash
# One device round of the Hopper experiment: the exactness sweep and four shapes for one build,
# then the 768K shape for each other build, each in its own process under a time limit (a build
# that deadlocks costs its limit, not the round).
#
#   bash benchmark/hopper_round.sh MAIN_BUILD [OTHER_BUILD ...]     (on the GPU machine; logs to $OUT)
set -u
cd "$(dirname "$0")"
export PYTHONPATH=../python:.
main=$1; shift
log=${OUT:-.}/hopper_round.log
{ echo "== $main: sweep and shapes"; timeout 300 python3 hopper_probe.py --build "$main" --cases 4 \
    --baselines legacy --no-select; echo "exit $?"; } 2>&1 | tee -a "$log" | tail -14
for b in "$@"; do
  { echo "== $b: 768K"; timeout 100 python3 hopper_probe.py --build "$b" --skip-check --cases 1 --baselines ""; \
    echo "exit $?"; } 2>&1 | tee -a "$log" | tail -3
done
