"""The recipe practitioners apply by hand to a Hugging Face Llama, measured as gputune measures:
bf16 weights (the model cast to bf16), Liger-Kernel's `apply_liger_kernel_to_llama` (its fused
linear + cross-entropy inside the HF forward, RMSNorm, SwiGLU, RoPE) and torch's fused AdamW,
on the same model, seed and batches as `--workload examples.hf_causal_lm:llama`.

Liger-Kernel is not a dependency of gputune: it is carried as a wheel for this benchmark only.

    python3 benchmarks/hand_recipe.py --batch-size 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def top_kernels(step, steps: int = 3, count: int = 15) -> list[dict]:
    """The GPU kernels that take the most time over `steps` more steps, after the measured
    ones (the profiler's cost stays out of the figures)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in events) or 1.0
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    return [{"kernel": e.key[:90], "ms_per_step": e.self_device_time_total / 1e3 / steps,
             "share": e.self_device_time_total / total} for e in events[:count]]


def hf_llama(seed: int):
    """The HF example with Liger's patch of transformers' Llama modules (before it is built)."""
    from liger_kernel.transformers import apply_liger_kernel_to_llama

    from examples.hf_causal_lm import llama

    apply_liger_kernel_to_llama()
    workload = llama(device="cuda", seed=seed)
    with torch.device("cuda"):
        return workload, workload.build_model()


class _LigerLMHeadLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        self.fused = LigerFusedLinearCrossEntropyLoss()

    def forward(self, hidden, weight, targets):
        return self.fused(weight, hidden, targets)


class _LigerSwiGLU(torch.nn.Module):
    def forward(self, gate, up):
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        return LigerSiLUMulFunction.apply(gate, up)


def builtin_llama(seed: int, name: str = "llama-1b", device: str = "cuda"):
    """gputune's built-in llama-1b with the same recipe by hand, as a user of Liger would write it
    for a model of their own: Liger's RMSNorm, SwiGLU product and fused linear + cross-entropy in
    place of the modules, and SDPA attention."""
    from liger_kernel.transformers import LigerRMSNorm

    from tuner_tui.engine import workloads

    workload = workloads.load(name, seed=seed, device=device)
    with torch.device(device):
        model = workload.build_model()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.RMSNorm):
                norm = LigerRMSNorm(child.normalized_shape[0], eps=child.eps).to(child.weight.device)
                norm.weight.data.copy_(child.weight.data)
                setattr(module, name, norm)
            elif type(child).__name__ == "SiluMul":
                setattr(module, name, _LigerSwiGLU())
            elif type(child).__name__ == "LMHeadLoss":
                setattr(module, name, _LigerLMHeadLoss())
        if hasattr(module, "attention_impl"):
            module.attention_impl = "sdpa"
    return workload, model


def split(batch, parts: int) -> list:
    """The batch in `parts` equal micro-batches along its first dim (tensors in a tuple, list or
    dict), as one accumulates gradients by hand."""
    if parts == 1:
        return [batch]
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(parts))
    if isinstance(batch, dict):
        cut = {k: split(v, parts) if isinstance(v, torch.Tensor) else [v] * parts
               for k, v in batch.items()}
        return [{k: v[i] for k, v in cut.items()} for i in range(parts)]
    cut = [split(v, parts) if isinstance(v, torch.Tensor) else [v] * parts for v in batch]
    return [type(batch)(v[i] for v in cut) for i in range(parts)]


def measure(batch_size: int, steps: int, warmup: int, seed: int, profile: bool = False,
            workload_name: str = "hf-llama", micro_batch: int = 0) -> dict:
    build = hf_llama if workload_name == "hf-llama" else builtin_llama
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(seed)
    workload, model = build(seed)
    device = torch.device("cuda")
    model.to(torch.bfloat16).train()
    base = workload.make_optimizer(model)
    optimizer = torch.optim.AdamW(
        [{**g, "foreach": False, "fused": True} for g in base.param_groups])
    times, losses = [], []

    parts = batch_size // micro_batch if micro_batch else 1

    def step(i: int = 0):
        total = 0.0
        for part in split(workload.batch(i, batch_size, device), parts):
            loss = workload.loss(model, part) / parts
            loss.backward()
            total = total + loss.detach()
        loss = total
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for i in range(warmup + steps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step(i)
        end.record()
        end.synchronize()
        losses.append(float(loss))
        if i >= warmup:
            times.append(start.elapsed_time(end))
    median = statistics.median(times)
    q = statistics.quantiles(times, n=4)
    tokens = batch_size * workload.items_per_sample
    peaks = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    kernels = top_kernels(step) if profile else None
    return {
        "label": "hand recipe: bf16 weights + Liger-Kernel + fused AdamW"
                 + (f" + micro-batches of {micro_batch}" if parts > 1 else ""),
        "batch_size": batch_size, "micro_batch_size": micro_batch if parts > 1 else 0, "sequence_length": workload.items_per_sample,
        "step_ms": median, "step_ms_q1": q[0], "step_ms_q3": q[2],
        "tokens_per_s": tokens / (median / 1e3),
        "peak_memory_bytes": peaks[0],
        "peak_reserved_bytes": peaks[1],
        "losses": losses[:8],
        **({"top_kernels": kernels} if kernels else {}),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", default="hf-llama", choices=("hf-llama", "llama-1b"),
                   help="the HF Llama example (Liger's patch) or the built-in llama-1b (Liger's "
                        "modules swapped in by hand)")
    p.add_argument("--micro-batch", type=int, default=0,
                   help="accumulate the gradients of micro-batches of this many samples (0: the "
                        "whole batch at once), as one does by hand where the batch does not fit")
    p.add_argument("--json", required=True)
    p.add_argument("--profile", action="store_true",
                   help="after the measured steps, list the GPU kernels that take the most time")
    args = p.parse_args()
    if args.micro_batch and (args.micro_batch < 1 or args.batch_size % args.micro_batch):
        p.error(f"--micro-batch {args.micro_batch} must divide --batch-size {args.batch_size}")
    import liger_kernel
    import triton

    row = measure(args.batch_size, args.steps, args.warmup, args.seed, args.profile, args.workload,
                  args.micro_batch)
    row["workload"] = args.workload
    doc = {
        "tool": "benchmarks/hand_recipe.py",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": {
            "gpu_name": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda,
            "liger_kernel": getattr(liger_kernel, "__version__", "0.8.5"),
        },
        "result": row,
    }
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"{row['label']}: {row['tokens_per_s'] / 1e3:.1f}k tokens/s, "
          f"{row['step_ms']:.1f} ms/step (IQR {row['step_ms_q1']:.1f}-{row['step_ms_q3']:.1f}), "
          f"peak {max(row['peak_memory_bytes'], row['peak_reserved_bytes']) / 2**30:.2f} GiB "
          f"(allocated {row['peak_memory_bytes'] / 2**30:.2f})")
    for k in row.get("top_kernels", []):
        print(f"  {k['share']:6.1%} {k['ms_per_step']:7.2f} ms/step  {k['kernel']}")


if __name__ == "__main__":
    main()
