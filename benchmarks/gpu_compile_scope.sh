#!/usr/bin/env bash
# What compiling per block (compile_scope = block) costs in speed, and saves in compile time,
# against one graph for the whole model, on the built-in llama-1b at batch 4 (bf16 weights and
# state, the fused loss, CUDA graphs), without and with float8, in one bench, interleaved. The
# per-block prior for large models waits on these figures: on the H200 llama-1b without float8
# lost 2.7-2.9% per block, the HF Llama 1.3B with float8 17% (docs/search.md, 2026-12-05). Run
# from the repository root on the GPU machine with the wheels carried (../shared/gpu/README.md):
#   bash benchmarks/gpu_compile_scope.sh   ~6 min
set -uo pipefail
. benchmarks/gpu_env.sh
export GPUTUNE_HOME=/tmp/gputune-home-scope
rm -rf "$GPUTUNE_HOME"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt"
c=benchmarks/configs
round="--config $c/fit-bf16-state-lce-graphs.toml --config $c/scope-block-bf16-state-lce-graphs.toml
  --config $c/fit-bf16-state-lce-fp8-graphs.toml --config $c/scope-block-bf16-state-lce-fp8-graphs.toml"
# shellcheck disable=SC2086  # (the rounds are lists of flags)
timeout -k 15 ${CALL_LIMIT_S:-540} python3 -m tuner_tui.cli bench --workload llama-1b \
  --device cuda --set batch_size=4 --fresh --remeasure 0 --steps 10 --warmup 3 \
  $round $round --json "$OUT/compile-scope.json" > "$OUT/compile-scope.log" 2>&1
echo "bench exit $?"; tail -12 "$OUT/compile-scope.log"
