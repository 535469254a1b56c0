"""The time line of a `gputune tune` run as a picture: every trial as a bar from its start to its
end at the height of what it measured, and the best configuration so far as a line over the
search's time. Reads the `--json` file; writes SVG (no plotting library needed).

    python3 benchmarks/search_timeline.py tune.json docs/search-timeline.svg [--title TEXT]
        [--hand ITEMS_PER_S --hand-label TEXT]
"""

from __future__ import annotations

import argparse
import html
import json
from pathlib import Path

WIDTH, HEIGHT = 860, 360
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 60
COLOURS = {"trial": "#3b7dd8", "reference": "#999999", "remeasure": "#e8a33d",
           "confirm": "#e8a33d", "compare": "#7a52c7"}
FAILED = "#d64545"


def _ticks(top: float) -> list[float]:
    step = 10 ** len(str(int(top))) / 10
    for factor in (1, 2, 5, 10):
        if top / (step * factor) <= 6:
            step *= factor
            break
    return [i * step for i in range(int(top / step) + 1)]


def draw(doc: dict, title: str, hand: float | None = None, hand_label: str = "by hand") -> str:
    events = doc.get("timeline") or []
    item = (doc.get("workload") or {}).get("item_name", "tokens")
    end = max([e["ended_s"] for e in events] + [doc.get("elapsed_s") or 1.0])
    top = max([e["tokens_per_s"] or 0 for e in events] + [hand or 0, 1.0]) * 1.1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(s: float) -> float:
        return LEFT + plot_w * s / end

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="14">{html.escape(title)}</text>']
    for v in _ticks(top):
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   'stroke="#eeeeee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">'
                   f'{v / 1e3:g}k</text>')
    for s in range(0, int(end) + 1, 60):
        out.append(f'<text x="{x(s):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">'
                   f'{s // 60} min</text>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 14}" text-anchor="middle">'
               f'time since the search started; bars: one trial each, its height what it '
               f'measured ({item}/s)</text>')
    for e in events:
        value = e["tokens_per_s"] or 0
        colour = COLOURS.get(e["kind"], "#3b7dd8") if e["status"] in ("ok", "stopped") else FAILED
        height = max(2.0, plot_h * value / top) if value else 4.0
        out.append(f'<rect x="{x(e["started_s"]):.1f}" y="{y(value) if value else y(0) - 4:.1f}" '
                   f'width="{max(1.5, x(e["ended_s"]) - x(e["started_s"]) - 1):.1f}" '
                   f'height="{height:.1f}" fill="{colour}" fill-opacity="0.35">'
                   f'<title>{html.escape(e["label"])}: {e["status"]} ({html.escape(e["why"])})'
                   f'</title></rect>')
    points, best = [], None
    for e in events:
        if e.get("best_tokens_per_s") and e["best_tokens_per_s"] != best:
            if best is not None:
                points.append((e["ended_s"], best))
            best = e["best_tokens_per_s"]
            points.append((e["ended_s"], best))
    if best is not None:
        points.append((end, best))
        path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="#1b5e20" stroke-width="2.5"/>')
        out.append(f'<text x="{x(end) - 4:.1f}" y="{y(best) - 8:.1f}" text-anchor="end" '
                   f'fill="#1b5e20">best so far: {best / 1e3:.1f}k {item}/s</text>')
    if hand:
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(hand):.1f}" y2="{y(hand):.1f}" '
                   'stroke="#555555" stroke-dasharray="6,4"/>')
        out.append(f'<text x="{LEFT + 6}" y="{y(hand) + 14:.1f}" fill="#555555">'
                   f'{html.escape(hand_label)}: {hand / 1e3:.1f}k {item}/s</text>')
    legend = [("trial", COLOURS["trial"]), ("fp32 reference", COLOURS["reference"]),
              ("re-measure", COLOURS["remeasure"]), ("failed", FAILED)]
    lx = LEFT
    for name, colour in legend:
        out.append(f'<rect x="{lx}" y="{HEIGHT - 44}" width="10" height="10" fill="{colour}" '
                   'fill-opacity="0.5"/>')
        out.append(f'<text x="{lx + 14}" y="{HEIGHT - 35}">{name}</text>')
        lx += 24 + 7 * len(name)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json")
    p.add_argument("svg")
    p.add_argument("--title", default="")
    p.add_argument("--hand", type=float, help="the hand recipe's items/s, drawn as a dashed line")
    p.add_argument("--hand-label", default="the hand recipe")
    args = p.parse_args()
    doc = json.loads(Path(args.json).read_text())
    env = doc.get("environment") or {}
    title = args.title or (f"gputune tune: {doc['workload']['name']} on "
                           f"{env.get('gpu_name') or 'CPU'}")
    Path(args.svg).write_text(draw(doc, title, args.hand, args.hand_label))


if __name__ == "__main__":
    main()
