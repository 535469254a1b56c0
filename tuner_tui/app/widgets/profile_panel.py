"""Where a run's step time goes: the profile's categories as bars, and beside them the verdict
(host, memory, compute, communication), its evidence and what to try. Key `x` asks for it (and
on the row it shows, hides it again)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tuner_tui import format as fmt
from tuner_tui.app.widgets.bars import bar
from tuner_tui.engine.profile import CATEGORIES, CATEGORY_NAMES, flop_line

BAR_WIDTH = 14
CATEGORY_STYLE = {
    "matmul": "green", "attention": "cyan", "elementwise": "yellow", "optimizer": "magenta",
    "copy": "blue", "communication": "red", "idle": "bright_black",
}
VERDICT_STYLE = {"host": "bold red", "memory": "bold yellow", "compute": "bold green",
                 "communication": "bold magenta"}


def category_bars(profile: dict, width: int) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column(justify="right", no_wrap=True)
    shares = profile["categories"]
    for key in CATEGORIES:
        table.add_row(Text(CATEGORY_NAMES[key], style="dim"),
                      bar(shares[key], width, CATEGORY_STYLE[key]), f"{shares[key]:.0%}")
    return table


def facts(profile: dict) -> Text:
    text = Text()
    unit = "launches" if profile["timeline"] == "GPU" else "ops"
    text.append(f"{profile['step_ms']:.1f} ms profiled step, "
                f"{profile['launches_per_step']:,.0f} {unit}/step", style="dim")
    own = profile.get("profiler_memory_bytes")
    if own:
        text.append(f"\nthe profiler's own memory: {fmt.size(own)}, not in the row's peak",
                    style="dim")
    counts = profile.get("compile") or {}
    if counts.get("graphs"):
        text.append(f"\ncompile: {counts['graphs']} graphs, {counts.get('graph_breaks', 0)} "
                    f"breaks, {counts.get('recompiles', 0)} recompiles", style="dim")
    return text


def verdict(profile: dict) -> Text:
    kind = profile["bottleneck"]
    text = Text()
    text.append(f"{kind}-bound", style=VERDICT_STYLE.get(kind, "bold"))
    text.append(f"\n{profile['evidence']}")
    if profile["suggestions"]:
        text.append("\ntry:", style="bold")
        for s in profile["suggestions"]:
            text.append(f"\n• {s}")
    return text


def top_kernels(profile: dict, width: int) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    for k in profile["top_kernels"]:
        name = k["name"] if len(k["name"]) <= width else k["name"][: width - 1] + "…"
        text.append(f"\n{k['share']:4.0%} {name}", style="dim")
    return text


class ProfilePanel(Static):
    """Shows one run's profile; `show(None, ...)` says how to ask for one."""

    WIDE = 72
    """From this width the verdict stands beside the bars; below it, under them."""

    number: int | None = None
    """The leaderboard row whose profile is shown."""

    def show(self, number: int | None, label: str, profile: dict | None, note: str = "") -> None:
        self.number = number if profile else None
        self._shown = (number, label, profile, note)
        if profile is None or not profile.get("categories"):
            message = (profile or {}).get("error") or note or (
                "x profiles the selected row (or the current run) after its measured steps; "
                "X also writes a Perfetto trace.")
            self.update(Text(message, style="dim"))
            self.border_subtitle = ""
            return
        self.border_subtitle = f"run {number}: {label}" if number is not None else label
        width = self.size.width
        if width >= self.WIDE:
            body = Table.grid(padding=(0, 2), expand=True)
            body.add_column(no_wrap=True)
            body.add_column(ratio=1)
            body.add_row(Group(category_bars(profile, BAR_WIDTH), facts(profile)), verdict(profile))
        else:  # narrow (the compact layout): the verdict first, where it is seen
            body = Group(verdict(profile), category_bars(profile, max(4, min(BAR_WIDTH, width - 28))),
                         facts(profile))
        parts = [body, top_kernels(profile, max(20, width - 8))]
        if rates := flop_line(profile):  # full width: with SDPA or two precisions it is long
            parts.insert(1, Text(rates, style="dim", no_wrap=True, overflow="ellipsis"))
        if profile.get("trace"):
            parts.append(Text(f"trace: {profile['trace']}", style="dim"))
        self.update(Group(*parts))

    def on_resize(self) -> None:
        if getattr(self, "_shown", None) is not None:
            self.show(*self._shown)
