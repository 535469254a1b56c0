"""The help screen: what the dashboard shows and its keys."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# gputune keys (Esc closes)

| key | action |
|---|---|
| `a` | apply the options |
| `t` | start / stop the automatic search (`gputune tune`'s search, trial by trial on this run) |
| `e` | export the selected row, else the best (or the simpler of a tie), to TOML or JSON |
| `x` | profile the selected row (applied again if it is not the current run) or the current run; again on the row shown: hide the profile |
| `X` | the same, and write its Chrome/Perfetto trace under `gputune-traces/` |
| `p` | pause / resume training |
| `r` | re-apply the selected leaderboard row |
| `b` | apply the baseline (all defaults) |
| `s` | sort the leaderboard by the next column |
| `h` | history: what was measured before on this machine, here and by bench and tune (Enter re-applies) |
| `l` | the log: warnings of the worker and of torch, torchao, triton, transformers |
| `v` | on a small terminal: the next view beside the figures (plots, memory/GPU/host, options, profile) |
| `ctrl+r` | restart the worker process |
| `ctrl+p` | command palette: every action by name |
| `?` | this help |
| `q` | quit (the worker is stopped) |

An exported file is read by `gputune bench --config FILE` and by `strategies.load(FILE)`.

## What the screen shows
The worker process trains the workload; every configuration you apply is rebuilt from the
same initial weights and batches, so the figures compare like with like.

- **Current run**: its rate (tokens/s, or the workload's items) and change against the
  baseline, step time with its spread, MFU and the peak it is measured against, peak memory,
  what the first step builds once (torch.compile, torchao's compiled optimizer step). Once the
  run's row is in, these are the row's figures; before, the median of the steps so far
  ("so far"). While the steps vary by more than 5%, more are measured (up to three times as
  many) before the row is written.
- **Leaderboard**: one row per configuration tried; the first row that ran is the baseline.
  Its title names the best row only when its lead is larger than the spreads of the two rows
  combined; otherwise it says "tie" and which is simpler. ★ marks the best, = a tie at the top.
  Click a header (or press `s`) to sort; narrow terminals leave out the least needed columns.
- **Plots**: rate, step time and loss per step, scaled to the steady steps; the first step and
  the warm-up are dimmed, a yellow mark with the run number shows where the configuration
  changed.
- **Options** (left): generated from the strategy registry. Options this machine cannot run
  are disabled (or marked ✗) and the line under the panel says why. Changed, not yet applied
  options are highlighted.
- **GPU / host**: NVML figures per GPU (or why there are none) and the worker's CPU and memory.
- **Where the step goes** (after `x`, in the plots' place): the profile of a run, taken by
  torch.profiler over a few steps after its measured ones: the step's time split into matmul,
  attention, norm/elementwise, optimizer, memory copies, communication and idle; the verdict
  (host, memory, compute, communication), why, and what to try. The profiler's own memory is
  not counted in the row's peak.
"""


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: 104;
        max-width: 96%;
        max-height: 96%;
        border: thick $primary;
        background: $surface;
        padding: 0 1;
    }
    """

    BINDINGS = [
        Binding("escape,q,question_mark", "close", "Close"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(HELP)

    def action_close(self) -> None:
        self.dismiss(None)
