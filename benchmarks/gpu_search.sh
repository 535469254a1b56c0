#!/usr/bin/env bash
# `gputune tune` against the recipe an engineer writes by hand, in one device call each (under
# the 10-minute limit): the search first, from a fresh home (a cold Inductor cache, an empty
# store and reference cache), then the hand recipe in the same call. Run from the repository
# root on the GPU machine with the wheels carried (../shared/gpu/README.md):
#   bash benchmarks/gpu_search.sh SECTION [MINUTES]
#   gpt2      GPT-2 124M, default flags; hand: bf16 + SDPA + compile + fused AdamW at batch 16,
#             and at batch 64 with CUDA graphs (reduce-overhead)                    ~8 min
#   gpt2in    GPT-2 124M with the same two hand recipes measured inside tune's own time budget
#             (`--compare`, before it searches): one call holds a 9-minute search and its
#             anchor (MINUTES 9 with CALL_LIMIT_S=590)                   MINUTES + ~0.5 min
#   hf16      a 1.3B Hugging Face Llama (examples.hf_causal_lm:llama), 4 x 2048 tokens,
#             --max-memory 16GiB; hand: bf16 weights + Liger-Kernel + fused AdamW, at the
#             whole batch and accumulating micro-batches of 2 and of 1              ~8.5 min
#   hf24      the same at --max-memory 24GiB                                          ~8.5 min
#   llama16   the built-in llama-1b, 4 samples, --max-memory 16GiB; hand: bf16 weights +
#             Liger-Kernel's modules + fused AdamW (whole batch, micro-batches 2, 1)  ~8.5 min
#   llama24   the same at --max-memory 24GiB                                          ~8.5 min
#   vision    torchvision's ResNet-50 (a model the search was never tuned on), default
#             flags; hand: bf16 + compile + fused AdamW                              ~7 min
#             VISION_MODEL=torchvision:NAME picks another (e.g. vit_b_16)
#   hf        a Hugging Face model from its config.json, held out of the search's design:
#             by default benchmarks/models/qwen2.5-0.5b-shape (Qwen2.5-0.5B's shape: width
#             896, 14 query and 2 key-value heads, a vocabulary of 151,936, tied embeddings;
#             random weights), HF_MODEL=PATH another; default flags; hand: bf16 autocast +
#             compile + fused AdamW, twice, with transformers' own SDPA as a user's script
#             builds the model                                                     ~8 min
# MINUTES is tune's --budget-minutes (default 5). Results land in $OUT: the tune JSON (with
# its time line), its log and its workers' log, the hand recipe's JSON and log, nvidia-smi's line.
set -uo pipefail
section=${1:-}; minutes=${2:-5}
case "$section" in gpt2|gpt2in|hf|hf16|hf24|llama16|llama24|vision) ;; *)
  echo "usage: bash benchmarks/gpu_search.sh gpt2|gpt2in|hf|hf16|hf24|llama16|llama24|vision [MINUTES]" >&2; exit 2 ;; esac
. benchmarks/gpu_env.sh
export GPUTUNE_HOME=/tmp/gputune-home-$section NCCL_NVLS_ENABLE=0
rm -rf "$GPUTUNE_HOME"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt"
# Each command ends (SIGTERM) before the call's limit, so that what it measured is written.
call_end=$((SECONDS + ${CALL_LIMIT_S:-585}))
gputune() { timeout -k 15 $((call_end - SECONDS - 15)) python3 -m tuner_tui.cli "$@"; }
tune() {  # tune NAME WORKLOAD [FLAGS...]
  local name=$1 workload=$2; shift 2
  local start=$(date +%s)
  gputune tune --workload "$workload" --device cuda --budget-minutes "$minutes" "$@" \
    --out "$OUT/tune-$name.toml" --json "$OUT/tune-$name.json" > "$OUT/tune-$name.log" 2>&1
  echo "tune exit $?, wall $(( $(date +%s) - start )) s" | tee -a "$OUT/tune-$name.log"
  # The workers' own log (every worker of the search, the optimizer steps' one too), which
  # otherwise stays on the machine: its last 2 MB.
  local log; log=$(ls -t "$GPUTUNE_HOME"/runs/*-tune-*/worker.log 2>/dev/null | head -1)
  [ -n "$log" ] && tail -c 2000000 "$log" > "$OUT/tune-$name-worker.log"
  grep -v "^\[" "$OUT/tune-$name.log" | tail -22
}
merge_hand() {  # the hand recipes' JSONs as one file {run: result}: a call brings back 8 files
  python3 - "$OUT" "$1" <<'EOF'
import json, pathlib, sys
out, section = pathlib.Path(sys.argv[1]), sys.argv[2]
parts = sorted(out.glob(f"hand-{section}-*.json"))
runs = {p.stem.removeprefix(f"hand-{section}-"): json.loads(p.read_text()) for p in parts}
(out / f"hand-{section}-runs.json").write_text(json.dumps(runs, indent=1))
for p in parts:
    p.unlink()
EOF
}
c=benchmarks/configs
case "$section" in
  gpt2)
    tune gpt2 gpt2-124m
    gputune bench --workload gpt2-124m --device cuda --fresh --remeasure 0 \
      --config $c/gpt2-compile-fused.toml --config $c/gpt2-hand-b64-graphs.toml \
      --config $c/gpt2-compile-fused.toml --config $c/gpt2-hand-b64-graphs.toml \
      --json "$OUT/hand-gpt2.json" > "$OUT/hand-gpt2.log" 2>&1
    tail -8 "$OUT/hand-gpt2.log" ;;
  gpt2in)
    tune gpt2in gpt2-124m --compare $c/gpt2-compile-fused.toml --compare $c/gpt2-hand-b64-graphs.toml ;;
  hf16|hf24)
    budget=${section#hf}GiB
    tune "$section" examples.hf_causal_lm:llama --set batch_size=4 --max-memory "$budget"
    python3 benchmarks/hand_recipe.py --workload hf-llama --batch-size 4 \
      --json "$OUT/hand-$section-a.json" > "$OUT/hand-$section.log" 2>&1
    python3 benchmarks/hand_recipe.py --workload hf-llama --batch-size 4 \
      --json "$OUT/hand-$section-b.json" >> "$OUT/hand-$section.log" 2>&1
    for micro in 2 1; do  # the same, accumulating where the whole batch does not fit
      python3 benchmarks/hand_recipe.py --workload hf-llama --batch-size 4 --micro-batch $micro \
        --json "$OUT/hand-$section-micro$micro.json" >> "$OUT/hand-$section.log" 2>&1
    done
    merge_hand "$section"
    grep -iE "tokens/s|peak" "$OUT/hand-$section.log" | tail -8 ;;
  llama16|llama24)
    tune "$section" llama-1b --set batch_size=4 --max-memory "${section#llama}GiB"
    for run in a b micro2 micro1; do  # micro*: accumulating where the whole batch does not fit
      python3 benchmarks/hand_recipe.py --workload llama-1b --batch-size 4 \
        $([ "${run#micro}" != "$run" ] && echo --micro-batch "${run#micro}") \
        --json "$OUT/hand-$section-$run.json" >> "$OUT/hand-$section.log" 2>&1
    done
    merge_hand "$section"
    grep -iE "tokens/s|peak" "$OUT/hand-$section.log" | tail -8 ;;
  hf)
    hf_model=hf:${HF_MODEL:-benchmarks/models/qwen2.5-0.5b-shape}
    tune hf "$hf_model"
    gputune bench --workload "$hf_model" --device cuda --fresh --remeasure 0 \
      --config $c/bf16-compile-fused.toml --config $c/bf16-compile-fused.toml \
      --json "$OUT/hand-hf.json" > "$OUT/hand-hf.log" 2>&1
    tail -6 "$OUT/hand-hf.log" ;;
  vision)
    vision_model=${VISION_MODEL:-torchvision:resnet50}
    tune vision "$vision_model"
    gputune bench --workload "$vision_model" --device cuda --fresh --remeasure 0 \
      --config $c/bf16-compile-fused.toml --config $c/bf16-compile-fused.toml \
      --json "$OUT/hand-vision.json" > "$OUT/hand-vision.log" 2>&1
    tail -6 "$OUT/hand-vision.log" ;;
esac
