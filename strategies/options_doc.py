"""docs/options.md, written from the registry: `python -m strategies.options_doc` rewrites it,
and a test keeps the committed file equal to what this writes. Torch-free."""

from __future__ import annotations

import sys
from pathlib import Path

from strategies.registry import CAPABILITY_WORDS, RULES, STRATEGIES, Option

PATH = Path(__file__).resolve().parents[1] / "docs" / "options.md"

HEADER = """\
# Options

Every option gputune tunes, by the family that applies it (in the order `gputune.apply` applies
them). Each is a key of the `[config]` table of `gputune.toml`, a `--set KEY=VALUE` of `gputune
bench` and `gputune tune`, and a control of the dashboard, which disables what this machine
cannot run and says why.

This file is written from `strategies/registry.py` by `python -m strategies.options_doc`.
"""


def _values(option: Option) -> str:
    default = option.show(option.default)
    if option.kind == "choice":
        return ", ".join(f"**{c}**" if c == option.default else str(c) for c in option.choices)
    if option.kind == "bool":
        return f"true, false (**{default}**)"
    if option.kind == "set":
        return "any of " + ", ".join(option.choices) + " (**none**)"
    return f"{option.describe_allowed()} (**{default}**)"


def _needs(option: Option) -> str:
    needs = []
    if option.requires:
        needs.append("any value but the default: " + "; ".join(
            CAPABILITY_WORDS.get(n, n) for n in option.requires))
    for choice, required in getattr(option, "choice_requires", {}).items():
        needs.append(f"{choice}: " + "; ".join(CAPABILITY_WORDS.get(n, n) for n in required))
    return "; ".join(needs)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    lines = [HEADER]
    for strategy in STRATEGIES:
        lines += [f"## {strategy.name}", "", strategy.help, "",
                  "| option | values (**default**) | what it does | needs |", "|---|---|---|---|"]
        for option in strategy.options:
            lines.append(f"| `{option.key}` | {_cell(_values(option))} | {_cell(option.help)} | "
                         f"{_cell(_needs(option))} |")
        lines.append("")
    lines += ["## Rules across options", "",
              "A configuration that breaks one is refused before anything runs, with a message "
              "that names both options:", ""]
    lines += [f"- {' '.join(rule.__doc__.split())}" for rule in RULES]
    return "\n".join(lines) + "\n"


def main() -> int:
    PATH.write_text(markdown())
    print(f"wrote {PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
