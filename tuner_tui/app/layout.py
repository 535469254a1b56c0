"""How the dashboard lays itself out at a terminal's size.

Three layouts (app.tcss holds them, keyed by a class on the app):
- full (from 150x44, e.g. 160x48): options | plots (or the profile) | figures over memory, GPU
  and host; the leaderboard and the selected row's configuration below.
- medium (from 110x30, e.g. 120x36): the same, with the memory, GPU and host panels scrolling
  under the figures and a leaderboard of fixed height.
- compact (below those, e.g. 80x24): the current figures on the left, one view beside them
  (plots, host and GPU, options, the profile: `v` switches, `x` opens the profile), the
  leaderboard across the bottom. htop and nvitop stay usable at 80x24; so does this.
"""

from __future__ import annotations

FULL, MEDIUM, COMPACT = "full", "medium", "compact"
LAYOUTS = (FULL, MEDIUM, COMPACT)
VIEWS = ("plots", "system", "options", "profile")
"""The views of the compact layout's switchable area, in the order `v` goes through them."""
VIEW_TITLES = {"plots": "plots", "system": "memory · GPU · host", "options": "options",
               "profile": "where the step goes"}


def layout_for(width: int, height: int) -> str:
    if width < 110 or height < 30:
        return COMPACT
    if width < 150 or height < 44:
        return MEDIUM
    return FULL


def next_view(view: str, has_profile: bool) -> str:
    """The view after `view`; the profile only once there is one (or one is on its way)."""
    order = [v for v in VIEWS if v != "profile" or has_profile]
    return order[(order.index(view) + 1) % len(order)] if view in order else order[0]
