#!/usr/bin/env bash
# What 8-bit optimizer state reserves beyond what it allocates, against bf16 state, on models
# of other sizes and kinds (docs/search.md: on llama-1b, 8-bit state's reserved peak lay 3.35
# GiB over its allocated one, bf16 state's 1.12). One bench per model, the two states
# interleaved twice, in one device call (~5 min):
#   bash benchmarks/gpu_state_memory.sh
set -uo pipefail
. benchmarks/gpu_env.sh
export GPUTUNE_HOME=/tmp/gputune-home-state NCCL_NVLS_ENABLE=0
rm -rf "$GPUTUNE_HOME"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt"
call_end=$((SECONDS + ${CALL_LIMIT_S:-585}))
c=benchmarks/configs
pair=(--config $c/state-8bit-eager.toml --config $c/state-bf16-eager.toml
      --config $c/state-8bit-eager.toml --config $c/state-bf16-eager.toml)
run() {  # run NAME WORKLOAD [FLAGS...]
  local name=$1 workload=$2; shift 2
  timeout -k 15 $((call_end - SECONDS - 15)) python3 -m tuner_tui.cli bench \
    --workload "$workload" --device cuda --fresh --remeasure 0 "${pair[@]}" "$@" \
    --json "$OUT/state-$name.json" > "$OUT/state-$name.log" 2>&1
  echo "$name: exit $?"; grep -E "8bit state|bf16 state" "$OUT/state-$name.log" | tail -4
}
# GPT-2 last: it has run (877630e); the two others have not.
run hf-llama examples.hf_causal_lm:llama --set batch_size=4
run resnet50 torchvision:resnet50
run gpt2 gpt2-124m
