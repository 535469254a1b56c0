#!/usr/bin/env bash
# Two lists of gpu_checks.sh sections at once, one list per GPU of a two-GPU machine (the device
# tool's nvidia-h200-x2): each list runs in order on its own GPU, with its own results folder.
#   bash benchmarks/gpu_two.sh "tune" "faults lce"
# Results: gpu0/, gpu1/ (one folder per GPU), packed into $OUT/results.tgz (a device call returns 8 files).
# Each GPU's measurements are its own (its own result store too): the two GPUs share only the host (CPU cores for
# compiling, memory); each console.log names its GPU (CUDA_VISIBLE_DEVICES), and the NVML panel
# follows that variable.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
. benchmarks/gpu_env.sh
# The per-GPU folders live outside $OUT: only the packed file (and nvidia-smi.txt) come back.
WORK=$(mktemp -d)
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt"
pids=()
gpu=0
for sections in "$@"; do
  mkdir -p "$WORK/gpu$gpu"
  # Stopped at GPU_TWO_LIMIT_S so that the results are packed before the call's own limit.
  GPUTUNE_HOME=/tmp/gputune-home-gpu$gpu CUDA_VISIBLE_DEVICES=$gpu OUT="$WORK/gpu$gpu" timeout -k 10 "${GPU_TWO_LIMIT_S:-570}" bash -c '
    for section in $1; do
      echo "== gpu $CUDA_VISIBLE_DEVICES: $section $(date +%T)"
      bash benchmarks/gpu_checks.sh "$section"
    done' _ "$sections" > "$WORK/gpu$gpu/console.log" 2>&1 &
  pids+=($!)
  gpu=$((gpu + 1))
done
for pid in "${pids[@]}"; do wait "$pid"; done
tar -C "$WORK" -czf "$OUT/results.tgz" $(cd "$WORK" && ls -d gpu*)
for d in "$WORK"/gpu*; do echo "==== $d"; tail -30 "$d/console.log"; done
