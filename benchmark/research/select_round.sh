#!/usr/bin/env bash
# One device call: the row select's parts (select_probe.py), then the GPU tests of the select
# stages (TESTS, TESTS_S seconds), while the SGLang anchor kit builds in the background and is
# packed as $OUT/kit_build.tgz for the next calls (KIT_BUILD_TGZ).
#
#   bash benchmark/research/select_round.sh KIT
set -u -o pipefail
export OUT=${OUT:-/tmp/select_round}
mkdir -p "$OUT"
KIT=$(cd "${1:?usage: select_round.sh KIT}" && pwd)
# shellcheck source=benchmark/kit_env.sh
source benchmark/kit_env.sh
KIT_BUILD_OUT=1 start_kit_build
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
timeout 150 python3 benchmark/research/select_probe.py --rows 1024 --keys 4096,2048 --warps 8,4 > "$OUT/select_probe.log" 2>&1
stamp "probe rc $?"
# shellcheck disable=SC2086
timeout "${TESTS_S:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider -rf \
  ${TESTS:-test/test_split_topk.py test/test_legacy.py test/test_graph_capture.py test/test_replay.py} > "$OUT/gpu_tests.log" 2>&1
stamp "GPU tests rc $?"
wait "$BUILD"
stamp "kit built"
tail -n 8 "$OUT/select_probe.log"; tail -n 30 "$OUT/gpu_tests.log"
