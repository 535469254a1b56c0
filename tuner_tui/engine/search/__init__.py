"""`gputune tune`: the search, one concern per module.

- `space`: the candidate values of each option and which configurations are the same run;
- `memory`: measured and estimated peaks, the Pareto front, memory sizes the user types;
- `staged`: the history of one search and the staged strategy that proposes the next round;
- `driver`: the search itself (`Search`, `SearchPlan`), trial by trial in fresh workers;
- `report`: the outcome, why the recommendation won, the report, JSON and export.

The names the CLI, the dashboard and the tests use are re-exported here.
"""

from tuner_tui.engine.search.driver import (
    REUSABLE, TRIAL_GRACE_S, Search, SearchPlan, compile_cache_environ, default_memory_budget,
    workload_key,
)
from tuner_tui.engine.search.memory import (
    CHECKPOINT_PRIOR, estimate_peak, measured_peak, pareto_front, parse_bytes,
)
from tuner_tui.engine.search.report import SearchOutcome, explain, export, report, write_json
from tuner_tui.engine.search.space import (
    DEFAULT_CHOICES, KERNEL_SETS, SearchSpace, default_space, parse_choices,
)
from tuner_tui.engine.search.staged import History, SearchStrategy, StagedSearch, config_key

__all__ = [
    "CHECKPOINT_PRIOR", "DEFAULT_CHOICES", "History", "KERNEL_SETS", "REUSABLE", "Search",
    "SearchOutcome", "SearchPlan", "SearchSpace", "SearchStrategy", "StagedSearch",
    "TRIAL_GRACE_S", "compile_cache_environ", "config_key", "default_memory_budget",
    "default_space", "estimate_peak", "explain", "export", "measured_peak", "pareto_front",
    "parse_bytes", "parse_choices", "report", "workload_key", "write_json",
]
