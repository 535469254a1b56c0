#!/usr/bin/env bash
# Data parallel on a two-GPU machine (the device tool's nvidia-h200-x2), issue 15, in one call
# of under 9 minutes:
#   bash benchmarks/gpu_parallel.sh
# 1. the GPU tests of worker groups (NCCL, one rank per GPU)                           ~0.5 min
# 2. llama-1b, then the Hugging Face Llama example (~1.3B), 4 x 2048 tokens per GPU: one GPU
#    beside DDP and FSDP2 on two, eager and compile (per block), bf16 + SDPA + fused AdamW;
#    scaling = 2-GPU tokens/s / (2 x one GPU's), the peak memory of each rank     ~3.5 min each
# 3. a live DDP group on gpt2-124m: rank 1 killed (time to notice, to train again in a new
#    group), then a real out of memory on every rank (fp32, manual attention)         ~2-4 min
# Results: $OUT/parallel-*.json and .log (each JSON is rewritten after every row, so a row cut
# short by the time limit keeps the rows before it).
# PARALLEL_PARTS (default "tests scaling faults") picks the parts; PARALLEL_ARGS="--knobs
# --profile" adds the compiled groups with FSDP2 not resharding and DDP's larger bucket views,
# and profiles the compiled rows (about 1.5 min more per workload: PARALLEL_LIMIT_S=290).
set -uo pipefail
. benchmarks/gpu_env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# One Inductor cache for every row: the groups' per-block graphs can reuse the one-GPU row's.
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/gputune-parallel-inductor}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt"
gpus=$(nvidia-smi -L | wc -l)
if [ "$gpus" -lt 2 ]; then echo "gpu_parallel.sh needs two GPUs; this machine has $gpus" >&2; exit 2; fi

parts=${PARALLEL_PARTS:-tests scaling faults}
if [[ " $parts " == *" tests "* ]]; then
echo "== gpu tests $(date +%T)"
timeout -k 5 90 python3 -m pytest -q -m gpu tests/engine/test_group.py 2>&1 | tail -5 | tee "$OUT/parallel-gpu-tests.log"
fi

[[ " $parts " == *" scaling "* ]] && for workload in ${PARALLEL_WORKLOADS:-llama-1b examples.hf_causal_lm:llama}; do
  name=${workload##*:}; [ "$name" = llama ] && name=hf-llama
  echo "== $name $(date +%T)"
  timeout -k 5 "${PARALLEL_LIMIT_S:-205}" python3 benchmarks/parallel_scaling.py --workload "$workload" --per-gpu-batch 4 \
    --steps 10 --warmup 3 ${PARALLEL_ARGS:-} --json "$OUT/parallel-$name.json" > "$OUT/parallel-$name.log" 2>&1
  grep -v '^\[rank\|^W[0-9]\|Warning\|Configuration class' "$OUT/parallel-$name.log" | tail -14
done
# The faults last: a check cut by its time limit can no longer load the scaling rows (its
# worker now dies with its parent, and the ranks with the worker), but it cannot cost them time.
if [[ " $parts " == *" faults "* ]]; then
echo "== faults $(date +%T)"
timeout -k 5 "${FAULTS_LIMIT_S:-240}" python3 benchmarks/parallel_scaling.py --faults --json "$OUT/parallel-faults.json" \
  > "$OUT/parallel-faults.log" 2>&1
grep '^{' "$OUT/parallel-faults.log"
fi
echo "== done $(date +%T)"
