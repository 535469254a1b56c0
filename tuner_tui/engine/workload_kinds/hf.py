"""`hf:PATH`: a Hugging Face transformers model built from its config.json, random weights.

PATH is a config.json or a folder holding one, as a model repository has it. The model's head
follows the config's `architectures`: a causal LM (`...ForCausalLM`, `...LMHeadModel`, or a
config that names none) learns the next token; a sequence classifier
(`...ForSequenceClassification`) learns a label per sequence. Both are called as Hugging Face
users call them, `model(input_ids, labels=...)`, and train on `.loss`, so gputune's swaps for
these models apply (SDPA without a built causal mask, the fused linear + cross-entropy loss).

The data are synthetic tokens (or the --data file's bytes), --seq-len tokens a sequence (by
default the config's context, at most 1024). The model is built in fp32 whatever dtype the
config names (the `weights` option chooses), with SDPA attention where the model has it, no KV
cache, and dropout off, so that every configuration's losses compare with the fp32 reference's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tuner_tui.engine.paths import module_exists

ARGUMENT = "PATH"
EXAMPLE = "hf:models/Qwen2.5-0.5B (a folder holding config.json)"
TAKES = ("seq_len", "data")
WHY_NOT_TAKEN = ""

DEFAULT_SEQ_LEN = 1024
HEADS = {
    "causal_lm": ("ForCausalLM", "LMHeadModel"),
    "sequence_classification": ("ForSequenceClassification",),
}
"""The heads gputune builds, by the endings of the class names in `architectures`."""
# Config keys that count experts: a mixture of experts runs a few of them per token, so 6N
# FLOPs per token would overstate its work; its MFU is left out.
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def config_file(arg: str) -> Path:
    path = Path(arg).expanduser()
    return path / "config.json" if path.is_dir() else path


def read_config(arg: str) -> tuple[dict, str | None]:
    """The config's JSON and None, or {} and what is wrong with it."""
    path, file = Path(arg).expanduser(), config_file(arg)
    if not path.exists():
        return {}, f"{arg} does not exist: give a config.json or a folder holding one"
    if not file.is_file():
        return {}, f"{arg} holds no config.json"
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        return {}, f"cannot read {file}: {exc.strerror or exc}"
    except ValueError as exc:
        return {}, f"{file} is not valid JSON: {exc}"
    if not isinstance(doc, dict) or not isinstance(doc.get("model_type"), str):
        return {}, (f"{file} names no model_type: a Hugging Face config.json does, e.g. "
                    '"model_type": "llama"')
    return doc, None


def head_of(doc: dict) -> tuple[str, str | None]:
    """The head `architectures` names (a key of HEADS), or "" and why gputune builds none."""
    architectures = doc.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        return "", "architectures must be a list of class names, e.g. [\"LlamaForCausalLM\"]"
    if not architectures:
        return "causal_lm", None
    for head, endings in HEADS.items():
        if architectures[0].endswith(endings):
            return head, None
    return "", (f"architecture {architectures[0]!r} is not one gputune builds: causal LMs "
                "(...ForCausalLM, ...LMHeadModel) and sequence classifiers "
                "(...ForSequenceClassification)")


def check(arg: str) -> str | None:
    if not module_exists("transformers"):
        return "needs the transformers package: pip install transformers"
    doc, problem = read_config(arg)
    return problem or head_of(doc)[1]


def workload_name(arg: str, doc: dict) -> str:
    """`hf:<folder>#<digest of the config>`: the result store keys on the name, so an edited
    config is a new workload."""
    file = config_file(arg).resolve()
    stem = file.parent.name if file.name == "config.json" else file.stem
    digest = hashlib.sha1(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:8]
    return f"hf:{stem}#{digest}"


def build(arg: str, seq_len: int | None, seed: int, data: str | None, device: str):
    import torch

    from tuner_tui.engine.workload_kinds import first_line, import_package
    from tuner_tui.engine.workloads import Workload, WorkloadError
    from tuner_tui.engine.workloads.data import SyntheticTokens, TextFileTokens

    transformers = import_package("transformers")
    doc, _ = read_config(arg)
    head, _ = head_of(doc)
    config = _read_pretrained_config(transformers, config_file(arg), doc["model_type"])
    _prepare(config, head)
    auto = (transformers.AutoModelForCausalLM if head == "causal_lm"
            else transformers.AutoModelForSequenceClassification)
    # Built once on the meta device (no memory, no compute): to refuse what does not build
    # now, to learn whether the model attends with SDPA, and to count its FLOPs.
    attention = "sdpa"
    try:
        with torch.device("meta"):
            probe = auto.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    except ValueError:  # this model has no SDPA attention: its own, named ("eager"), since
        # the refused request stays in the config and would be asked again by default
        attention = "eager"
        try:
            with torch.device("meta"):
                probe = auto.from_config(config, dtype=torch.float32, attn_implementation=attention)
        except Exception as exc:
            raise WorkloadError(f"{auto.__name__} cannot build model_type "
                                f"{doc['model_type']!r}: {first_line(exc)}") from None

    context = getattr(config, "max_position_embeddings", None)
    seq = seq_len or min(context or DEFAULT_SEQ_LEN, DEFAULT_SEQ_LEN)
    if isinstance(context, int) and seq > context:
        raise WorkloadError(f"--seq-len {seq} is longer than the config's context "
                            f"(max_position_embeddings = {context})")
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 2:
        raise WorkloadError(f"{config_file(arg)} names no vocab_size")
    if data and vocab < 256:
        raise WorkloadError(f"--data trains on bytes (256 token ids); the config's vocab_size "
                            f"is {vocab}")
    tokens = TextFileTokens(data, seq, seed) if data else SyntheticTokens(vocab, seq, seed)

    def build_model():
        return auto.from_config(config, dtype=torch.float32, attn_implementation=attention)

    if head == "causal_lm":
        batch = tokens.batch

        def loss(model, b):
            # Hugging Face shifts the labels itself: the inputs are the labels.
            return model(b[0], labels=b[0]).loss
    else:
        batch = _classification_batches(tokens, config)

        def loss(model, b):
            return model(b[0], labels=b[1]).loss

    flops = _flops_per_token(probe, config, seq)
    return Workload(
        name=workload_name(arg, doc),
        build_model=build_model,
        batch=batch,
        items_per_sample=seq,
        default_batch_size=max(1, min(64, 16384 // seq)) if device == "cuda" else 8,
        loss=loss,
        flops_per_item=None if flops is None else (lambda model: flops),
    )


def _read_pretrained_config(transformers, file: Path, model_type: str):
    from tuner_tui.engine.workload_kinds import first_line
    from tuner_tui.engine.workloads.errors import WorkloadError

    try:
        return transformers.AutoConfig.from_pretrained(str(file))
    except (ValueError, KeyError, OSError, TypeError) as exc:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        if model_type not in CONFIG_MAPPING_NAMES:
            own_code = ("its config points to the model's own code (auto_map), which gputune "
                        "does not run" if "auto_map" in json.loads(file.read_text(encoding="utf-8"))
                        else "a newer transformers may")
            raise WorkloadError(
                f"unknown architecture: transformers {transformers.__version__} does not know "
                f"model_type {model_type!r} ({own_code})") from None
        raise WorkloadError(f"{file}: {first_line(exc)}") from None


def _prepare(config, head: str) -> None:
    """Training settings: no KV cache, dropout off (so compiled and eager runs draw no
    different random masks and their losses compare), a padding id for a classifier (which
    pools the last token that is not padding, and needs the id to find it)."""
    config.use_cache = False
    for key, value in list(config.to_dict().items()):
        if (key.endswith(("dropout", "pdrop", "drop", "dropout_prob", "dropout_rate", "drop_path_rate"))
                and isinstance(value, float) and value > 0):
            setattr(config, key, 0.0)
    if head == "sequence_classification" and getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = 0


def _classification_batches(tokens, config):
    """Token batches with a label per sequence that the tokens decide (the first token's id,
    modulo the classes), so there is something to learn; as float targets for a regression
    (one label) or a multi-label problem, as Hugging Face's loss wants them."""
    import torch

    classes = int(config.num_labels)
    problem = getattr(config, "problem_type", None)

    def batch(step: int, batch_size: int, device):
        inputs, _ = tokens.batch(step, batch_size, device)
        labels = inputs[:, 0] % max(classes, 2)
        if classes == 1 or problem == "regression":
            target = labels.float()
            return inputs, target if classes == 1 else target[:, None].expand(-1, classes).contiguous()
        if problem == "multi_label_classification":
            return inputs, torch.nn.functional.one_hot(labels, classes).float()
        return inputs, labels

    return batch


def _flops_per_token(model, config, seq: int) -> float | None:
    """Training FLOPs per token: 6 per parameter that multiplies (embedding lookups do not;
    a head tied to the input embedding does), plus attention's 12 x layers x width x seq, as
    nanoGPT and PaLM count them. None for a mixture of experts, and where the config does not
    say its shapes."""
    from torch import nn

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if any((getattr(text, k, None) or 0) > 1 for k in _EXPERT_KEYS):
        return None
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    n = sum(p.numel() for p in model.parameters() if id(p) not in lookups)
    head = model.get_output_embeddings()
    if head is not None and id(head.weight) in lookups:
        n += head.weight.numel()
    layers = getattr(text, "num_hidden_layers", None)
    heads = getattr(text, "num_attention_heads", None)
    width = getattr(text, "hidden_size", None)
    if not all(isinstance(v, int) and v > 0 for v in (layers, heads, width)):
        return None
    head_dim = getattr(text, "head_dim", None) or width // heads
    return 6 * n + 12 * layers * heads * head_dim * seq
