#!/usr/bin/env bash
# One device call: the row select's parts (select_probe.py), then the GPU tests of the select
# stages, while the SGLang anchor kit builds in the background (packed as $OUT/kit_build.tgz).
#   bash benchmark/research/select_round.sh
export T0=$(date +%s) OUT=${OUT:-/tmp/o}
KIT=$(pwd)/.anchor
source benchmark/kit_env.sh
KIT_BUILD_OUT=1 start_kit_build
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
timeout 150 python3 benchmark/research/select_probe.py --rows 1024 --keys 4096,2048 --warps 8,4 > $OUT/select_probe.log 2>&1; stamp probe $?
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider --durations=20 -rf test/test_split_topk.py test/test_legacy.py test/test_graph_capture.py test/test_replay.py > $OUT/gpu_tests.log 2>&1; stamp tests $?
wait $BUILD; stamp kit
tar czf $OUT/tcache.tgz -C $TRITON_CACHE_DIR .
ls -la $OUT; tail -8 $OUT/select_probe.log; tail -30 $OUT/gpu_tests.log
