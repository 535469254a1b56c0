"""attention = sdpa on Hugging Face models: calls without a mask, positions or cache reach SDPA
as `is_causal=True` with no mask, also while torch.compile traces (where transformers itself
builds the full mask), with the same loss and gradients; calls with a padding mask or
positions keep their mask."""

import copy

import pytest
import torch
import torch.nn.functional as F

import strategies
from strategies import TuneConfig

pytest.importorskip("transformers")

from examples import hf_causal_lm  # noqa: E402

SDPA = TuneConfig.from_dict({"attention": "sdpa"})


@pytest.fixture
def sdpa_calls(monkeypatch):
    """(mask given, is_causal) of every SDPA call, recorded while tracing too."""
    calls = []
    original = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask is not None, is_causal))
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


def _pair(name):
    workload = getattr(hf_causal_lm, name)("cpu")
    torch.manual_seed(0)
    reference = workload.build_model()
    return workload, reference, copy.deepcopy(reference)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_traced_calls_without_a_mask_reach_sdpa_as_causal_with_the_same_loss(name, sdpa_calls):
    workload, reference, switched = _pair(name)
    tuned = strategies.apply(SDPA, switched)
    assert tuned.report["attention"]["hf_models"] >= 1
    ids = workload.batch(0, 2, torch.device("cpu"))[0]
    # backend="eager": dynamo traces as torch.compile does, without Inductor's compile time.
    want = torch.compile(reference, backend="eager")(input_ids=ids, labels=ids).loss
    assert sdpa_calls and all(mask for mask, _ in sdpa_calls)  # transformers' own: full mask
    sdpa_calls.clear()
    torch._dynamo.reset()
    got = torch.compile(switched, backend="eager")(ids, labels=ids).loss
    assert sdpa_calls and all(causal and not mask for mask, causal in sdpa_calls)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    want.backward()
    got.backward()
    for (n, a), (_, b) in zip(reference.named_parameters(), switched.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=n)
    torch._dynamo.reset()


def test_a_second_model_built_from_the_same_config_gets_the_causal_path_too(sdpa_calls):
    # set_attn_implementation changes the config object, which the workload's builder shares
    workload = hf_causal_lm.llama("cpu")
    first = workload.build_model()
    assert strategies.apply(SDPA, first).report["attention"]["hf_models"] >= 1
    second = workload.build_model()
    assert strategies.apply(SDPA, second).report["attention"]["hf_models"] >= 1
    ids = workload.batch(0, 2, torch.device("cpu"))[0]
    torch.compile(second, backend="eager")(ids, labels=ids).loss.backward()
    assert sdpa_calls and all(causal and not mask for mask, causal in sdpa_calls)
    torch._dynamo.reset()


def test_a_padding_mask_or_positions_keep_the_mask(sdpa_calls):
    workload, reference, switched = _pair("llama")
    strategies.apply(SDPA, switched)
    ids = workload.batch(0, 2, torch.device("cpu"))[0]
    padding = torch.ones_like(ids)
    padding[1, -5:] = 0
    got = switched(input_ids=ids, attention_mask=padding, labels=ids).loss
    assert sdpa_calls and all(mask for mask, _ in sdpa_calls)
    torch.testing.assert_close(
        got, reference(input_ids=ids, attention_mask=padding, labels=ids).loss)
    sdpa_calls.clear()
    # Two packed sequences in each row: positions restart half-way.
    half = ids.shape[1] // 2
    positions = torch.cat([torch.arange(half), torch.arange(ids.shape[1] - half)]).expand_as(ids)
    got = switched(input_ids=ids, position_ids=positions, labels=ids).loss
    assert sdpa_calls and all(mask for mask, _ in sdpa_calls)
    torch.testing.assert_close(
        got, reference(input_ids=ids, position_ids=positions, labels=ids).loss)


def test_with_checkpointing_and_the_fused_loss_the_causal_path_holds(sdpa_calls):
    import gputune_kernels

    workload, reference, switched = _pair("llama")
    fused = ["linear_cross_entropy"] if gputune_kernels.available()[0] else []
    config = TuneConfig.from_dict({"attention": "sdpa", "checkpointing": "full",
                                   "fused_kernels": fused})
    strategies.apply(config, switched)
    ids = workload.batch(0, 2, torch.device("cpu"))[0]
    got = torch.compile(switched, backend="eager")(ids, labels=ids).loss
    got.backward()
    assert sdpa_calls and all(causal and not mask for mask, causal in sdpa_calls)
    torch.testing.assert_close(got, reference(input_ids=ids, labels=ids).loss,
                               rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
