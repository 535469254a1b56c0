"""Horizontal bars drawn with eighth blocks, shared by the GPU and host panels."""

from __future__ import annotations

from rich.text import Text

_EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(fraction: float | None, width: int, style: str = "green") -> Text:
    """A bar `width` cells wide filled to `fraction` (0..1); an empty track when unknown."""
    text = Text(no_wrap=True)
    if fraction is None:
        text.append("·" * width, style="dim")
        return text
    fraction = min(1.0, max(0.0, fraction))
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    text.append("█" * full, style=style)
    if full < width and part:
        text.append(_EIGHTHS[part], style=style)
        full += 1
    text.append("░" * (width - full), style="dim")
    return text


def level_style(fraction: float | None) -> str:
    """Green when there is headroom, yellow when busy, red when nearly full."""
    if fraction is None or fraction < 0.75:
        return "green"
    return "yellow" if fraction < 0.92 else "red"
