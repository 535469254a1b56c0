"""`TuneConfig`: one validated, immutable choice for every option in the registry.

Torch-free, so the dashboard can hold and edit configurations. Files written by
`gputune bench`, `gputune tune` and the dashboard's export share one layout:

    [config]          the options (flat keys, see strategies/registry.py)
    [measured]        optional: the figures measured for this configuration
    [environment]     optional: GPU, driver, torch, triton, ... where they were measured

TOML is read with tomllib and written with tomli_w; JSON holds the same three objects.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Literal, Mapping

from strategies.errors import ConfigError
from strategies.files import ReadError, WriteError, keep_previous, read_capped, write_atomic
from strategies.registry import (
    OPTIONS, RULES, STRATEGIES, Capabilities, micro_batch_problem, option_unavailable,
)


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """`["precision=bf16", "batch_size=32"]` (the CLI's `--set`) to validated option values."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r} must look like KEY=VALUE, e.g. batch_size=32")
        option = OPTIONS.get(key.strip())
        if option is None:
            raise ConfigError(
                f"--set: unknown option {key.strip()!r}: allowed options are " + ", ".join(OPTIONS)
            )
        values[option.key] = option.parse(text.strip())
    for key, value in values.items():
        # Each value now, with the option's message; the rules across options once the values
        # meet the configurations they change (`--set devices=2` is fine on a ddp config).
        OPTIONS[key].coerce(value)
    return values


# Kernels whose work Inductor generates itself, fused with the ops around them (the residual
# add, the casts, the next matmul's prologue). Inside a compiled graph our kernels are opaque
# custom ops that end those fusions, which is why kernels and compile fought in the anchors'
# measurements. The losses are different: Inductor materialises full-size logits buffers there.
INDUCTOR_FUSES = frozenset({"layer_norm", "rms_norm", "gelu", "swiglu", "causal_softmax"})


@dataclass(frozen=True)
class TuneConfig:
    """One value for every registered option. Build with `TuneConfig.from_dict`, change with
    `replace`; every path validates each value against the registry."""

    values: tuple[tuple[str, Any], ...] = field(default=())

    if TYPE_CHECKING:
        # The options, for type checkers and IDEs (at run time `__getattr__` serves them from
        # `values`). A test keeps these in step with the registry.
        precision: Literal["fp32", "tf32", "bf16", "fp16"]
        grad_clip: float
        weights: Literal["fp32", "bf16"]
        attention: Literal["manual", "sdpa"]
        fused_kernels: tuple[str, ...]
        kernels_with_compile: Literal["inductor-first", "all", "forced"]
        fp8: Literal["off", "tensorwise", "rowwise"]
        fp8_layers: Literal["auto", "all"]
        checkpointing: Literal["off", "full", "every-n", "selective"]
        checkpoint_every: int
        parallel: Literal["none", "ddp", "fsdp2"]
        devices: int
        ddp_bucket_mb: int
        ddp_bucket_view: bool
        fsdp_reshard: bool
        fsdp_reduce: Literal["fp32", "bf16"]
        compile_mode: Literal["off", "default", "reduce-overhead", "max-autotune",
                              "max-autotune-no-cudagraphs"]
        compile_fullgraph: bool
        compile_scope: Literal["model", "block"]
        optimizer: Literal["plain", "foreach", "fused"]
        optimizer_state: Literal["fp32", "bf16", "8bit", "offload"]
        batch_size: int
        micro_batch_size: int

    def __post_init__(self) -> None:
        given = dict(self.values)
        unknown = sorted(set(given) - set(OPTIONS))
        if unknown:
            raise ConfigError(
                f"unknown option {unknown[0]!r}: allowed options are " + ", ".join(OPTIONS)
            )
        canonical = {
            key: option.coerce(given[key]) if key in given else option.default
            for key, option in OPTIONS.items()
        }
        _check_rules(canonical)
        object.__setattr__(self, "values", tuple(canonical.items()))
        object.__setattr__(self, "_by_key", canonical)
        self.__dict__.update(canonical)  # each option an attribute: read without __getattr__

    # -- access -------------------------------------------------------------------------------
    def __getattr__(self, key: str) -> Any:
        # Only called for names that are not instance attributes: an option key of a copy
        # unpickled from an older class, or a name that is not an option.
        if key.startswith("__") or key == "_by_key":
            raise AttributeError(key)
        by_key = self.__dict__.get("_by_key")
        if by_key is None:  # unpickled by an older copy of this class: built again
            by_key = dict(object.__getattribute__(self, "values"))
            object.__setattr__(self, "_by_key", by_key)
        try:
            return by_key[key]
        except KeyError:
            raise AttributeError(f"TuneConfig has no option {key!r}") from None

    def __getitem__(self, key: str) -> Any:
        try:
            return self.__dict__["_by_key"][key]
        except KeyError:
            return self.__getattr__(key)

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.values}

    def differing(self, other: "TuneConfig") -> tuple[str, ...]:
        """The options in which `other` differs from this one, in the registry's order (both
        hold their values coerced, in that order: the search compares hundreds of thousands)."""
        if [k for k, _ in self.values] != [k for k, _ in other.values]:
            # (a copy unpickled from an older class: compared by name)
            return tuple(k for k in OPTIONS if _plain(self[k]) != _plain(other[k]))
        return tuple(k for (k, mine), (_, its) in zip(self.values, other.values) if mine != its)

    def changed(self) -> dict[str, Any]:
        """The options that differ from their defaults."""
        return {k: v for k, v in self.to_dict().items() if v != _plain(OPTIONS[k].default)}

    def replace(self, **changes: Any) -> "TuneConfig":
        """This configuration with `changes`, each checked as `from_dict` checks it, and the
        rules across options checked again (the search calls this tens of thousands of times:
        only what changed is coerced)."""
        merged = dict(self._options())
        for key, value in changes.items():
            option = OPTIONS.get(key)
            if option is None:
                raise ConfigError(
                    f"unknown option {key!r}: allowed options are " + ", ".join(OPTIONS))
            merged[key] = option.coerce(value)
        _check_rules(merged)
        new = object.__new__(TuneConfig)
        object.__setattr__(new, "values", tuple(merged.items()))
        object.__setattr__(new, "_by_key", merged)
        new.__dict__.update(merged)
        return new

    def _options(self) -> dict[str, Any]:
        by_key = self.__dict__.get("_by_key")
        return by_key if by_key is not None else dict(self.values)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TuneConfig":
        if not isinstance(data, Mapping):
            raise ConfigError(f"a configuration must be a table of options, not {type(data).__name__}")
        return cls(tuple(data.items()))

    @classmethod
    def reference(cls, batch_size: int = 0) -> "TuneConfig":
        """The configuration every other is checked against: fp32, eager, no kernels. Its
        attention is SDPA, which in fp32 computes the same function as the manual path without
        holding a (T, T) score matrix per head, so the reference fits wherever the model does."""
        return cls.from_dict({"batch_size": batch_size, "attention": "sdpa"})

    def without(self, skip: Collection[str]) -> "TuneConfig":
        """This configuration with the options and choices in `skip` (`KEY` or `KEY=CHOICE`,
        those that change nothing in a model: `strategies.applicability`) at their defaults."""
        changes: dict[str, Any] = {}
        for key, value in self.values:
            if key in skip:
                changes[key] = OPTIONS[key].default
            elif isinstance(value, tuple):
                kept = tuple(v for v in value if f"{key}={v}" not in skip)
                if kept != value:
                    changes[key] = kept
            elif f"{key}={value}" in skip:
                changes[key] = OPTIONS[key].default
        return self.replace(**changes) if changes else self

    def label(self, skip: Collection[str] = ()) -> str:
        """A short human name, e.g. 'bf16 + compile(default) + sdpa + fused AdamW'. `skip`:
        options and choices that change nothing in the model at hand (`without`), left out."""
        if skip:
            return self.without(skip).label()
        parts = [self.precision]
        if self.weights != OPTIONS["weights"].default:
            parts.append(f"{self.weights} weights")
        if self.attention != OPTIONS["attention"].default:
            parts.append(self.attention)
        if self.fp8 != OPTIONS["fp8"].default:
            parts.append(f"fp8 {self.fp8}")
        if self.fused_kernels:
            every = "" if self.kernels_with_compile == "inductor-first" else f",{self.kernels_with_compile}"
            parts.append("kernels(" + ",".join(self.fused_kernels) + every + ")")
        if self.checkpointing != "off":
            every = f"/{self.checkpoint_every}" if self.checkpointing == "every-n" else ""
            parts.append(f"ckpt {self.checkpointing}{every}")
        if self.compile_mode != "off":
            extra = ",fullgraph" if self.compile_fullgraph else ""
            extra += ",per-block" if self.compile_scope == "block" else ""
            parts.append(f"compile({self.compile_mode}{extra})")
        if self.parallel != "none":
            parts.append(self.parallel_label())
        if self.optimizer != "plain":
            parts.append(f"{self.optimizer} AdamW")
        if self.optimizer_state != OPTIONS["optimizer_state"].default:
            parts.append(f"{self.optimizer_state} state")
        if self.batch_size:
            per_rank = f" ({self.batch_size // self.devices}/rank)" if self.devices > 1 else ""
            parts.append(f"batch {self.batch_size}{per_rank}")
        if self.micro_batch_size:
            parts.append(f"micro {self.micro_batch_size}")
        if self.grad_clip != OPTIONS["grad_clip"].default:
            parts.append(f"clip {self.grad_clip:g}")
        return " + ".join(parts)

    def accumulation_steps(self, batch_size: int) -> int:
        """Micro-batches per optimizer step for a batch of `batch_size` (the workload's default
        when batch_size = 0). Raises ConfigError when micro_batch_size does not divide it, or
        when the batch cannot be shared evenly by the devices of a group."""
        if batch_size % self.devices:
            raise ConfigError(
                f"batch_size = {batch_size} is not a multiple of devices = {self.devices}: each "
                f"rank trains on batch_size / devices sequences; use a batch_size of "
                f"{self.devices * max(1, batch_size // self.devices)} or devices dividing {batch_size}")
        micro = self.micro_batch_size
        if not micro:
            return 1
        if batch_size % micro:
            raise ConfigError(micro_batch_problem(batch_size, micro))
        return batch_size // micro

    def parallel_label(self) -> str:
        """e.g. 'ddp x2 (bucket 50MB,views)' or 'fsdp2 x2 (no reshard)': the knobs that are not
        at their defaults, for the mode in use."""
        knobs = []
        if self.parallel == "ddp":
            if self.ddp_bucket_mb != OPTIONS["ddp_bucket_mb"].default:
                knobs.append(f"bucket {self.ddp_bucket_mb}MB")
            if self.ddp_bucket_view:
                knobs.append("views")
        elif self.parallel == "fsdp2":
            if not self.fsdp_reshard:
                knobs.append("no reshard")
            if self.fsdp_reduce != OPTIONS["fsdp_reduce"].default:
                knobs.append(f"{self.fsdp_reduce} reduce")
        return f"{self.parallel} x{self.devices}" + (f" ({','.join(knobs)})" if knobs else "")

    def effective_kernels(self) -> tuple[str, ...]:
        """The fused kernels this configuration swaps in: under torch.compile with the
        inductor-first policy, those Inductor fuses itself are left to it."""
        if self.compile_mode != "off" and self.kernels_with_compile == "inductor-first":
            return tuple(k for k in self.fused_kernels if k not in INDUCTOR_FUSES)
        return tuple(self.fused_kernels)

    def check_runnable(self, caps: Capabilities) -> None:
        """Raise ConfigError naming the option and the device if this machine cannot run it."""
        for key, value in self.values:
            problem = option_unavailable(OPTIONS[key], value, caps)
            if problem:
                raise ConfigError(problem)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _check_rules(values: dict[str, Any]) -> None:
    for rule in RULES:
        problem = rule(values)
        if problem:
            raise ConfigError(problem)


def strategy_of(key: str) -> str:
    for strategy in STRATEGIES:
        if any(o.key == key for o in strategy.options):
            return strategy.name
    raise KeyError(key)


# -- files ----------------------------------------------------------------------------------------
FORMATS = ("toml", "json")
MAX_FILE_BYTES = 1 << 20
"""The largest configuration file read: an exported one is well under 4 KiB; a larger one is
not a configuration (and /dev/zero must not be read until memory runs out)."""


def format_of(path: str | os.PathLike, fmt: str | None = None) -> str:
    """`fmt`, else the format the name says: .toml or .json, also for a kept earlier file
    (gputune.toml.1, see `strategies.files.keep_previous`)."""
    path = Path(path)
    if path.suffix[1:].isdigit() and path.stem != Path(path.stem).stem:
        path = Path(path.stem)
    fmt = fmt or path.suffix.lstrip(".").lower() or "toml"
    if fmt not in FORMATS:
        raise ConfigError(f"unknown file format {fmt!r} for {path}: allowed formats are toml, json")
    return fmt


@dataclass(frozen=True)
class ExportedConfig:
    """What an exported file holds: the configuration and, if known, where and how fast it ran."""

    config: TuneConfig
    measured: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    workload: str = ""

    def to_document(self) -> dict:
        doc: dict[str, Any] = {"config": self.config.to_dict()}
        if self.workload:
            doc["workload"] = self.workload
        if self.measured:
            doc["measured"] = _drop_none(self.measured)
        if self.environment:
            doc["environment"] = _drop_none(self.environment)
        return doc


def _drop_none(d: Mapping) -> dict:
    # TOML has no null; leave unknown figures out rather than invent a value.
    out = {}
    for k, v in d.items():
        if v is None:
            continue
        out[k] = _drop_none(v) if isinstance(v, Mapping) else v
    return out


def document_text(exported: ExportedConfig, fmt: str) -> str:
    """The file's text: TOML or JSON of [config], [measured], [environment]."""
    doc = exported.to_document()
    if fmt == "toml":
        import tomli_w

        return tomli_w.dumps(doc)
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def save(
    config: TuneConfig | ExportedConfig, path: str | os.PathLike, fmt: str | None = None
) -> Path:
    """Write the configuration as TOML or JSON (`fmt`, by default from the name) atomically
    (`strategies.files.write_atomic`): an existing file is never left half-written, and one
    that differs is kept as `path.1` (then .2, ...). A trainer's file (hf, accelerate,
    lightning) is `strategies.exports.write`'s."""
    exported = config if isinstance(config, ExportedConfig) else ExportedConfig(config)
    path = Path(path)
    text = document_text(exported, format_of(path, fmt))
    try:
        keep_previous(path, text)
        write_atomic(path, text)
    except WriteError as exc:
        raise ConfigError(str(exc)) from None
    return path


def read(path: str | os.PathLike) -> ExportedConfig:
    """Read a file written by `save` (or by hand). Raises ConfigError with one line."""
    path = Path(path)
    fmt = format_of(path)
    try:
        raw = read_capped(path, MAX_FILE_BYTES, f"configuration file {path}")
    except ReadError as exc:
        raise ConfigError(str(exc)) from None
    try:
        text = raw.decode("utf-8")
        doc = tomllib.loads(text) if fmt == "toml" else json.loads(text)
    except RecursionError:
        raise ConfigError(f"{path} is nested too deeply to be a configuration: a [config] "
                          "table of options with plain values") from None
    except ValueError as exc:  # decode errors, and JSON integers past Python's digit limit
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path} is not valid {fmt.upper()}: {detail}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} must hold a table with a [config] section")
    allowed_sections = {"config", "measured", "environment", "workload"}
    unknown = sorted(set(doc) - allowed_sections)
    if unknown:
        raise ConfigError(
            f"{path}: unknown section {unknown[0]!r}: allowed sections are config, measured, "
            "environment, workload"
        )
    if "config" not in doc:
        raise ConfigError(f"{path} has no [config] section")
    try:
        config = TuneConfig.from_dict(doc["config"])
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    measured = doc.get("measured", {})
    environment = doc.get("environment", {})
    workload = doc.get("workload", "")
    if not isinstance(measured, dict) or not isinstance(environment, dict):
        raise ConfigError(f"{path}: [measured] and [environment] must be tables")
    if not isinstance(workload, str):
        raise ConfigError(f"{path}: workload must be a string such as 'gpt2-124m'")
    return ExportedConfig(config, measured, environment, workload)


def load(path: str | os.PathLike) -> TuneConfig:
    """Read only the configuration from an exported file."""
    return read(path).config


def canonical_value(key: str, value: Any) -> Any:
    """One option's value checked and in canonical form, on its own (the rules across options,
    such as weights = bf16 needing precision = bf16, are checked for whole configurations)."""
    option = OPTIONS.get(key)
    if option is None:
        raise ConfigError(f"unknown option {key!r}: allowed options are " + ", ".join(OPTIONS))
    return option.coerce(value)
