#!/usr/bin/env bash
# One device call: a change to the select kernels against the package at an earlier commit,
# side by side on the same machine: the row select's parts (select_probe.py), the legacy select
# stage (row_select.py, SGLang's topk_v2 beside the new code), the split select's decode
# kernels (split_decode.py; the new code's finishing phases with --profile), then the select
# stages' GPU tests on the new code and, with MIX_S, the decode shapes of the serving mix
# beside SGLang's decode step.
#
#   BASE=<folder holding the earlier package> KIT_BUILD_TGZ=.carry/kit_build.tgz bash benchmark/research/select_ab.sh KIT
#
# BASE: e.g. `git archive <commit> python | tar x -C .carry/base` gives .carry/base/python (and
# that commit's benchmark/research/select_probe.py, put at .carry/base/select_probe.py, probes it).
# PARTS: which of "probe rows decode configs" run (default the first three; "configs": only the
# new code's ROW_CONFIGS beside topk_v2, which "rows" runs too); TESTS, TESTS_S: the GPU tests
# and their time.
set -u -o pipefail
export OUT=${OUT:-/tmp/select_ab}
mkdir -p "$OUT"
KIT=$(cd "${1:?usage: select_ab.sh KIT}" && pwd)
BASE=${BASE:?BASE: the earlier package folder}
PARTS=${PARTS:-probe rows decode}
# shellcheck source=benchmark/kit_env.sh
source benchmark/kit_env.sh
start_kit_build
SHAPES=${SHAPES:-128x4096,1024x4096,8192x4096,1024x16384,1024x65536}
DECODE_SHAPES=${DECODE_SHAPES:-1x768K,8x768K,64x128K}
for side in base new; do
  pp=python probe=benchmark/research/select_probe.py
  # the earlier package's own probe, where it lies beside it (the probe calls the kernels' parts)
  [ "$side" = base ] && pp=$BASE && [ -f "$BASE/../select_probe.py" ] && probe=$BASE/../select_probe.py
  if [[ $PARTS == *probe* ]]; then
    PYTHONPATH=$pp timeout 90 python3 "$probe" --rows 1024 --keys 4096 --warps 8 > "$OUT/probe_$side.log" 2>&1
    stamp "probe $side rc $?"
  fi
  if [[ $PARTS == *rows* ]]; then
    PYTHONPATH=$pp timeout 120 python3 benchmark/research/row_select.py --ways rows,torch --shapes "$SHAPES" \
      --json "$OUT/row_select_$side.json" > "$OUT/row_select_$side.log" 2>&1
    stamp "row select $side rc $?"
  fi
  if [[ $PARTS == *decode* ]]; then
    PYTHONPATH=$pp timeout 100 python3 benchmark/research/split_decode.py --shapes "$DECODE_SHAPES" \
      --out "$OUT/split_decode_$side.json" > "$OUT/split_decode_$side.log" 2>&1
    stamp "split decode $side rc $?"
  fi
done
if [[ $PARTS == *decode* ]]; then
  timeout 60 python3 benchmark/research/split_decode.py --profile --shapes 1x768K,8x768K --out "$OUT/split_profile.json" \
    > "$OUT/split_profile.log" 2>&1
  stamp "finishing phases rc $?"
fi
wait "$BUILD"
# shellcheck disable=SC1091
source /tmp/dgsite/dg_env.sh
if [[ $PARTS == *rows* || $PARTS == *configs* ]]; then
  timeout 100 python3 benchmark/research/row_select.py --ways rows --shapes "$SHAPES" --patterns random \
    --configs "${ROW_CONFIGS:-4096:8:2:128}" --sglang-kit "$KIT" --json "$OUT/row_select_topk_v2.json" \
    > "$OUT/row_select_topk_v2.log" 2>&1
  stamp "beside topk_v2 rc $?"
fi
timeout "${TESTS_S:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider -rf ${TESTS:-test/test_row_topk.py test/test_legacy.py} \
  > "$OUT/gpu_tests.log" 2>&1
stamp "GPU tests rc $? ($(tail -n 1 "$OUT/gpu_tests.log"))"
if [ -n "${MIX_S:-}" ]; then
  timeout "$MIX_S" python3 benchmark/serving_mix.py --sglang-kit "$KIT" --shapes "${MIX_SHAPES:-decode}" \
    --commit "${COMMIT:-unknown}" --out "$OUT/serving_mix_decode.json" > "$OUT/serving_mix_decode.log" 2>&1
  stamp "decode mix rc $?"
fi
for side in base new; do echo "== $side"; tail -n 3 "$OUT/probe_$side.log" 2>/dev/null
  grep -v "^\s*$" "$OUT/row_select_$side.log" 2>/dev/null | tail -n 12
  grep -A12 "^pattern " "$OUT/split_decode_$side.log" 2>/dev/null | cut -c1-160; done
grep -A14 "^finishing kernel" "$OUT/split_profile.log" 2>/dev/null
tail -n 8 "$OUT/row_select_topk_v2.log" 2>/dev/null
grep -E "passed|failed" "$OUT/gpu_tests.log" | tail -n 3
grep -E "^\||geometric" "$OUT/serving_mix_decode.log" 2>/dev/null | tail -n 24
