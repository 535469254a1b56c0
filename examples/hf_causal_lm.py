"""A Hugging Face transformers causal LM built from a config (no weights are downloaded).

    gputune bench --workload examples.hf_causal_lm:llama --device cpu
    gputune bench --workload examples.hf_causal_lm:gpt2
    gputune --workload examples.hf_causal_lm:llama          # the dashboard

On a GPU the Llama example has the shape of Llama 3.2 1B; on the CPU a tiny one. gputune's
strategies recognise what they can in these models: the decoder layers as blocks
(checkpointing, per-block compile), LlamaRMSNorm and nn.LayerNorm for the fused norms, GPT-2's
NewGELUActivation for the tanh-GELU kernel and Llama's gated MLP for the SwiGLU kernel, and, with
`linear_cross_entropy`, the loss the model computes inside `forward(labels=...)`, which becomes
the fused linear + cross-entropy (strategies/hf_causal_lm_loss.py).
"""

from __future__ import annotations

import torch

from tuner_tui.engine.workloads import Workload
from tuner_tui.engine.workloads.data import SyntheticTokens


def _causal_lm_workload(name, build, vocab_size, seq_len, batch_size, seed, n_layer, n_head,
                        head_dim) -> Workload:
    tokens = SyntheticTokens(vocab_size, seq_len, seed)

    def loss(model, batch):
        inputs, targets = batch
        # Hugging Face shifts labels itself; pass the unshifted sequence as labels.
        full = torch.cat([inputs[:, :1], targets], dim=1)
        return model(input_ids=full[:, :-1], labels=full[:, :-1]).loss

    def flops(model):
        n = sum(p.numel() for p in model.parameters())
        n -= model.get_input_embeddings().weight.numel()
        return 6 * n + 12 * n_layer * n_head * head_dim * seq_len

    return Workload(
        name=name, build_model=build, batch=tokens.batch, items_per_sample=seq_len,
        default_batch_size=batch_size, loss=loss, flops_per_item=flops,
    )


def llama(device: str = "cpu", seed: int = 0, seq_len: int | None = None) -> Workload:
    from transformers import LlamaConfig, LlamaForCausalLM

    if device == "cuda":
        cfg = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                   num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                   max_position_embeddings=4096, rope_theta=500000.0)
        seq, batch, name = seq_len or 2048, 2, "hf-llama-1b"
    else:
        cfg = dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
        seq, batch, name = seq_len or 64, 8, "hf-llama-tiny"
    config = LlamaConfig(**cfg, use_cache=False, bos_token_id=None, eos_token_id=None,
                         attn_implementation="sdpa")
    return _causal_lm_workload(
        name, lambda: LlamaForCausalLM(config), config.vocab_size, seq, batch, seed,
        config.num_hidden_layers, config.num_attention_heads,
        config.hidden_size // config.num_attention_heads,
    )


def gpt2(device: str = "cpu", seed: int = 0, seq_len: int | None = None) -> Workload:
    from transformers import GPT2Config, GPT2LMHeadModel

    if device == "cuda":
        cfg = dict(vocab_size=50304, n_embd=768, n_layer=12, n_head=12, n_positions=1024)
        seq, batch, name = seq_len or 1024, 16, "hf-gpt2-124m"
    else:
        cfg = dict(vocab_size=512, n_embd=64, n_layer=2, n_head=2, n_positions=256)
        seq, batch, name = seq_len or 64, 8, "hf-gpt2-tiny"
    config = GPT2Config(**cfg, use_cache=False, bos_token_id=None, eos_token_id=None,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return _causal_lm_workload(
        name, lambda: GPT2LMHeadModel(config), config.vocab_size, seq, batch, seed,
        config.n_layer, config.n_head, config.n_embd // config.n_head,
    )
