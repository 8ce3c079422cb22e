#!/usr/bin/env bash
# One device call: a change to the select kernels against the package at an earlier commit,
# side by side on the same machine: the row select's parts (select_probe.py), the legacy select
# stage (row_select.py, SGLang's topk_v2 beside the new code), the split select's decode
# kernels (split_decode.py), then the select stages' GPU tests on the new code.
#
#   BASE=<folder holding the earlier package> KIT_BUILD_TGZ=.carry/kit_build.tgz bash benchmark/research/select_ab.sh KIT
#
# BASE: e.g. `git archive <commit> python | tar x -C .carry/base` gives .carry/base/python.
set -u -o pipefail
export OUT=${OUT:-/tmp/select_ab}
mkdir -p "$OUT"
KIT=$(cd "${1:?usage: select_ab.sh KIT}" && pwd)
BASE=${BASE:?BASE: the earlier package folder}
# shellcheck source=benchmark/kit_env.sh
source benchmark/kit_env.sh
start_kit_build
SHAPES=${SHAPES:-128x4096,1024x4096,8192x4096,1024x16384,1024x65536}
for side in base new; do
  pp=python probe=benchmark/research/select_probe.py
  # the earlier package's own probe, where it lies beside it (the probe calls the kernels' parts)
  [ "$side" = base ] && pp=$BASE && [ -f "$BASE/../select_probe.py" ] && probe=$BASE/../select_probe.py
  PYTHONPATH=$pp timeout 90 python3 "$probe" --rows 1024 --keys 4096 --warps 8 \
    > "$OUT/probe_$side.log" 2>&1
  stamp "probe $side rc $?"
  PYTHONPATH=$pp timeout 120 python3 benchmark/research/row_select.py --ways rows,torch --shapes "$SHAPES" \
    --json "$OUT/row_select_$side.json" > "$OUT/row_select_$side.log" 2>&1
  stamp "row select $side rc $?"
  PYTHONPATH=$pp timeout 100 python3 benchmark/research/split_decode.py --shapes "${DECODE_SHAPES:-1x768K,8x768K,64x128K}" \
    --out "$OUT/split_decode_$side.json" > "$OUT/split_decode_$side.log" 2>&1
  stamp "split decode $side rc $?"
done
wait "$BUILD"
# shellcheck disable=SC1091
source /tmp/dgsite/dg_env.sh
timeout 100 python3 benchmark/research/row_select.py --ways rows --shapes "$SHAPES" --patterns random \
  --sglang-kit "$KIT" --json "$OUT/row_select_topk_v2.json" > "$OUT/row_select_topk_v2.log" 2>&1
stamp "beside topk_v2 rc $?"
timeout "${TESTS_S:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider -rf ${TESTS:-test/test_row_topk.py test/test_legacy.py} \
  > "$OUT/gpu_tests.log" 2>&1
stamp "GPU tests rc $? ($(tail -1 "$OUT/gpu_tests.log"))"
for side in base new; do echo "== $side"; tail -n 3 "$OUT/probe_$side.log"; grep -v "^\s*$" "$OUT/row_select_$side.log" | tail -n 12
  grep -A12 "^pattern " "$OUT/split_decode_$side.log" | cut -c1-160; done
tail -n 8 "$OUT/row_select_topk_v2.log"
