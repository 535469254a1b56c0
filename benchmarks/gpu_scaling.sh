#!/usr/bin/env bash
# Issue 19: scaling from one GPU to every GPU of the machine, one command on any kind:
#   bash benchmarks/gpu_scaling.sh
# 1. ladder  SCALING_WORKLOADS (default llama-1b, then the HF Llama): the compiled one-GPU row,
#            then DDP and FSDP2 (their best two-GPU knobs) on 2, 4 and 8 GPUs, 4 x 2048 tokens
#            per GPU; the sizes the machine lacks are listed as not run      ~4 min a workload on 8
# 2. plot    scaling against GPUs, both workloads, as $OUT/scaling.svg
# 3. tune    `gputune tune` on every GPU of the machine, HF Llama, per-GPU budget 24 GiB: the
#            search's recommendation there                                         ~8 min
# SCALING_PARTS (default "ladder plot") picks the parts; each is one device call's worth on 8
# GPUs (run "tune" alone). On nvidia-h200-x2 the ladder stops at 2 GPUs.
set -uo pipefail
. benchmarks/gpu_env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/gputune-parallel-inductor}
export GPUTUNE_HOME=${GPUTUNE_HOME:-/tmp/gputune-home}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt"
gpus=$(nvidia-smi -L | wc -l)
parts=${SCALING_PARTS:-ladder plot}
if [[ " $parts " == *" ladder "* ]]; then
  for workload in ${SCALING_WORKLOADS:-llama-1b examples.hf_causal_lm:llama}; do
    name=${workload##*:}; [ "$name" = llama ] && name=hf-llama
    echo "== $name $(date +%T), $gpus GPUs"
    timeout -k 5 "${SCALING_LIMIT_S:-290}" python3 benchmarks/parallel_scaling.py --workload "$workload" \
      --per-gpu-batch 4 --steps 10 --warmup 3 --ladder "${SCALING_LADDER:-1,2,4,8}" \
      --json "$OUT/scaling-$name.json" > "$OUT/scaling-$name.log" 2>&1
    grep -v '^\[rank\|^W[0-9]\|Warning\|Configuration class' "$OUT/scaling-$name.log" | tail -12
  done
fi
if [[ " $parts " == *" plot "* ]]; then
  ls "$OUT"/scaling-*.json > /dev/null 2>&1 && python3 benchmarks/parallel_scaling.py --plot "$OUT"/scaling-*.json --svg "$OUT/scaling.svg"
fi
if [[ " $parts " == *" tune "* ]]; then
  echo "== tune on $gpus GPUs $(date +%T)"
  timeout -k 10 "${SCALING_TUNE_LIMIT_S:-560}" python3 -m tuner_tui.cli tune --device cuda \
    --workload examples.hf_causal_lm:llama --set devices="$gpus" --set batch_size=$((4 * gpus)) \
    --set precision=bf16 --set attention=sdpa --set optimizer=fused \
    --max-memory 24GiB --budget-minutes "${SCALING_TUNE_MINUTES:-8}" --steps 10 --warmup 3 \
    --json "$OUT/tune-${gpus}gpu-24gib.json" --out "$OUT/tune-${gpus}gpu-24gib.toml" > "$OUT/tune-${gpus}gpu-24gib.log" 2>&1
  grep -v "^\[" "$OUT/tune-${gpus}gpu-24gib.log" | grep -v -i -E "warning|Configuration class" | tail -30
fi
echo "== done $(date +%T)"
