"""The help screen: what the dashboard shows and its keys."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# gputune

The worker process trains the workload; every configuration you apply is rebuilt from the
same initial weights and batches, so the figures compare like with like.

## Panels
- **Options** (left): generated from the strategy registry. Options this machine cannot run
  are disabled (or marked ✗) and the line under the panel says why. Changed, not yet applied
  options are highlighted.
- **Plots**: tokens/s, step time and loss per step; a yellow mark with the run number shows
  where the configuration changed.
- **Figures**: the current run: tokens/s, step time, MFU and the peak it is measured
  against, peak memory, compile time.
- **GPU / host**: NVML figures per GPU (or why there are none) and the worker's CPU and memory.
- **Leaderboard**: one row per configuration tried; the first row that ran is the baseline.
  Click a header (or press `s`) to sort; the selected row's configuration is shown beside it.
- **Where the step goes** (after `x`, in the configuration's place): the profile of a run, taken by torch.profiler over a
  few steps after its measured ones: the step's time split into matmul, attention,
  norm/elementwise, optimizer, memory copies, communication and idle (on a GPU: no kernel
  running, the host is the limit); the matmuls' TFLOP/s against the peak of their dtype;
  launches per step; torch.compile's graphs, breaks and recompiles; the costliest kernels.
  Beside the bars, the bottleneck (host, memory, compute, communication), why, and what to try.

## Keys
| key | action |
|---|---|
| `a` | apply the options |
| `p` | pause / resume training |
| `r` | re-apply the selected leaderboard row |
| `e` | export the selected row (or the current configuration) |
| `s` | sort the leaderboard by the next column |
| `t` | start / stop the automatic search (`gputune tune`'s stages, trial by trial on this run) |
| `h` | history: what was measured before on this machine (Enter re-applies) |
| `x` | profile the selected row (applied again if it is not the current run) or the current run; again on the row shown: hide the profile |
| `X` | the same, and write its Chrome/Perfetto trace under `gputune-traces/` |
| `b` | apply the baseline (all defaults) |
| `ctrl+r` | restart the worker process |
| `ctrl+p` | command palette: every action by name |
| `?` | this help |
| `q` | quit (the worker is stopped) |

An exported file is read by `gputune bench --config FILE` and by `strategies.load(FILE)`.
"""


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: 84;
        max-height: 90%;
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
