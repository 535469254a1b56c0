"""A small model that uses every kernel compiles with fullgraph=True (no graph break).

On the CPU the kernels run in Triton's interpreter, where torch.library.wrap_triton cannot
trace a kernel; there the ops are kept opaque in the graph (decompose_custom_triton_ops off)
and the graph runs with backend='aot_eager', which still traces forward and backward through
every custom op. On CUDA the real inductor decomposes the ops and compiles the kernels in.
"""

import math

import pytest
import torch
import torch._functorch.config

import gputune_kernels
from kernel_testing import DEVICE


class TinyModel(torch.nn.Module):
    def __init__(self, dim=16, vocab=40):
        super().__init__()
        self.ln_w = torch.nn.Parameter(torch.randn(dim))
        self.ln_b = torch.nn.Parameter(torch.randn(dim))
        self.rms_w = torch.nn.Parameter(torch.randn(dim))
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.head = torch.nn.Parameter(torch.randn(vocab, dim) / math.sqrt(dim))

    def forward(self, x, target):
        h = gputune_kernels.layer_norm(x, self.ln_w, self.ln_b)
        att = gputune_kernels.causal_softmax(h @ h.transpose(-2, -1), 1 / math.sqrt(h.shape[-1]))
        h = gputune_kernels.rms_norm(h + att @ h, self.rms_w)
        a, b = self.up(h).chunk(2, dim=-1)
        h = h + (gputune_kernels.swiglu(a, b) + gputune_kernels.gelu_tanh(a))[..., : h.shape[-1]]
        h = gputune_kernels.softmax(h) * h
        flat = h.flatten(0, 1)
        return gputune_kernels.cross_entropy(flat @ self.head.T, target) + gputune_kernels.fused_linear_cross_entropy(
            flat, self.head, target
        )


def _compiled_matches_eager(backend):
    torch.manual_seed(0)
    model = TinyModel().to(DEVICE)
    x = torch.randn(2, 8, 16, device=DEVICE)
    target = torch.randint(0, 40, (16,), device=DEVICE)
    loss = model(x, target)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend)  # a graph break would raise
    loss_c = compiled(x, target)
    loss_c.backward()
    torch.testing.assert_close(loss_c, loss, atol=1e-4, rtol=1e-4)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (interpreter) variant")
def test_model_using_every_kernel_compiles_fullgraph_on_cpu():
    with torch._functorch.config.patch(decompose_custom_triton_ops=False):
        _compiled_matches_eager("aot_eager")


@pytest.mark.gpu
def test_model_using_every_kernel_compiles_fullgraph_with_inductor_gpu():
    _compiled_matches_eager("inductor")


def test_row_params_takes_a_symbolic_row_length():
    """Under dynamic shapes the norms get their row length as a SymInt (seen on the H200: a
    second shape recompiled with dynamic dims and the norms failed with "unhashable SymInt")."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from gputune_kernels import _common

    env = ShapeEnv()
    n_cols = env.create_symintnode(env.create_symbol(768, ConstantSource("n_cols")), hint=768)
    assert _common.row_params(n_cols) == _common.row_params(768) == (1024, 4)


@pytest.mark.gpu
def test_norms_compile_with_dynamic_shapes_gpu():
    """The norms inside torch.compile(dynamic=True) at two shapes, against eager."""
    for op, extra in ((gputune_kernels.rms_norm, ()), (gputune_kernels.layer_norm, (True,))):
        torch._dynamo.reset()

        def f(x, w, b=None):
            return op(x, w, b) if extra else op(x, w)

        compiled = torch.compile(f, dynamic=True, fullgraph=True)
        for rows, cols in ((64, 768), (96, 512)):
            x = torch.randn(rows, cols, device=DEVICE, requires_grad=True)
            w = torch.randn(cols, device=DEVICE, requires_grad=True)
            args = (x, w, torch.randn(cols, device=DEVICE)) if extra else (x, w)
            torch.testing.assert_close(compiled(*args), f(*args), atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_norms_compile_with_the_partial_sums_in_torch_gpu(monkeypatch):
    """With the partial sums added by torch ops inside the norms' backward (kernels/_partial_sums.py,
    MODE "torch"), inductor compiles them in and the gradients match eager's."""
    from gputune_kernels import _partial_sums

    monkeypatch.setattr(_partial_sums, "MODE", "torch")
    for op, n_extra in ((gputune_kernels.rms_norm, 0), (gputune_kernels.layer_norm, 1)):
        torch._dynamo.reset()
        x = torch.randn(64, 768, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
        params = [torch.randn(768, device=DEVICE, requires_grad=True) for _ in range(1 + n_extra)]
        dy = torch.randn(64, 768, device=DEVICE, dtype=torch.bfloat16)
        eager = torch.autograd.grad(op(x, *params), [x, *params], dy)
        compiled = torch.compile(lambda x, *p: op(x, *p), fullgraph=True)
        got = torch.autograd.grad(compiled(x, *params), [x, *params], dy)
        for g, e in zip(got, eager):
            torch.testing.assert_close(g, e, atol=2e-2, rtol=2e-2)
