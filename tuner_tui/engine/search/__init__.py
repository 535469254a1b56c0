"""`gputune tune`: the search, one concern per module.

- `space`: the candidate values of each option and which configurations are the same run;
- `memory`, `memory_prior`, `fit`: measured and estimated peaks, the chance to fit a budget;
- `priors`: what a move is expected to do to throughput, learned as trials are measured;
- `timing`: how long a trial will take;
- `expert`: the recipe an expert would write;
- `opening`: the search's first trials, that recipe eager, its scouts, then compiled;
- `prediction`: what a candidate is expected to give (throughput) and take (trial time);
- `anytime`: the strategy, the next trial by expected gain per second;
- `history`: the trials of one search;
- `executor`: where trials run (fresh workers);
- `references`: the fp32 reference's losses each trial is checked against;
- `plan`: what a search is asked to do (`SearchPlan`) and its time line's entries;
- `deadline`: the time budget, and when a trial is stopped;
- `leaders`: the leaders' interleaved re-measure, planned and run in the time left;
- `surprise`: a contender measured far below its prediction, run once more;
- `driver`: the search itself (`Search`): the time budget, the trials, the outcome;
- `report`: the outcome, why the recommendation won, the report, JSON and export.

The names the CLI, the dashboard and the tests use are re-exported here.
"""

from tuner_tui.engine.search.anytime import AnytimeSearch
from tuner_tui.engine.search.proposal import Proposal, SearchStrategy
from tuner_tui.engine.search.driver import (
    REUSABLE, Search, SearchPlan, compile_cache_environ, default_memory_budget, workload_key,
)
from tuner_tui.engine.search.history import History, config_key
from tuner_tui.engine.search.memory import (
    estimate_peak, measured_peak, pareto_front, parse_bytes,
)
from tuner_tui.engine.search.report import SearchOutcome, explain, export, report, write_json
from tuner_tui.engine.search.space import (
    DEFAULT_CHOICES, KERNEL_SETS, SearchSpace, default_space, parse_choices,
)

__all__ = [
    "AnytimeSearch", "DEFAULT_CHOICES", "History", "KERNEL_SETS",
    "Proposal", "REUSABLE", "Search", "SearchOutcome", "SearchPlan", "SearchSpace",
    "SearchStrategy", "compile_cache_environ", "config_key", "default_memory_budget",
    "default_space", "estimate_peak", "explain", "export", "measured_peak", "pareto_front",
    "parse_bytes", "parse_choices", "report", "workload_key", "write_json",
]
