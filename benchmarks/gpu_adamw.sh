#!/usr/bin/env bash
# What bf16 weights (torchao's AdamW with stochastic rounding) give against fp32 weights with the
# plain and with the fused AdamW, on the 1.3B Hugging Face Llama at batch 4 under compile, in
# one bench, interleaved: the priors of bf16 weights and of optimizer state are stated against
# one of them. Run from the repository root on the GPU machine with the wheels carried
# (../shared/gpu/README.md):  bash benchmarks/gpu_adamw.sh   ~6 min
set -uo pipefail
. benchmarks/gpu_env.sh
export GPUTUNE_HOME=/tmp/gputune-home-adamw
rm -rf "$GPUTUNE_HOME"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt"
c=benchmarks/configs
timeout -k 15 ${CALL_LIMIT_S:-340} python3 -m tuner_tui.cli bench --workload examples.hf_causal_lm:llama \
  --device cuda --set batch_size=4 --fresh --remeasure 0 --steps 10 --warmup 3 \
  --config $c/hf-llama-compile-plain.toml --config $c/hf-llama-compile.toml \
  --config $c/fit-bf16-weights.toml --config $c/hf-llama-compile-plain.toml \
  --config $c/hf-llama-compile.toml --config $c/fit-bf16-weights.toml \
  --json "$OUT/adamw.json" > "$OUT/adamw.log" 2>&1
echo "bench exit $?"; tail -12 "$OUT/adamw.log"
