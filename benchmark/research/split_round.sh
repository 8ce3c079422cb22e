#!/usr/bin/env bash
# One device call for a change to the split select: its settings side by side (split_decode.py,
# SHAPES and CONFIGS), the finishing kernel's phases (--profile, PROFILE_CONFIGS), the split
# select's GPU tests, then the decode shapes of the serving mix beside SGLang's decode step
# (SGLang's kernels from KIT_BUILD_TGZ or built meanwhile). Logs and JSON under $OUT.
#
#   KIT_BUILD_TGZ=.carry/kit_build.tgz bash benchmark/research/split_round.sh KIT
set -u -o pipefail
export OUT=${OUT:-/tmp/split_round}
mkdir -p "$OUT"
KIT=$(cd "${1:?usage: split_round.sh KIT}" && pwd)
# shellcheck source=benchmark/kit_env.sh
source benchmark/kit_env.sh
start_kit_build
SHAPES=${SHAPES:-1x768K,1x128K,8x768K,32x768K,64x128K}
timeout "${SWEEP_S:-150}" python3 benchmark/research/split_decode.py --out "$OUT/split_decode.json" --shapes "$SHAPES" \
  --configs "${CONFIGS:-SPLIT_BINS=0}" > "$OUT/split_decode.log" 2>&1
stamp "settings rc $?"
timeout "${PROFILE_S:-60}" python3 benchmark/research/split_decode.py --profile --out "$OUT/split_profile.json" \
  --shapes 1x768K,8x768K --patterns random,increasing --configs "${PROFILE_CONFIGS:-SPLIT_BINS=0}" \
  > "$OUT/split_profile.log" 2>&1
stamp "profile rc $?"
timeout "${TESTS_S:-120}" python3 -m pytest -m gpu -q -p no:cacheprovider test/test_split_topk.py ${TESTS:-} \
  > "$OUT/gpu_tests.log" 2>&1
stamp "GPU tests rc $? ($(tail -1 "$OUT/gpu_tests.log"))"
wait "$BUILD"
stamp "SGLang's kernels built"
# shellcheck disable=SC1091
source /tmp/dgsite/dg_env.sh
timeout "${MIX_S:-200}" python3 benchmark/serving_mix.py --sglang-kit "$KIT" --shapes "${MIX_SHAPES:-decode}" \
  --commit "${COMMIT:-unknown}" --out "$OUT/serving_mix_decode.json" > "$OUT/serving_mix_decode.log" 2>&1
stamp "decode mix rc $?"
grep -E "passed|failed" "$OUT/gpu_tests.log" | tail -2
grep -A14 "^finishing kernel" "$OUT/split_profile.log"
grep -A30 "^pattern " "$OUT/split_decode.log" | cut -c1-180
grep -E "^\||geometric" "$OUT/serving_mix_decode.log" | tail -24
