"""The matmuls' FLOPs counted from their input shapes: the formulas on known shapes, and a real
torch.profiler run on the CPU whose matmul rates a profile reports per precision."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from tuner_tui.engine.matmul_flops import ATTENTION, MATMUL, family, op_flops
from tuner_tui.engine.profile import STEP_MARKER, flop_line, summarize
from tuner_tui.engine.profiler import activities_of, activities_of_profile, raw_details

MM = 2 * 64 * 128 * 256  # (64x128) @ (128x256)
BMM = 2 * 4 * 32 * 48 * 16  # 4 x (32x48) @ (48x16)
LINEAR = 2 * (3 * 10) * 128 * 32  # (3, 10, 128) @ (128 -> 32) with a bias
# SDPA, B=2, H=4, L=16, E=8, causal: 16*17/2 of the 256 scores; forward 2*B*H*scores*(E+E)
SDPA_FORWARD = 2 * 2 * 4 * (16 * 17 // 2) * (8 + 8)


def test_each_matmul_counts_two_flops_per_multiply_add_from_its_shapes():
    assert op_flops("aten::mm", [[64, 128], [128, 256]]) == MM
    assert op_flops("aten::addmm", [[256], [64, 128], [128, 256], [], []]) == MM
    assert op_flops("aten::_addmm_activation", [[256], [64, 128], [128, 256]]) == MM
    assert op_flops("aten::bmm", [[4, 32, 48], [4, 48, 16]]) == BMM
    assert op_flops("aten::baddbmm", [[4, 32, 16], [4, 32, 48], [4, 48, 16], [], []]) == BMM
    assert op_flops("aten::_scaled_mm", [[64, 128], [128, 256], [], [], [], [], [], []]) == MM
    assert op_flops("aten::mm", [[64, 128], [128, 256], [64, 256]]) == MM  # mm(out=...)
    assert op_flops("aten::mv", [[64, 128], [128]]) == 2 * 64 * 128
    assert op_flops("aten::dot", [[128], [128]]) == 2 * 128
    # linear and matmul decompose into the ops above, which are counted instead.
    assert op_flops("aten::linear", [[64, 128], [256, 128], [256]]) == 0
    assert family("aten::matmul") is None and family("aten::mm") == MATMUL
    assert op_flops("aten::mm", []) == 0  # shapes not recorded
    assert op_flops("aten::add", [[4], [4]]) == 0


def test_attention_counts_its_two_matmuls_and_only_the_unmasked_scores_when_causal():
    q = [2, 4, 16, 8]
    name = "aten::_scaled_dot_product_flash_attention"
    full = op_flops(name, [q, q, q, [], [], [], []], [None, None, None, 0.0, False, False, None])
    causal = op_flops(name, [q, q, q, [], [], [], []], [None, None, None, 0.0, True, False, None])
    assert full == 2 * 2 * 4 * 16 * 16 * (8 + 8) and causal == SDPA_FORWARD
    # Backward: dV, dP, dQ, dK (the query is the second input, after the output's gradient).
    backward = op_flops("aten::_scaled_dot_product_efficient_attention_backward",
                        [q, q, q, q, [], q, [2, 4, 16], [], [], [], [], [], []],
                        [None] * 11 + [True, None])
    assert backward == 2 * SDPA_FORWARD
    grouped = op_flops(name, [q, [2, 1, 16, 8], [2, 1, 16, 8]], [None] * 4 + [False])
    assert grouped == full  # the query's heads do the work, whatever the key's
    assert family("aten::_scaled_dot_product_cudnn_attention") == ATTENTION
    assert family("aten::scaled_dot_product_attention") is None  # its implementation counts


def _profiled_steps(steps: int = 3):
    """A real CPU profile of `steps` marked steps of known matmuls, forward and backward."""
    torch.manual_seed(0)
    a, b = torch.randn(64, 128), torch.randn(128, 256)
    bias = torch.randn(256)
    x, y = torch.randn(4, 32, 48), torch.randn(4, 48, 16)
    inputs = torch.randn(3, 10, 128)
    layer = torch.nn.Linear(128, 32)
    q = torch.randn(2, 4, 16, 8, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        for i in range(steps):
            with record_function(f"{STEP_MARKER}{i}"):
                torch.mm(a, b)
                torch.addmm(bias, a, b)
                torch.bmm(x, y)
                torch.baddbmm(torch.zeros(4, 32, 16), x, y)
                layer(inputs)
                F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    return prof


def test_a_real_cpu_profile_counts_the_flops_of_each_matmul_from_its_shapes():
    activities = activities_of_profile(_profiled_steps())
    counted = {}
    for a in activities:
        if a.flops:
            counted.setdefault(a.name, set()).add(a.flops)
    assert counted["aten::mm"] == {MM}
    assert counted["aten::addmm"] == {MM, LINEAR}  # the linear's bias goes in an addmm
    assert counted["aten::bmm"] == {BMM} and counted["aten::baddbmm"] == {BMM}
    assert counted["aten::_scaled_dot_product_flash_attention_for_cpu"] == {SDPA_FORWARD}
    assert counted["aten::_scaled_dot_product_flash_attention_for_cpu_backward"] == {2 * SDPA_FORWARD}
    assert not any(a.flops for a in activities if a.name in ("aten::linear", "aten::matmul"))
    assert {a.dtype for a in activities if a.flops} == {"float"}
    # The profiler's own count agrees where it has one (it has none for attention).
    for a in activities:
        if a.profiler_flops:
            assert a.profiler_flops == a.flops, a.name

    profile_ = summarize(activities, "cpu")
    (matmul,) = profile_["matmul"]
    assert matmul["precision"] == "fp32"
    assert matmul["flops_per_step"] == pytest.approx(2 * MM + 2 * BMM + LINEAR)
    assert matmul["tflops"] > 0 and matmul["ms_per_step"] > 0
    assert matmul["peak_tflops"] is None and matmul["of_peak"] is None  # no peak on the CPU
    assert matmul["profiler_flops_per_step"] == pytest.approx(matmul["flops_per_step"])
    (sdpa,) = profile_["sdpa"]
    assert sdpa["flops_per_step"] == pytest.approx(3 * SDPA_FORWARD)
    assert sdpa["tflops"] > 0 and sdpa["profiler_flops_per_step"] is None
    line = flop_line(profile_)
    assert line == (f"matmul: {matmul['tflops'] * 1e3:.1f} GFLOP/s fp32; "
                    f"SDPA: {sdpa['tflops'] * 1e3:.1f} GFLOP/s fp32 (no peak on the CPU)")


class _Torch211Event:
    """A FunctionEvent as torch before 2.12 gives it: no activity_type, input_dtypes or
    linked_correlation_id."""

    def __init__(self, event):
        self._event = event

    def __getattr__(self, name):
        if name in ("activity_type", "input_dtypes", "linked_correlation_id"):
            raise AttributeError(name)
        return getattr(self._event, name)


def test_before_torch_2_12_links_and_dtypes_come_from_the_raw_events():
    prof = _profiled_steps(2)
    counted, links = raw_details(prof)
    events = [_Torch211Event(e) for e in prof.events()]
    mm = next(e for e in events if e.name == "aten::mm")
    # A GPU kernel of that mm, as torch 2.11 lists it: its own correlation id, no link.
    kernel = SimpleNamespace(name="sm90_xmma_gemm_f32f32", device_type="DeviceType.CUDA",
                             is_user_annotation=False, id=900001, device_resource_id=7,
                             time_range=SimpleNamespace(start=1.0, end=2.0), thread=0, flops=0)
    activities = activities_of(events + [kernel], counted, {**links, 900001: mm.id})
    op = next(a for a in activities if a.name == "aten::mm")
    assert op.kind == "op" and op.flops == MM and op.dtype == "float"
    (gemm,) = [a for a in activities if a.kind == "kernel"]
    assert gemm.link == mm.id and gemm.track == 7
    assert sum(a.kind == "annotation" for a in activities) == 2  # the step markers
