#!/usr/bin/env bash
# One device call: where a replayed call's host time goes (research/host_breakdown.py) while the
# SGLang anchor kit unpacks (KIT_BUILD_TGZ), then the mix's first prefill shapes beside SGLang's
# path (SHAPES; the mix warms up on its first shape). COMMIT names the code; logs under $OUT.
#
#   COMMIT=<rev> KIT_BUILD_TGZ=.carry/kit_build.tgz bash benchmark/research/host_session.sh
export OUT KIT=${KIT:-$(pwd)/.anchor}  # the SGLang CUDA anchor kit
source benchmark/kit_env.sh
start_kit_build
stamp "host breakdown"
timeout ${HB_S:-90} python3 benchmark/research/host_breakdown.py --cases ${HB_CASES:-sglang_fp8:128:16K:auto,sglang_fp8:1024:16K:auto,sglang_fp8:1024:256K:auto,aiter_mxfp4:1024:64K:auto} > $OUT/host_breakdown.log 2>&1
stamp "host breakdown rc $?"
wait $BUILD; source /tmp/dgsite/dg_env.sh
timeout ${MIX_S:-130} python3 benchmark/serving_mix.py --sglang-kit "$KIT" --commit ${COMMIT:-unknown} --shapes "${SHAPES:-prefill 128 x,prefill 1024 x 16K}" --out $OUT/serving_mix_subset.json > $OUT/serving_mix_subset.log 2>&1
stamp "mix subset rc $?"
tail -25 $OUT/host_breakdown.log; grep -E "^\|" $OUT/serving_mix_subset.log | tail -8
