"""The kinds of option value: one class per kind, each with its own checking (`coerce`),
command-line parsing (`parse`), messages (`describe_allowed`), display (`show`) and the hint the
dashboard builds its control from (`widget`). Torch-free; the registry lists the options."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from strategies.errors import ConfigError


@dataclass(frozen=True)
class Prior:
    """What a value is expected to do to throughput before it is measured: the log of its
    throughput over the option's default value's, as (mean, standard deviation). `cuda` on a GPU,
    `cpu` on the CPU (None: as on a GPU); `compiled` replaces either where the configuration
    runs under torch.compile, `large` on models of a billion parameters or more (what pays on a
    large model, such as bf16 weights or float8, often loses on a small one), and `eager`, where
    set, replaces them all without torch.compile (what pays only compiled). The search ranks
    candidates by these until it has measured the lever itself, and learns them from this
    machine's result store (`tuner_tui/engine/search/priors.py`)."""

    cuda: tuple[float, float] = (0.0, 0.05)
    cpu: tuple[float, float] | None = None
    compiled: tuple[float, float] | None = None
    large: tuple[float, float] | None = None
    eager: tuple[float, float] | None = None
    risk: float = 0.01
    """The chance the value fails on a machine and model it was not tried on (a compile error,
    a divergence, numerics out of tolerance): where a trial of several new values fails, the
    riskiest take most of the blame."""

    def pick(self, device: str, compiled: bool = False, large: bool = False) -> tuple[float, float]:
        if not compiled and self.eager is not None:
            return self.eager
        if large and self.large is not None:
            return self.large
        if compiled and self.compiled is not None:
            return self.compiled
        if device != "cuda" and self.cpu is not None:
            return self.cpu
        return self.cuda


@dataclass(frozen=True)
class SearchFacts:
    """What the search, the memory model and the numerics gate know about an option, declared
    beside it so that a new option is one declaration, never a new stage."""

    values: tuple = ()
    """The values `gputune tune` tries by default (where the machine can run them); () leaves
    the option at the user's value (or its default) unless `--search` names it."""
    lever: str = "speed"
    """speed: changes the step time; memory: frees memory at a cost in speed; both; parallel:
    how several devices share the work; training: changes what is learned, not the step time
    (searched only where asked, and expected to change nothing)."""
    activations: bool = False
    """Changes what a sample holds besides parameters, gradients and optimizer state
    (activations, logits, compile's buffers): the memory model compares only trials equal in
    these options, or scales between them."""
    reference: tuple | None = None
    """The values that compute what the fp32 eager reference computes (None: every value does):
    a configuration with all its options there is its own reference."""
    numerics: dict = field(default_factory=dict)
    """The numerics class (`registry.NUMERICS`) a value brings: the loss and gradient
    tolerances of a configuration are those of the loosest class among its options."""
    prior: dict = field(default_factory=dict)
    """Value -> `Prior`; a value without one is expected to change nothing (mean 0, a small
    deviation)."""
    bytes_per_parameter: dict = field(default_factory=dict)
    """Value -> bytes per parameter on the device: the parameters and gradients (weights), or the
    optimizer's state."""
    holds: dict = field(default_factory=dict)
    """Value -> rank of what a step holds with it, the rest alike: a value of a higher rank never
    holds less than one of a lower rank; values of one rank are not compared. The memory model
    never estimates a configuration below a measured one that it holds at least as much as
    (`memory.holds_at_least`). Empty: values not ordered (`bytes_per_parameter` orders
    weights and state)."""
    holds_compiled: dict = field(default_factory=dict)
    """As `holds`, where both configurations compile (torch.compile)."""
    interacts: tuple[str, ...] = ()
    """Options whose best value depends on this one's (under compile the fused kernels
    Inductor fuses itself are left to it, so kernels pay differently in eager): the search also
    tries moving both at once."""
    in_graph: bool = True
    """Part of what torch.compile compiles (the model's forward and backward). A trial that
    differs from one compiled before only in options outside it (the optimizer, its state,
    clipping; the batch where the micro-batch the graph sees stays) compiles from the Inductor
    cache, in a fraction of the time (`search.timing`)."""
    costs_only: tuple = ()
    """Values that never make a step faster than the default: they recompute or move what the
    default keeps (checkpointing, offloaded state). A move to one of them from the default buys
    memory, never speed: it is expected to gain nothing over its parent."""
    addresses: tuple[str, ...] = ()
    """The profile's bottlenecks (host, memory, compute, communication) this option can relieve:
    with `--profile`, a candidate changing it is weighed up where the incumbent's profile says so."""
    fails_with: dict = field(default_factory=dict)
    """Words (lower case) that, found in a failed trial's message, name the values of this
    option that share the failure's cause: the configuration's own value takes all the blame,
    the others listed half, and nothing else in the configuration any. A CUDA graph capture
    error is reduce-overhead's and max-autotune's (both capture graphs), not the default
    mode's; the search then still tries compiling without graphs."""


def _shown(value: Any, limit: int = 40) -> str:
    """A value as the user wrote it, cut short: a message stays one readable line."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * math.log10(2))} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Option:
    """One tunable setting. Each kind of value is a subclass with its own `coerce` (check a value
    from a file or a dict), `parse` (a command-line string), `describe_allowed` (for messages),
    `show` and the hints the dashboard builds its widget from (`widget`)."""

    key: str
    """Flat, unique name: the TOML key, the CLI flag (`--set key=value`) and the widget id."""
    default: Any
    help: str
    """One line shown beside the widget and in error messages."""
    requires: tuple[str, ...] = ()
    """Capabilities the option needs whenever it is not at its default (see `Capabilities`)."""
    label: str = ""
    search: SearchFacts = SearchFacts()
    """What the search and the memory model know about it."""

    kind: ClassVar[str] = ""
    """The kind's name, as plain data: "choice", "bool", "int", "float" or "set"."""
    widget: ClassVar[str] = ""
    """The dashboard's control: "select", "switch", "number" or "checkboxes"."""

    def coerce(self, value: Any) -> Any:
        """`value` checked and in canonical form; ConfigError (one line) if not allowed."""
        raise NotImplementedError

    def parse(self, text: str) -> Any:
        """A command-line string (`--set key=value`) as a value to `coerce`."""
        return text

    def parse_one_of_several(self, text: str) -> Any:
        """One value in a comma-separated list of values (`--search key=a,b`, the screenshot
        tool's `--set`): the same as `parse` except for sets, whose items are joined by +."""
        return self.parse(text)

    def describe_allowed(self) -> str:
        raise NotImplementedError

    def show(self, value: Any) -> str:
        """A value as the user writes it."""
        return str(value).lower() if isinstance(value, bool) else str(value)

    def probe(self) -> Any:
        """A value other than the default, to ask whether changing the option needs a
        capability."""
        return self.default

    def needs(self, value: Any) -> tuple[str, ...]:
        """The capabilities `option = value` needs."""
        return self.requires if value != self.default else ()

    def _refuse(self, value: Any, problem: str) -> ConfigError:
        return ConfigError(f"{self.key} = {_shown(value)} {problem}: {self.describe_allowed()}")


@dataclass(frozen=True)
class ChoiceOption(Option):
    choices: tuple = ()
    choice_requires: dict = field(default_factory=dict)
    """Capabilities needed by particular choices, e.g. {"fp16": ("cuda",)}."""

    kind: ClassVar[str] = "choice"
    widget: ClassVar[str] = "select"

    def coerce(self, value: Any) -> Any:
        if value not in self.choices:
            raise self._refuse(value, "is not allowed")
        return value

    def describe_allowed(self) -> str:
        return "one of " + ", ".join(str(c) for c in self.choices)

    def needs(self, value: Any) -> tuple[str, ...]:
        return super().needs(value) + tuple(self.choice_requires.get(value, ()))


@dataclass(frozen=True)
class BoolOption(Option):
    kind: ClassVar[str] = "bool"
    widget: ClassVar[str] = "switch"

    def coerce(self, value: Any) -> Any:
        if not isinstance(value, bool):
            raise self._refuse(value, "has the wrong type")
        return value

    def parse(self, text: str) -> Any:
        lowered = text.lower()
        if lowered in ("true", "on", "yes", "1"):
            return True
        if lowered in ("false", "off", "no", "0"):
            return False
        return text

    def describe_allowed(self) -> str:
        return "true or false"

    def probe(self) -> Any:
        return not self.default


@dataclass(frozen=True)
class IntOption(Option):
    minimum: float | None = None
    maximum: float | None = None

    kind: ClassVar[str] = "int"
    widget: ClassVar[str] = "number"
    input_type: ClassVar[str] = "integer"
    """What the dashboard's number field accepts: "integer" or "number"."""

    def _in_range(self, value: float) -> bool:
        return (self.minimum is None or value >= self.minimum) and (
            self.maximum is None or value <= self.maximum)

    def coerce(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._refuse(value, "has the wrong type")
        if not self._in_range(value):
            raise self._refuse(value, "is out of range")
        return value

    def parse(self, text: str) -> Any:
        try:
            return int(text)
        except ValueError:
            return text

    def describe_allowed(self) -> str:
        return self._noun("an integer", int)

    def _noun(self, noun: str, shown: type) -> str:
        if self.minimum is not None:
            noun += f" >= {shown(self.minimum)}"
        if self.maximum is not None:
            noun += f"{' and' if self.minimum is not None else ''} <= {shown(self.maximum)}"
        return noun

    def probe(self) -> Any:
        return self.default + 1


@dataclass(frozen=True)
class FloatOption(IntOption):
    kind: ClassVar[str] = "float"
    input_type: ClassVar[str] = "number"

    def coerce(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._refuse(value, "has the wrong type")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number) or not self._in_range(number):
            raise self._refuse(value, "is out of range")
        return number

    def parse(self, text: str) -> Any:
        try:
            return float(text)
        except ValueError:
            return text

    def describe_allowed(self) -> str:
        return self._noun("a number", float)


@dataclass(frozen=True)
class SetOption(Option):
    """A subset of `choices`, held in the registry's order (equal sets compare equal)."""

    choices: tuple = ()

    kind: ClassVar[str] = "set"
    widget: ClassVar[str] = "checkboxes"

    def coerce(self, value: Any) -> Any:
        if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
            raise self._refuse(value, "has the wrong type")
        for item in value:
            if item not in self.choices:
                raise ConfigError(f"{self.key} contains {_shown(item)}, which is not allowed: "
                                  f"{self.describe_allowed()}")
        return tuple(c for c in self.choices if c in set(value))

    def parse(self, text: str) -> Any:
        return tuple(t.strip() for t in text.split(",") if t.strip())

    def parse_one_of_several(self, text: str) -> Any:
        """`a+b`, or `none` for the empty set."""
        return () if text == "none" else tuple(t for t in text.split("+") if t)

    def describe_allowed(self) -> str:
        return "a list drawn from " + ", ".join(self.choices)

    def show(self, value: Any) -> str:
        return "[" + ", ".join(value) + "]"

    def probe(self) -> Any:
        return (self.choices[0],)

    def needs(self, value: Any) -> tuple[str, ...]:
        chosen = tuple(value)
        return self.requires if chosen and chosen != tuple(self.default) else ()
