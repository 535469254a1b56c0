"""What a search is asked to do (`SearchPlan`), and the entries of its time line (`Event`).
Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner_tui.engine import remeasure
from tuner_tui.engine.protocol import WorkerSpec


@dataclass
class SearchPlan:
    spec: WorkerSpec
    steps: int = 20
    warmup_steps: int = 5
    max_memory_bytes: int | None = None
    """None: the GPU's memory, or the available RAM on the CPU."""
    budget_s: float | None = None
    """The search's time, the leaders' re-measurement included; None: no limit."""
    trial_timeout_s: float = 900.0
    """The most a trial is given; less where its estimate says it should take far less."""
    fixed: dict = field(default_factory=dict)
    """Options held at one value (`--set`)."""
    choices: dict = field(default_factory=dict)
    """Candidate values replacing the default ones per option (`--search`)."""
    compare: list = field(default_factory=list)
    """Configurations (TuneConfig) measured first, side by side with the search, such as the
    one the user trains with now; the report gives the recommendation's speed against each."""
    profile_steps: int = 0
    """Steps profiled after each trial's measured ones (`--profile`); 0: none. Moves that
    address the best's bottleneck then weigh more."""
    trace_dir: str | None = None
    early_stop_ratio: float = 1.25
    """A trial whose throughput after a few steps is below the best's divided by this stops."""
    remeasure_repeats: int = remeasure.SEARCH_REPEATS
    """Interleaved runs per leader before the winner is named; 0: none."""
    fresh: bool = False
    """Measure every trial again: stored results are not reused (new ones are still stored)."""


@dataclass
class Event:
    """One entry of the time line."""

    index: int
    kind: str
    """trial, reference (the fp32 reference's losses at a new batch), compare, remeasure,
    confirm (a configuration run once more: `surprise.py`)."""
    label: str
    status: str
    how: str
    """ran, reused (from the store), error."""
    why: str
    started_s: float
    ended_s: float
    tokens_per_s: float | None
    best_label: str | None
    best_tokens_per_s: float | None
    phases_s: dict = field(default_factory=dict)
    """Where the run's time went in its worker (`TrialResult.phases_s`); empty where none ran."""

    def to_dict(self) -> dict:
        return dict(self.__dict__)
