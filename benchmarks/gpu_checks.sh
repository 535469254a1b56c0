#!/usr/bin/env bash
# Every GPU measurement the open issues ask for, one section per device call (each well under
# the 10-minute limit). Run from the repository root on the GPU machine with the wheels carried
# (../shared/gpu/README.md):  bash benchmarks/gpu_checks.sh SECTION
#   engine    the bench ladder on gpt2-124m (issue 2)                         ~5 min
#   kernels   GPU kernel tests and the kernel benchmark (issue 3)              ~4 min
#   llama     llama-1b: compile alone, kernels alone, both (issues 3 and 5)    ~5 min
#   hf        a Hugging Face Llama of ~1B parameters, the same four rows (issue 7)  ~5 min
# Results land in $OUT (or ./out); copy them to benchmarks/results/ and quote them in the docs.
set -uo pipefail
case "${1:-}" in
  engine|kernels|llama|hf) ;;
  *) echo "usage: bash benchmarks/gpu_checks.sh engine|kernels|llama|hf" >&2; exit 2 ;;
esac
. benchmarks/gpu_env.sh
gputune() { python3 -m tuner_tui.cli "$@"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt"
case "${1:-}" in
  engine)
    bash benchmarks/gpu_engine.sh > /dev/null 2>&1
    tail -16 "$OUT/bench-gpt2-124m.log" ;;
  kernels)
    python3 -m pytest -m gpu -q tests/kernels 2>&1 | tee "$OUT/gpu-kernel-tests.log" | tail -3
    python3 benchmarks/kernels_bench.py --json "$OUT/kernels-h200.json" 2>&1 | tee "$OUT/kernels.log" | tail -20 ;;
  llama)
    gputune bench --workload llama-1b --device cuda --preset kernels \
      --json "$OUT/bench-llama-1b-kernels.json" 2>&1 | tee "$OUT/bench-llama-1b.log" | tail -10 ;;
  hf)
    gputune bench --workload examples.hf_causal_lm:llama --device cuda --preset kernels \
      --json "$OUT/bench-hf-llama-1b-kernels.json" 2>&1 | tee "$OUT/bench-hf-llama.log" | tail -10 ;;
esac
