#!/usr/bin/env bash
# What accumulating more micro-batches per optimizer step buys a 1.5B model (llama-1b, the
# tune answer at 24 GiB): the whole batch of 4 against 16 as four micro-batches of 4, each
# twice, interleaved, in one call (the second of each compiles from the cache):
#   bash benchmarks/gpu_accumulation.sh                                           ~4 min
set -uo pipefail
. benchmarks/gpu_env.sh
export GPUTUNE_HOME=/tmp/gputune-home-accumulation
rm -rf "$GPUTUNE_HOME"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt"
c=benchmarks/configs
timeout -k 15 ${CALL_LIMIT_S:-540} python3 -m tuner_tui.cli bench --workload llama-1b --device cuda \
  --fresh --remeasure 0 \
  --config $c/llama-graphs-b4.toml --config $c/llama-graphs-b16-micro4.toml \
  --config $c/llama-graphs-b4.toml --config $c/llama-graphs-b16-micro4.toml \
  --json "$OUT/accumulation.json" > "$OUT/accumulation.log" 2>&1
echo "bench exit $?"
tail -8 "$OUT/accumulation.log"
