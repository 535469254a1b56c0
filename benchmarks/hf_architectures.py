"""gputune's levers on Hugging Face architectures it was not written for, on the CPU.

Each architecture is built as the `hf:PATH` workload builds it, from a tiny config written here
(random weights), and its loss and gradients on one batch are compared with the same model
without gputune: with every fused kernel asked for, SDPA attention, full and selective
checkpointing, and bf16 weights. A kernel that takes a module it should not (a norm that scales
by 1 + weight, a LayerNorm with a forward of its own) shows as a loss or gradient apart; a
workload that does not build shows as its one line; a kernel that swaps modules but that the
workload's facts (read on the meta device, as the search reads them) declare inapplicable shows
as a "facts" row apart. The report says what each option swapped
and left, so a user's model that gains nothing from a kernel is seen too.

    TRITON_INTERPRET=1 python benchmarks/hf_architectures.py [NAME ...] [--json OUT.json]

The kernels run in Triton's interpreter (slow: a few minutes for all of them). Gradients are
compared against the largest gradient's norm: some are zero in exact arithmetic (an attention's
key bias), and their rounding alone would look far apart relative to themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 128,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
GPT = {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 128}
ARCHITECTURES = {
    "llama": {"architectures": ["LlamaForCausalLM"], "num_key_value_heads": 2},
    "mistral": {"architectures": ["MistralForCausalLM"], "num_key_value_heads": 2},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "num_key_value_heads": 2, "head_dim": 16},
    "gemma": {"architectures": ["GemmaForCausalLM"], "num_key_value_heads": 1, "head_dim": 16},
    "gemma2": {"architectures": ["Gemma2ForCausalLM"], "num_key_value_heads": 2, "head_dim": 16},
    "gemma3_text": {"architectures": ["Gemma3ForCausalLM"], "num_key_value_heads": 1,
                    "head_dim": 16, "sliding_window": 8,  # (shorter than the 32 tokens)
                    "layer_types": ["sliding_attention", "full_attention"]},
    "phi": {"architectures": ["PhiForCausalLM"]},
    "phi3": {"architectures": ["Phi3ForCausalLM"], "num_key_value_heads": 4},
    "gpt_neox": {"architectures": ["GPTNeoXForCausalLM"], "rotary_pct": 0.25},
    "gptj": {"architectures": ["GPTJForCausalLM"], **GPT, "rotary_dim": 8},
    "gpt_bigcode": {"architectures": ["GPTBigCodeForCausalLM"], **GPT},
    "falcon": {"architectures": ["FalconForCausalLM"], "n_head": 4, "n_layer": 2},
    "bloom": {"architectures": ["BloomForCausalLM"], "n_head": 4, "n_layer": 2},
    "opt": {"architectures": ["OPTForCausalLM"], "ffn_dim": 128, "word_embed_proj_dim": 64},
    "stablelm": {"architectures": ["StableLmForCausalLM"], "num_key_value_heads": 2},
    "starcoder2": {"architectures": ["Starcoder2ForCausalLM"], "num_key_value_heads": 2},
    "olmo2": {"architectures": ["Olmo2ForCausalLM"], "num_key_value_heads": 2},
    "granite": {"architectures": ["GraniteForCausalLM"], "num_key_value_heads": 2},
    "cohere": {"architectures": ["CohereForCausalLM"], "num_key_value_heads": 2},
    "mixtral": {"architectures": ["MixtralForCausalLM"], "num_key_value_heads": 2,
                "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {"architectures": ["Qwen2MoeForCausalLM"], "num_key_value_heads": 2,
                  "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 64},
    "deepseek_v3": {"architectures": ["DeepseekV3ForCausalLM"], "num_key_value_heads": 4,
                    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
                    "qk_nope_head_dim": 8, "v_head_dim": 16, "first_k_dense_replace": 1,
                    "n_group": 1, "topk_group": 1},
    "mamba": {"architectures": ["MambaForCausalLM"], "state_size": 8, "expand": 2,
              "conv_kernel": 4},
    "bert-classifier": {"architectures": ["BertForSequenceClassification"]},
    "gpt2-classifier": {"architectures": ["GPT2ForSequenceClassification"], **GPT},
}
OPTIONS = {
    "kernels": {"fused_kernels": ["layer_norm", "rms_norm", "gelu", "swiglu",
                                  "linear_cross_entropy"]},
    "sdpa": {"attention": "sdpa"},
    "checkpointing full": {"checkpointing": "full"},
    "checkpointing selective": {"checkpointing": "selective"},
    "bf16 weights": {"precision": "bf16", "weights": "bf16"},
}
LIMITS = {"bf16 weights": (5e-3, 5e-2)}
"""(loss, gradient) apart beyond which a row is flagged; 1e-4 and 1e-3 otherwise (fp32 alike)."""


def model_type(name: str) -> str:
    return name.split("-")[0]


def check(name: str, folder: Path) -> list[dict]:
    import torch

    import strategies
    from strategies import TuneConfig
    from tuner_tui.engine.workloads import load

    path = folder / name
    path.mkdir(parents=True, exist_ok=True)
    doc = {**TINY, "model_type": model_type(name), **ARCHITECTURES[name]}
    (path / "config.json").write_text(json.dumps(doc))
    try:
        workload = load(f"hf:{path}", seq_len=32)
        torch.manual_seed(0)
        reference = workload.build_model()
        batch = workload.batch(0, 2, torch.device("cpu"))
        want = workload.loss(reference, batch)
        want.backward()
    except Exception as exc:  # (what a user would read: the workload's one line)
        return [{"architecture": name, "option": "build", "ok": False,
                 "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}]
    grads = {n: p.grad.clone() for n, p in reference.named_parameters() if p.grad is not None}
    scale = max(g.norm().item() for g in grads.values())
    rows = []
    for option, values in OPTIONS.items():
        row = {"architecture": name, "option": option}
        try:
            torch.manual_seed(0)
            model = workload.build_model()
            tuned = strategies.apply(TuneConfig.from_dict(values), model)
            got = workload.loss(model, batch)
            got.backward()
            apart = max(((p.grad.float() - grads[n]).norm() / scale).item()
                        for n, p in model.named_parameters() if p.grad is not None and n in grads)
            loss_apart = abs(got.item() - want.item()) / abs(want.item())
            loss_limit, grad_limit = LIMITS.get(option, (1e-4, 1e-3))
            row.update(ok=loss_apart <= loss_limit and apart <= grad_limit,
                       loss_apart=loss_apart, gradients_apart=apart,
                       report={k: v for k, v in tuned.report.items()
                               if k.startswith(("fused_kernels", "attention", "checkpointing"))})
        except Exception as exc:
            row.update(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        rows.append(row)
    # The search reads what applies from the workload's facts (found on the meta device): a
    # kernel that swapped modules here but is declared to find none would never be tried.
    swapped = next((r["report"].get("fused_kernels", {}) for r in rows
                    if r["option"] == "kernels" and "report" in r), {})
    declared = workload.inapplicable()
    contradicted = sorted(k for k, n in swapped.items()
                          if n and (f"fused_kernels={k}" in declared or "fused_kernels" in declared))
    rows.append({"architecture": name, "option": "facts", "ok": not contradicted,
                 "loss_apart": 0.0, "gradients_apart": 0.0,
                 "report": {"swapped but declared inapplicable": contradicted}})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"of {', '.join(ARCHITECTURES)} (all by default)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in ARCHITECTURES]
    if unknown:
        print(f"unknown architecture {unknown[0]!r}: allowed are {', '.join(ARCHITECTURES)}",
              file=sys.stderr)
        return 2
    os.environ.setdefault("TRITON_INTERPRET", "1")
    for path in (ROOT, ROOT / "pythonpath"):
        sys.path.insert(0, str(path))
    import torch
    import transformers
    import triton

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.names or ARCHITECTURES:
            for row in check(name, Path(folder)):
                rows.append(row)
                figures = ("" if "error" in row else
                           f"loss {row['loss_apart']:.1e} gradients {row['gradients_apart']:.1e} "
                           f"{json.dumps(row['report'])}")
                print(f"{name:16s} {row['option']:24s} {'ok ' if row['ok'] else 'BAD'} "
                      f"{row.get('error', figures)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({
            "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores, no GPU",
            "python": platform.python_version(), "torch": torch.__version__,
            "triton": triton.__version__, "transformers": transformers.__version__,
            "command": "TRITON_INTERPRET=1 python benchmarks/hf_architectures.py "
                       + " ".join(sys.argv[1:]),
            "rows": rows}, indent=1))
    bad = [r for r in rows if not r["ok"]]
    print(f"{len(rows) - len(bad)} of {len(rows)} ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
