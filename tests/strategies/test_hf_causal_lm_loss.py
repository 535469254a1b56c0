"""The fused linear + cross-entropy swapped into Hugging Face causal LMs: HF's loss and
gradients, with the user's code unchanged (`model(input_ids, labels=...).loss`)."""

import copy

import pytest
import torch

import strategies
from strategies import TuneConfig
from strategies.hf_causal_lm_loss import why_not_swappable

pytest.importorskip("transformers")

from examples import hf_causal_lm  # noqa: E402

LCE = TuneConfig.from_dict({"fused_kernels": ["linear_cross_entropy"]})


@pytest.fixture(autouse=True)
def _kernels_run_here():
    import gputune_kernels

    if not gputune_kernels.available()[0]:
        pytest.skip("Triton kernels cannot run here")


def _pair(name):
    workload = getattr(hf_causal_lm, name)("cpu")
    torch.manual_seed(0)
    reference = workload.build_model()
    return workload, reference, copy.deepcopy(reference)


def _assert_same_gradients(reference, fused, rtol=1e-4):
    for (name, a), (_, b) in zip(reference.named_parameters(), fused.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=rtol, atol=1e-6, msg=name)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_swapped_loss_gives_hugging_faces_loss_and_gradients(name):
    workload, reference, fused = _pair(name)
    tuned = strategies.apply(LCE, fused)
    assert tuned.report["fused_kernels"] == {"linear_cross_entropy": 1}
    ids = workload.batch(0, 3, torch.device("cpu"))[0]
    labels = ids.clone()
    labels[0, 5:] = -100  # padding, as a data collator marks it
    labels[2, :3] = -100
    want = reference(input_ids=ids, labels=labels)
    got = fused(ids, labels=labels)  # positional input_ids, as users write it
    assert got.logits is None  # the point: the (batch, seq, vocab) logits are never built
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    want.loss.backward()
    got.loss.backward()
    _assert_same_gradients(reference, fused)


def test_without_labels_the_model_gives_its_logits():
    workload, reference, fused = _pair("llama")
    strategies.apply(LCE, fused)
    ids = workload.batch(0, 2, torch.device("cpu"))[0]
    torch.testing.assert_close(fused(ids).logits, reference(ids).logits)


def test_num_items_in_batch_sums_then_divides_as_hugging_face_does():
    workload, reference, fused = _pair("gpt2")
    strategies.apply(LCE, fused)
    ids = workload.batch(0, 2, torch.device("cpu"))[0]
    items = torch.tensor(500)
    want = reference(input_ids=ids, labels=ids, num_items_in_batch=items).loss
    got = fused(input_ids=ids, labels=ids, num_items_in_batch=items).loss
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_bf16_autocast_loss_stays_close():
    workload, reference, fused = _pair("llama")
    strategies.apply(LCE, fused)
    ids = workload.batch(0, 2, torch.device("cpu"))[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = reference(input_ids=ids, labels=ids).loss
        got = fused(input_ids=ids, labels=ids).loss
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-2, atol=0)  # bf16 matmuls either way


def test_models_that_change_their_logits_are_left_alone():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    config.final_logit_softcapping = 30.0
    model = LlamaForCausalLM(config)
    assert "soft-capped" in why_not_swappable(model)
    tuned = strategies.apply(LCE, model)
    assert tuned.report["fused_kernels"] == {"linear_cross_entropy": 0}
    assert "soft-capped" in tuned.report["fused_kernels_not_swapped"]


def test_swap_runs_under_torch_compile(monkeypatch):
    """Under compile (inductor-first) the loss is still swapped and dynamo traces the wrapped
    forward whole (fullgraph). On a GPU that is Inductor. On the CPU the kernels run in
    Triton's interpreter, which Inductor cannot compile, so the graph runs on aot_eager with the
    custom ops kept opaque, as tests/kernels/test_compile.py does."""
    import contextlib

    import torch._functorch.config

    import strategies.compile

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    opaque_ops = contextlib.nullcontext()
    if device.type == "cpu":
        monkeypatch.setattr(strategies.compile, "compile_kwargs",
                            lambda config: {"backend": "aot_eager", "fullgraph": True})
        opaque_ops = torch._functorch.config.patch(decompose_custom_triton_ops=False)
    workload, reference, fused = _pair("llama")
    reference.to(device)
    fused.to(device)
    config = LCE.replace(compile_mode="default", compile_fullgraph=True)
    tuned = strategies.apply(config, fused)
    assert config.effective_kernels() == ("linear_cross_entropy",)
    assert tuned.report["fused_kernels"] == {"linear_cross_entropy": 1}
    batch = workload.batch(0, 2, device)
    torch._dynamo.reset()
    with opaque_ops:
        got = workload.loss(fused, batch)
        got.backward()
    want = workload.loss(reference, batch)
    want.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    _assert_same_gradients(reference, fused)


class _HeadNamedEmbedOut(torch.nn.Module):
    """A causal LM whose vocabulary head is not `lm_head`, as transformers 4 builds GPT-NeoX
    (Pythia): `embed_out`, found through `get_output_embeddings()`."""

    def __init__(self, vocab=40, width=16):
        super().__init__()
        self.decoder = _EmbeddingDecoder(vocab, width)
        self.embed_out = torch.nn.Linear(width, vocab, bias=False)

    def get_decoder(self):
        return self.decoder

    def get_output_embeddings(self):
        return self.embed_out

    def forward(self, input_ids=None, labels=None):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        logits = self.embed_out(self.decoder(input_ids)[0]).float()
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
            ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


class _EmbeddingDecoder(torch.nn.Module):
    def __init__(self, vocab, width):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.mix = torch.nn.Linear(width, width)

    def forward(self, input_ids=None):
        return (torch.tanh(self.mix(self.embed(input_ids))),)


def test_a_head_named_otherwise_is_found_by_the_output_embedding():
    torch.manual_seed(0)
    reference = _HeadNamedEmbedOut()
    fused = copy.deepcopy(reference)
    assert why_not_swappable(fused) is None
    tuned = strategies.apply(LCE, fused)
    assert tuned.report["fused_kernels"] == {"linear_cross_entropy": 1}
    ids = torch.randint(0, 40, (3, 12))
    labels = ids.clone()
    labels[1, 4:] = -100
    want = reference(input_ids=ids, labels=labels)
    got = fused(ids, labels=labels)
    assert got.logits is None
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    want.loss.backward()
    got.loss.backward()
    _assert_same_gradients(reference, fused)
