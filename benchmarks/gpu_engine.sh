#!/usr/bin/env bash
# Measures `gputune bench` on the GPU machine: the default ladder on gpt2-124m (batch 16 x 1024
# tokens, as in ../shared/ANCHORS.md). Run from the repository root with the wheels carried
# (see ../shared/gpu/README.md); results land in $OUT (or ./out).
set -uo pipefail
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/nvidia-smi.txt"
python3 -m tuner_tui.cli bench --workload gpt2-124m --device cuda \
  --json "$OUT/bench-gpt2-124m.json" --export "$OUT/best-gpt2-124m.toml" "$@" 2>&1 | tee "$OUT/bench-gpt2-124m.log"
