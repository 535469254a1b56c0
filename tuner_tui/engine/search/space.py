"""The search space: the candidate values of each searched option, and which configurations are
the same run. Torch-free."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any

from strategies.config import ConfigError, TuneConfig, canonical_value
from strategies.registry import OPTIONS, SEARCHED, Capabilities, option_unavailable

DEFAULT_CHOICES: dict[str, tuple] = dict(SEARCHED)
"""The values `gputune tune` tries per option, as each option declares them (`SearchFacts.values`
in the registry): what this machine cannot run is left out by `default_space`."""

KERNEL_SETS = DEFAULT_CHOICES["fused_kernels"]
"""Fused-kernel sets tried by default: none, the element-wise ones, and those plus the fused
linear + cross-entropy (which saves the most memory). A kernel whose module the model lacks is
simply not swapped."""

PARALLEL_CHOICES: dict[str, tuple] = {
    "parallel": ("ddp", "fsdp2"),
    "fsdp_reshard": (True, False),
    "fsdp_reduce": ("fp32", "bf16"),
    "ddp_bucket_mb": (25, 100),
}
"""Searched where the search runs on several devices (`--set devices=N`) or data parallel is
asked for (`--search parallel=...`): DDP against FSDP2, each with the knob that moves it most.
A knob is searched only with its mode."""

PARALLEL_KNOBS = {"fsdp_reshard": "fsdp2", "fsdp_reduce": "fsdp2", "ddp_bucket_mb": "ddp",
                  "ddp_bucket_view": "ddp"}
"""Each data parallel knob and the mode it belongs to: in the other modes it does nothing."""

MAX_GROWTH = 16
"""How far past the workload's default batch the climb may double (`CLIMB`)."""

CLIMB = "..."
"""Written last in `--search batch_size=x1,x2,...`: try doublings past the last while they pay."""

TORCHAO_STEPS = frozenset({"bf16", "8bit"})
"""optimizer_state values stepped by torchao's AdamW, where `optimizer` (torch's implementation
flags) does nothing."""


def steps_with_torchao(config: TuneConfig) -> bool:
    """Whether torchao's AdamW steps the configuration (bf16 weights, or bf16 or 8-bit state),
    where `optimizer` does nothing."""
    return config.optimizer_state in TORCHAO_STEPS or config.weights == "bf16"


@dataclass(frozen=True)
class SearchSpace:
    """The candidate values of each searched option; every other option is fixed."""

    choices: tuple[tuple[str, tuple], ...]
    fixed: tuple[tuple[str, Any], ...] = ()
    grow_batch: bool = False
    """Try batch sizes beyond the largest candidate while they keep paying (`--search
    batch_size=x1,x2,...`)."""
    default_batch: int = 0
    """The workload's batch size, which `batch_size = 0` stands for."""
    inapplicable: tuple[str, ...] = ()
    """Options and choices (`KEY`, `KEY=CHOICE`) that change nothing in the workload's model
    (`strategies.applicability`): put back at their defaults, so that a move of them is no
    move at all."""
    held: tuple[str, ...] = ()
    """Options that would train the workload's model differently (micro-batches under
    BatchNorm, `strategies.applicability`), which the user neither holds nor searches: kept at
    their defaults, since the gradient gate would refuse any other value."""

    def values(self, key: str) -> tuple:
        found = dict(self.choices).get(key)
        if found is not None:
            return found
        return (dict(self.fixed).get(key, default_value(key)),)

    def start(self) -> TuneConfig:
        return _start(self)

    def _start(self) -> TuneConfig:
        """The first configuration: every option at its default when that is a candidate (the
        fp32 eager baseline), else at its first candidate (on several devices: DDP, unless the
        user's list names another mode first). Where a held option needs another value of a
        searched one (`--set weights=bf16` needs precision = bf16), the searched option takes
        the first of its candidates that the rules accept."""
        values = dict(self.fixed)
        for key, _ in self.choices:
            values[key] = self.start_value(key)
        try:
            return self.canonical(TuneConfig.from_dict(values))
        except ConfigError as refused:
            for key, candidates in self.choices:
                for value in candidates:
                    try:
                        return self.canonical(TuneConfig.from_dict({**values, key: value}))
                    except ConfigError:
                        continue
            raise refused

    def start_value(self, key: str) -> Any:
        """The value `key` has in `start()`."""
        candidates = self.values(key)
        default = default_value(key)
        return default if default in candidates else candidates[0]

    @property
    def devices(self) -> int:
        """The devices every configuration of the space trains on."""
        return self.start_value("devices")

    def canonical(self, config: TuneConfig) -> TuneConfig:
        return _canonical(self, config)

    def _canonical(self, config: TuneConfig) -> TuneConfig:
        """One configuration per distinct run: options that do nothing in it (compile scope
        without compile, checkpoint_every without every-n) are put back at their start value,
        and under compile the fused kernels left to Inductor are dropped
        (`TuneConfig.effective_kernels`): a set that differs only in those is the same run."""
        if self.inapplicable:
            config = config.without(self.inapplicable)
        fixed = dict(self.fixed)
        changes = {}
        effective = config.effective_kernels()
        if effective != tuple(config.fused_kernels):
            changes["fused_kernels"] = list(effective)
        if config.compile_mode == "off":
            changes["compile_scope"] = fixed.get("compile_scope", default_value("compile_scope"))
            changes["compile_fullgraph"] = False
        if config.checkpointing != "every-n":
            changes["checkpoint_every"] = fixed.get(
                "checkpoint_every", default_value("checkpoint_every")
            )
        if config.micro_batch_size and config.micro_batch_size == self.rank_batch(config):
            changes["micro_batch_size"] = 0
        for key in self.held:
            changes[key] = default_value(key)
        for knob, mode in PARALLEL_KNOBS.items():
            if config.parallel != mode:
                changes[knob] = self.start_value(knob)
        if steps_with_torchao(config) and "optimizer" not in fixed:
            changes["optimizer"] = self.values("optimizer")[0]
        return config.replace(**changes)

    def rank_batch(self, config: TuneConfig) -> int:
        """The samples each device trains on per step: the batch over the devices."""
        return (config.batch_size or self.default_batch) // config.devices

    def micro_batches(self, config: TuneConfig) -> list[int]:
        """The micro-batch sizes the memory stage tries for `config`'s batch: the whole batch
        (0; on several devices each one's share), then halves down to 1 (the divisors a power
        of two apart); the user's own list if they searched it."""
        listed = dict(self.choices).get("micro_batch_size")
        if listed is not None:
            return list(listed)
        fixed = dict(self.fixed)
        if "micro_batch_size" in fixed:
            return [fixed["micro_batch_size"]]
        if "micro_batch_size" in self.held:
            return [0]
        batch = self.rank_batch(config)
        sizes, size = [0], batch // 2
        while size >= 1 and batch % size == 0:
            sizes.append(size)
            size //= 2
        if sizes[-1] != 1 and batch > 1:
            sizes.append(1)
        return sizes

    def contains(self, config: TuneConfig) -> bool:
        return _contains(self, config)

    def _contains(self, config: TuneConfig) -> bool:
        canonical = self.canonical(config)
        return canonical == config and all(
            self._listed(key, config) or self._grown(key, config[key])
            for key in OPTIONS
            if key not in ("compile_scope", "compile_fullgraph", "checkpoint_every",
                           "micro_batch_size")
        ) and (config.compile_mode == "off" or config.compile_scope in self.values("compile_scope"))

    def _listed(self, key: str, config: TuneConfig) -> bool:
        """The option's value is one of the space's, as `canonical` would put it; for the fused
        kernels, any part of a listed set (a compiled recipe's kernels, without Inductor's,
        run eager: each kernel in it was allowed)."""
        values = self.values(key)
        if key == "fused_kernels":
            mine = set(config.fused_kernels)
            return any(mine <= set(self.canonical(config.replace(fused_kernels=v)).fused_kernels)
                       for v in values)
        return plain(config[key]) in [plain(v) for v in values]

    def _grown(self, key: str, value: Any) -> bool:
        """A batch size that the search may reach by doubling the largest candidate, up to
        MAX_GROWTH times the workload's default (past that a larger batch buys little speed and
        changes the training ever more)."""
        if key != "batch_size" or not self.grow_batch:
            return False
        top = max(self.values("batch_size"))
        ratio = value / top if top else 0
        limit = MAX_GROWTH * self.default_batch if self.default_batch else math.inf
        return (ratio > 1 and ratio.is_integer() and (int(ratio) & (int(ratio) - 1)) == 0
                and value <= max(limit, top))

    def size(self) -> int:
        return math.prod(len(v) for _, v in self.choices)

    def describe(self) -> str:
        parts = []
        for key, values in self.choices:
            shown = [("+".join(v) or "none") if isinstance(v, tuple) else str(v) for v in values]
            parts.append(f"{key}: {', '.join(shown)}")
        return "; ".join(parts)


# A search asks these of the same space tens of thousands of times (each candidate is made
# canonical and checked against the space): answered once per space and configuration.
@functools.lru_cache(maxsize=1024)
def _start(space: SearchSpace) -> TuneConfig:
    return space._start()


@functools.lru_cache(maxsize=200_000)
def _canonical(space: SearchSpace, config: TuneConfig) -> TuneConfig:
    return space._canonical(config)


@functools.lru_cache(maxsize=200_000)
def _contains(space: SearchSpace, config: TuneConfig) -> bool:
    return space._contains(config)


def default_value(key: str) -> Any:
    return OPTIONS[key].default


def plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


def default_space(
    caps: Capabilities,
    default_batch: int,
    fixed: dict | None = None,
    choices: dict | None = None,
    inapplicable: dict | None = None,
    changes_training: dict | None = None,
) -> SearchSpace:
    """The space for this machine: `DEFAULT_CHOICES`, replaced per option by `choices`, without
    the options that `fixed` sets, without the options and values the workload says do nothing
    for its model (`inapplicable`: option or option=value -> why, such as attention for a model
    without attention modules; unless the user names them in `choices`), and without the values
    this machine cannot run. The options that would train the model differently
    (`changes_training`: micro-batches under BatchNorm) are held at their defaults unless the
    user holds or searches them."""
    fixed = dict(fixed or {})
    skip = tuple(inapplicable or ())
    held = tuple(k for k in (changes_training or ())
                 if "=" not in k and k not in fixed and k not in (choices or {}))
    defaults = {k: v for k, v in DEFAULT_CHOICES.items() if k not in skip + held}
    merged = {**defaults, **parallel_choices(fixed, choices or {}), **(choices or {})}
    kept: list[tuple[str, tuple]] = []
    grow = False
    for key, values in merged.items():
        if key in fixed:
            continue
        if key == "batch_size":
            grow = CLIMB in values
            values = tuple(_batch_value(v, default_batch) for v in values if v != CLIMB)
        runnable = []
        for value in values:
            canonical = canonical_value(key, value)
            if f"{key}={canonical}" in skip and key not in (choices or {}):
                continue  # (per block where the model has no blocks, or blocks of several shapes)
            runs = option_unavailable(OPTIONS[key], canonical, caps) is None
            if runs and canonical not in runnable:
                runnable.append(canonical)
        if not runnable:
            raise ConfigError(
                f"--search {key}: none of its values can run on device = {caps.device}"
            )
        if len(runnable) > 1 or key in (choices or {}):
            kept.append((key, tuple(runnable)))
        else:
            fixed.setdefault(key, runnable[0])
    modes = dict(kept).get("compile_mode", (fixed.get("compile_mode", "off"),))
    if modes == ("off",):  # a compile scope changes nothing without compile
        kept = [(k, v) for k, v in kept if k != "compile_scope"]
    space = SearchSpace(tuple(kept), tuple((k, plain(v)) for k, v in fixed.items()), grow_batch=grow,
                        default_batch=default_batch, inapplicable=skip, held=held)
    # A set value that differs only in members the model lacks is the same run.
    distinct = []
    for key, values in space.choices:
        if key == "fused_kernels" and skip:
            seen: list = []
            for v in values:
                plain_v = tuple(k for k in v if f"fused_kernels={k}" not in skip)
                if plain_v not in seen:
                    seen.append(plain_v)
            values = tuple(seen) if len(seen) > 1 else None
        if values is not None:
            distinct.append((key, values))
    return SearchSpace(tuple(distinct), space.fixed, grow_batch=grow,
                       default_batch=default_batch, inapplicable=skip, held=held)


def parallel_choices(fixed: dict, choices: dict) -> dict[str, tuple]:
    """The data parallel options to search by default: DDP against FSDP2 where the user asks
    for several devices and leaves the mode open, and the knobs of each mode in play."""
    found: dict[str, tuple] = {}
    if "parallel" in fixed:
        modes = (fixed["parallel"],)
    elif "parallel" in choices:
        modes = tuple(choices["parallel"])
    elif fixed.get("devices", default_value("devices")) > 1:
        modes = found["parallel"] = PARALLEL_CHOICES["parallel"]
    else:
        modes = ("none",)
    for knob, mode in PARALLEL_KNOBS.items():
        if mode in modes and knob in PARALLEL_CHOICES and knob not in fixed:
            found[knob] = PARALLEL_CHOICES[knob]
    return found


def _batch_value(value: Any, default_batch: int) -> int:
    """`x2` is twice the workload's default; the default itself is 0, as in every config."""
    if isinstance(value, str) and value.startswith("x"):
        value = int(float(value[1:]) * default_batch)
    return 0 if value == default_batch else value


def parse_choices(key: str, text: str) -> tuple:
    """The values of `--search KEY=V1,V2`; set values join their items with '+' (`none` for
    the empty set), e.g. fused_kernels=none,layer_norm+gelu; batch sizes may be multiples of the
    workload's (x2) and end in `...` to climb past the last while a larger batch pays."""
    option = OPTIONS.get(key)
    if option is None:
        raise ConfigError(
            f"--search: unknown option {key!r}: allowed options are " + ", ".join(OPTIONS)
        )
    values = []
    items = [t.strip() for t in text.split(",") if t.strip()]
    for position, item in enumerate(items):
        if key == "batch_size" and (re.fullmatch(r"x\d+(\.\d+)?", item) or item == CLIMB):
            if item == CLIMB and position != len(items) - 1:
                raise ConfigError(f"--search batch_size: {CLIMB} may only come last, e.g. "
                                  "batch_size=x1,x2,...")
            values.append(item)
            continue
        values.append(canonical_value(key, option.parse_one_of_several(item)))  # names a bad one
    if not values:
        raise ConfigError(f"--search {key}= names no values: {option.describe_allowed()}")
    return tuple(values)
