#!/usr/bin/env bash
# What a trial costs to compile when it shares its compiled graph with one compiled before:
# one `gputune bench` from a cold Inductor cache (a fresh home) of GPT-2 124M with bf16 +
# SDPA + compile, first at batch 16 with fused AdamW (cold), then moves that leave the model's
# graph as it was (foreach AdamW, batch 32 accumulated from micro-batches of 16, no gradient
# clipping), then batch 32 whole (a new shape: cold again), then the first once more. Each
# row's `compile s` is its compile time. Run from the repository root on the GPU machine with
# the wheels carried (../shared/gpu/README.md):  bash benchmarks/gpu_graph_cache.sh   ~5 min
set -uo pipefail
. benchmarks/gpu_env.sh
export GPUTUNE_HOME=/tmp/gputune-home-graph-cache
rm -rf "$GPUTUNE_HOME"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt"
c=benchmarks/configs
timeout -k 15 570 python3 -m tuner_tui.cli bench --workload gpt2-124m --device cuda --fresh \
  --remeasure 0 --steps 20 \
  --config $c/gpt2-compile-fused.toml --config $c/gpt2-compile-foreach.toml \
  --config $c/gpt2-compile-fused-b32-micro16.toml --config $c/gpt2-compile-fused-noclip.toml \
  --config $c/gpt2-compile-fused-b32.toml --config $c/gpt2-compile-fused.toml \
  --json "$OUT/graph-cache.json" > "$OUT/graph-cache.log" 2>&1
echo "bench exit $?"; tail -12 "$OUT/graph-cache.log"
