"""The outcome of a search and how it is told: why the recommendation won, the printed report,
the JSON, and the exported file. Torch-free."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Iterable

from strategies.config import ExportedConfig, save
from strategies.files import write_atomic
from tuner_tui import format as fmt
from tuner_tui.engine.noise import noise_lines, noise_warning, spread, tie_gap, tied_at_top
from tuner_tui.engine.reference import computes_reference
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.remeasure import Verdict
from tuner_tui.engine.runner import gave_no_result, stopped_while_stepping
from tuner_tui.engine.search.memory import measured_peak
from tuner_tui.engine.search.space import PARALLEL_KNOBS, SearchSpace
from tuner_tui.engine.table import format_profiles, format_table

PROFILED_LEADERS = 3
"""How many of the leading rows' profiles the report shows."""


@dataclass
class SearchOutcome:
    results: list[TrialResult]
    """Every trial decided, in order: measured, reused from the store, skipped."""
    ranked: list[TrialResult]
    """The trials that may be recommended, fastest first (`eligible` of them), then the rest."""
    eligible: int
    front: list[TrialResult]
    recommendation: TrialResult | None
    reason: str
    environment: dict
    workload: dict
    workload_key: str
    space: SearchSpace
    budget_bytes: int
    ran: int = 0
    reused: int = 0
    skipped: int = 0
    out_of_time: bool = False
    end_note: str = ""
    """Why the search ended before its time budget, where it did."""
    interrupted: bool = False
    """Stopped by Ctrl-C, SIGTERM or SIGHUP: the trials measured until then."""
    elapsed_s: float = 0.0
    compared: list[TrialResult] = field(default_factory=list)
    """The results of `SearchPlan.compare`, in its order."""
    steps: int = 0
    warmup_steps: int = 0
    """Measured and warm-up steps per trial."""
    remeasured: Verdict | None = None
    """The leaders re-measured interleaved, when there were two or more."""
    remeasure_note: str = ""
    """Why the leaders were not all re-measured (the time budget), if they were not."""
    errors: int = 0
    """Candidates the search could not run (each is a row with its reason)."""
    error: str = ""
    """The internal error that ended the search early, if one did."""
    timeline: list[dict] = field(default_factory=list)
    """Every trial, reference run and re-measurement in order: when it started and ended (s
    from the search's start), why, what it measured, and the best configuration after it."""
    startup: dict = field(default_factory=dict)
    """When the first worker was ready ("ready_s", s from the search's start) and how long each
    part of its start took (`protocol.WorkerReady.startup_s`)."""
    optimizer_steps: dict = field(default_factory=dict)
    """torchao's AdamW steps compiled beside the trials (`warming.py`): each (weights, state)
    pair compiled, and the seconds it took (None: its compile failed)."""
    optimizer_steps_notes: list = field(default_factory=list)
    """What happened to the worker that compiled them: a failed start, a death, the pair it was
    still compiling when the search ended."""

    def baseline(self) -> TrialResult | None:
        return next((r for r in self.results if r.status == "ok" and is_fp32_eager(r)), None)


def is_fp32_eager(r: TrialResult) -> bool:
    """fp32 eager; on several devices, under either data parallel mode (a group search's
    baseline is its first mode's fp32 eager run)."""
    changed = r.tune_config.changed()
    return set(changed) <= {"batch_size", "grad_clip", "devices", *PARALLEL_KEYS}


def _checked_at_another_batch(top: TrialResult, results: Iterable[TrialResult]) -> TrialResult | None:
    """A trial of the same numerics as `top` (every option but batch size and checkpointing)
    whose loss check passed."""
    same = {"batch_size": 0, "checkpointing": "off", "checkpoint_every": 0}

    def numerics(r: TrialResult) -> dict:
        return {**r.config, **same}

    return next((r for r in results if r.loss_ok and numerics(r) == numerics(top)), None)


PARALLEL_KEYS = ("parallel", *PARALLEL_KNOBS)
"""The data parallel mode and its knobs: what the DDP-or-FSDP2 comparison varies."""


def device_word(device: str | None) -> str:
    return "GPU" if device == "cuda" else "process"


def budget_scope(device: str | None, devices: int) -> str:
    """' per GPU' (' per process' on the CPU) where several devices share the work: each rank's
    peak counts against the budget. Nothing for one device."""
    return f" per {device_word(device)}" if devices > 1 else ""


def count(n: int, word: str) -> str:
    """'2 GPUs', '1 process', '2 processes'."""
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("s") else "s")


def global_batch(result: TrialResult, device: str | None) -> str | None:
    """'global batch 16 = 2 per GPU x 4 accumulation steps x 2 GPUs': what the optimizer sees,
    for a group (None for one device)."""
    config = result.tune_config
    if config.devices == 1 and config.parallel == "none" or not result.batch_size:
        return None
    per_rank = result.batch_size // config.devices
    micro = config.micro_batch_size or per_rank
    word = device_word(device)
    return (f"global batch {result.batch_size} = {micro} per {word} x "
            f"{count(per_rank // micro, 'accumulation step')} x {count(config.devices, word)}")


def _without_parallel(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in PARALLEL_KEYS}


def _rival_text(r: TrialResult, top: TrialResult, budget: int, scope: str) -> str:
    """One trial of another data parallel mode or knob, against the recommendation `top`."""
    label = r.tune_config.parallel_label()
    peak = measured_peak(r)
    if r.status == "ok" and peak is not None and peak > budget:
        return f"{label} peaked at {fmt.gib(peak)}{scope}, over the budget"
    if r.status == "ok" and r.tokens_per_s and r.loss_ok is not False:
        slower = 1 - r.tokens_per_s / top.tokens_per_s
        return (f"{label} {fmt.si(r.tokens_per_s)} {r.item_name}/s at {fmt.gib(peak)}{scope}, "
                f"{abs(slower):.1%} {'slower' if slower >= 0 else 'faster'}")
    if r.status == "ok":
        return f"{label} did not keep the fp32 reference's loss"
    if r.status == "oom":
        return f"{label} ran out of memory"
    return f"{label} {r.status}" + (f" ({r.message})" if r.message else "")


def why_parallel(outcome: SearchOutcome) -> str | None:
    """Why the recommendation's data parallel mode won, from the measured trials: the same
    configuration under the other modes and knobs (fastest first), else the best trial of each
    other mode. None for a recommendation on one device without data parallel."""
    top = outcome.recommendation
    if top is None or top.config.get("parallel", "none") == "none":
        return None
    config = top.tune_config
    scope = budget_scope(outcome.environment.get("device"), config.devices)
    rivals = [r for r in outcome.results if r.config != top.config
              and r.config.get("parallel", "none") != "none"
              and _without_parallel(r.config) == _without_parallel(top.config)]
    rivals.sort(key=lambda r: -(r.tokens_per_s or 0) if r.status == "ok" else 0)
    head = (f"{config.parallel_label()} won: {fmt.si(top.tokens_per_s)} {top.item_name}/s at "
            f"{fmt.gib(measured_peak(top))}{scope}")
    texts = [_rival_text(r, top, outcome.budget_bytes, scope) for r in rivals]
    if texts:
        return head + "; at the same options " + "; ".join(texts)
    eligible = outcome.ranked[:outcome.eligible]
    others = []
    for mode in outcome.space.values("parallel"):
        if mode in ("none", config.parallel):
            continue
        best_of = next((r for r in eligible if r.config.get("parallel") == mode), None)
        others.append(f"the best {mode} measured: {best_of.label}, "
                      f"{fmt.si(best_of.tokens_per_s)} {best_of.item_name}/s" if best_of is not None
                      else f"no {mode} configuration ran within the budget")
    return head + ("; " + "; ".join(others) if others else "")


def tied_leaders(eligible: list[TrialResult]) -> list[TrialResult]:
    """The first measurements tied at the top (`noise.tied_at_top`), fastest first, less those
    whose loss nothing checked (another batch than the fp32 reference's: the search checks the
    fastest's, not theirs): the simplest of them is recommended where the leaders were not
    re-measured."""
    tied = tied_at_top(eligible)
    return [r for r in tied if r is tied[0] or r.loss_ok or computes_reference(r.tune_config)]


def _tie_text(top: TrialResult, tied: list[TrialResult]) -> str:
    """The first measurements of `tied` (fastest first) lie within their spread of each other:
    no one of them is faster than the noise allows to say, and `top` is the simplest."""
    others = [r for r in tied if r is not top]
    names = ", ".join(r.label for r in others[:3]) + (
        f" and {len(others) - 3} more" if len(others) > 3 else "")
    gap = max(tie_gap(spread(tied[0]) or 0.0, spread(r) or 0.0) for r in tied[1:])
    apart = tied[0].tokens_per_s / tied[-1].tokens_per_s - 1
    return (f"a tie with {names}: their first measurements lie {apart:.1%} apart, within their "
            f"spread (±{gap:.1%}); the simpler is recommended")


def _lead_text(top: TrialResult, runner_up: TrialResult) -> str:
    """The first measurements' lead over the runner-up: "faster" only past their combined
    spread. A runner-up left out of the tie (its loss unchecked at its batch) may still lie
    within it: GPT-2's answer of a 9-minute search led by 0.4% at +-0.5% and +-0.6%."""
    ahead = top.tokens_per_s / runner_up.tokens_per_s - 1
    gap = tie_gap(spread(top) or 0.0, spread(runner_up) or 0.0)
    if ahead > gap:
        return f"{ahead:.1%} faster than the runner-up ({runner_up.label})"
    return (f"{ahead:.1%} ahead of the runner-up ({runner_up.label}), within their spread "
            f"(±{gap:.1%}): not faster than the noise allows to say")


def why_none(results: list[TrialResult]) -> str:
    """Why nothing is recommended: where no trial finished its measured steps, how each ended
    (a model too slow for the time budget must not read as one that ran out of memory)."""
    if any(r.tokens_per_s for r in results):  # measured: over the budget, or lost the loss
        return ("no configuration of the space ran within the memory budget and kept the fp32 "
                "reference's loss")
    if not results:
        return "no configuration of the space ran"
    ended: dict[str, int] = {}
    for r in results:
        if gave_no_result(r):
            how = "gave no result within its trial's timeout"
        else:
            how = _ENDED.get(r.status, r.status)
        ended[how] = ended.get(how, 0) + 1
    text = (f"no configuration finished its measured steps: of {len(results)} "
            f"trial{'s' if len(results) != 1 else ''}, "
            + ", ".join(f"{n} {how}" for how, n in ended.items()))
    if any(how in _OUT_OF_TIME for how in ended):
        # (a trial's timeout follows what it was expected to take, not --trial-timeout alone:
        # more time helps only where the budget's end stopped one)
        text += ("; the model's steps are too slow for the time its trials were given: "
                 "shorter sequences (--seq-len) or a smaller batch (--set batch_size=N)"
                 + (", or more time (--budget-minutes)" if _ENDED["timeout"] in ended else "")
                 + (", or a longer --trial-timeout" if any(
                     stopped_while_stepping(r) for r in results) else ""))
    same = workload_error(results)
    if same:
        text += ("; " + ("each crash raised the same error, the fp32 eager baseline's (your model "
                         "and code as written) too" if len(results) > 1 else
                         "the fp32 eager baseline (your model and code as written) raised")
                 + f": {same}; {WORKLOAD_ERROR_SOURCE}")
    return text


WORKLOAD_ERROR_SOURCE = ("it comes from the workload itself, and the run's worker log has its "
                         "traceback")
"""Where an error every row raised comes from (`workload_error`), as tune and bench say it."""


def workload_error(results: list[TrialResult]) -> str | None:
    """The error that every trial raised, the fp32 eager baseline's included (a model with no
    trainable parameter, a loss that is not a scalar, data that runs out), where there is one:
    an error of the workload, which no configuration mends. None where trials ended otherwise,
    or died or hung (the worker's end, not the user's code)."""
    crashed = [r for r in results if r.status == "crash"]
    messages = {r.message for r in crashed}
    if not crashed or len(crashed) < len(results) or len(messages) != 1:
        return None
    message = messages.pop()
    if not message or message.startswith("the worker") or gave_no_result(crashed[0]):
        return None
    return message if any(is_fp32_eager(r) for r in crashed) else None


_ENDED = {"oom": "ran out of memory", "timeout": "was stopped at the time budget's end",
          "compile": "failed to compile", "crash": "crashed", "diverged": "diverged",
          "skipped": "was estimated not to fit the memory budget",
          "loss-mismatch": "lost the fp32 reference's loss",
          "numerics": "lost the fp32 reference's gradients"}
_OUT_OF_TIME = ("gave no result within its trial's timeout", _ENDED["timeout"])


def explain(outcome: SearchOutcome) -> str:
    """Why the recommendation won, in one sentence for the exported file."""
    top = outcome.recommendation
    if top is None:
        return why_none(outcome.results)
    eligible = outcome.ranked[:outcome.eligible]
    tied = tied_leaders(eligible) if outcome.remeasured is None else []
    if len(tied) > 1:
        parts = [f"the simplest of {len(tied)} configurations tied at the top, of "
                 f"{len(eligible)} that ran and kept the loss where it was checked"]
    else:
        parts = [f"fastest of {len(eligible)} configuration{'s' if len(eligible) != 1 else ''} "
                 "that ran and kept the loss where it was checked"]
    if computes_reference(top.tune_config):
        parts[0] += " (it computes the fp32 eager reference itself)"
    elif top.loss_ok:
        parts[0] += (f" (within {top.loss_max_rel_error:.1e} of the fp32 reference, tolerance "
                     f"{top.loss_tolerance:.1%} for {top.config['precision']})")
    elif top.loss_ok is None:
        checked = _checked_at_another_batch(top, outcome.results)
        if checked is not None:
            # Batch size and checkpointing leave the numerics alone: the same precision,
            # compile and kernels kept the loss at another batch size.
            parts[0] += (f" (its loss checked at batch {checked.batch_size}: within "
                         f"{checked.loss_max_rel_error:.1e} of the fp32 reference; no fp32 "
                         f"reference ran at batch {top.batch_size})")
        else:
            parts[0] += (f" (its loss could not be checked: no fp32 reference ran at batch "
                         f"{top.batch_size})")
    base = outcome.baseline()
    if base is not None and base is not top:
        parts.append(f"{top.tokens_per_s / base.tokens_per_s:.2f}x the fp32 eager baseline")
    for other in outcome.compared:
        if other is not top and other.status == "ok" and other.tokens_per_s:
            parts.append(f"{top.tokens_per_s / other.tokens_per_s:.2f}x {other.label} "
                         "(--compare, same run)")
    runner_up = next((r for r in eligible if r is not top), None)
    if outcome.remeasured is not None:
        parts.append(outcome.remeasured.text())
    elif len(tied) > 1:
        parts.append(_tie_text(top, tied))
    elif runner_up is not None:
        parts.append(_lead_text(top, runner_up))
    if outcome.remeasure_note:
        parts.append(outcome.remeasure_note)
    peak = measured_peak(top)
    devices = top.tune_config.devices
    if peak is not None:
        parts.append(f"peak {fmt.gib(peak)} within the {fmt.gib(outcome.budget_bytes)} budget"
                     + budget_scope(outcome.environment.get("device"), devices))
    for extra in (why_parallel(outcome), global_batch(top, outcome.environment.get("device"))):
        if extra:
            parts.append(extra)
    if noise_warning(top):
        parts.append(noise_warning(top))
    return "; ".join(parts)


def export(outcome: SearchOutcome, path: str | os.PathLike, write=save):
    """Write the recommendation with `write(ExportedConfig, path)` (default `save`), and
    return what it returns; None when there is none."""
    top = outcome.recommendation
    if top is None:
        return None
    measured = top.measured()
    measured["reason"] = outcome.reason
    measured["search_trials"] = len(outcome.results)
    return write(ExportedConfig(top.tune_config, measured, outcome.environment,
                                outcome.workload["name"]), path)


def write_json(path: str | os.PathLike, outcome: SearchOutcome) -> None:
    doc = {
        "tool": "gputune tune",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workload": outcome.workload,
        "steps": outcome.steps,
        "warmup_steps": outcome.warmup_steps,
        "memory_budget_bytes": outcome.budget_bytes,
        "memory_budget_per_device": outcome.space is not None and outcome.space.devices > 1,
        "space": {k: [list(v) if isinstance(v, tuple) else v for v in vs]
                  for k, vs in outcome.space.choices} if outcome.space is not None else {},
        "environment": outcome.environment,
        "results": [r.to_dict() for r in outcome.ranked],
        "pareto_front": [r.label for r in outcome.front],
        "recommendation": outcome.recommendation.to_dict() if outcome.recommendation else None,
        "reason": outcome.reason,
        "compared": [
            dict(r.to_dict(), recommendation_speedup=(
                outcome.recommendation.tokens_per_s / r.tokens_per_s
                if outcome.recommendation and r.tokens_per_s else None))
            for r in outcome.compared
        ],
        "remeasured": outcome.remeasured.to_dict() if outcome.remeasured else None,
        "remeasure_note": outcome.remeasure_note,
        "counts": {"ran": outcome.ran, "reused": outcome.reused, "skipped": outcome.skipped,
                   "errors": outcome.errors},
        "interrupted": outcome.interrupted,
        "out_of_time": outcome.out_of_time,
        "end_note": outcome.end_note or None,
        "error": outcome.error or None,
        "elapsed_s": outcome.elapsed_s,
        "timeline": outcome.timeline,
        "startup": outcome.startup,
        "optimizer_steps_compiled": outcome.optimizer_steps,
        "optimizer_steps_notes": outcome.optimizer_steps_notes,
    }
    write_atomic(path, json.dumps(doc, indent=2) + "\n")


def startup_line(startup: dict) -> str:
    """What the first worker's start took, before any trial could run."""
    parts = ", ".join(f"{part} {seconds:.1f} s" for part, seconds in startup.items()
                      if part != "ready_s" and seconds is not None)
    return f"the first worker was ready after {startup['ready_s']:.1f} s ({parts})"


def report(outcome: SearchOutcome) -> str:
    """The ranked table, the Pareto front and the recommendation, as printed by `gputune tune`."""
    base = outcome.baseline()
    # What the workload counts, as its first worker said: rows that all crashed still say it.
    items = (outcome.workload or {}).get("item_name") or next(
        (r.item_name for r in outcome.results if r.tokens_per_s), "tokens")
    lines = [
        f"{len(outcome.results)} trials in {fmt.clock(outcome.elapsed_s)}: {outcome.ran} ran, "
        f"{outcome.reused} reused from the store"
        + (f", {outcome.errors} could not run" if outcome.errors else "")
        + (" (time budget reached)" if outcome.out_of_time else "")
        + (f" ({outcome.end_note})" if outcome.end_note else "")
        + (" (interrupted)" if outcome.interrupted else ""),
        "",
        "Ranked (x base: against the fp32 eager baseline):",
        format_table(outcome.ranked, baseline=base.tokens_per_s if base else None,
                     item_name=items),
    ]
    if outcome.front:
        lines += ["", "Throughput / memory Pareto front:", format_table(
            outcome.front, baseline=base.tokens_per_s if base else None, item_name=items)]
    noisy = noise_lines(outcome.ranked)
    if noisy:
        lines += ["", "Noise (spread: half the interquartile range of the step times):", *noisy]
    progress = best_over_time(outcome.timeline, items)
    if progress:
        lines += ["", "The best so far, over the search's time:", *progress]
    spent = time_spent(outcome.timeline)
    if spent:
        lines += ["", spent]
    if outcome.remeasured is not None:
        lines += ["", outcome.remeasured.text()]
    if outcome.remeasure_note:
        lines += ["", outcome.remeasure_note]
    if outcome.error:
        lines += ["", f"The search stopped early on an internal error: {outcome.error}"]
    leaders = [r for r in outcome.ranked[:outcome.eligible] if r.profile][:PROFILED_LEADERS]
    if leaders:
        lines += ["", "Where the leading rows' step time goes (profiled after the measured "
                  "steps):", format_profiles(leaders).lstrip("\n")]
    lines.append("")
    if outcome.space is not None and outcome.space.devices > 1:
        word = device_word(outcome.environment.get("device"))
        lines.append(f"Memory budget: {fmt.gib(outcome.budget_bytes)} per {word} (each rank's "
                     f"peak counts against it; {count(outcome.space.devices, word)})")
        batch = global_batch(outcome.recommendation, outcome.environment.get("device")) \
            if outcome.recommendation else None
        if batch:
            lines.append(f"Recommended {batch}")
    if outcome.recommendation:
        lines.append(f"Recommended: {outcome.recommendation.label}: {outcome.reason}")
    else:
        lines.append(f"No recommendation: {outcome.reason}")
    return "\n".join(lines)


def best_over_time(timeline: list[dict], item_name: str = "tokens") -> list[str]:
    """One line each time the best configuration changed: when, which, how fast (in the
    workload's items a second), and why it was tried."""
    lines, last = [], None
    for event in timeline:
        label = event.get("best_label")
        if label is None or label == last:
            continue
        last = label
        # After a colon, not in parentheses: a reason often holds parentheses of its own.
        why = f": {event['why']}" if event.get("why") and event.get("label") == label else ""
        lines.append(f"  {fmt.clock(event['ended_s'])}  {fmt.si(event['best_tokens_per_s'])} "
                     f"{item_name}/s  {label}{why}")
    return lines


PHASE_WORDS = {"reference gradients": "the fp32 reference's gradients", "build": "builds",
               "first step": "first steps (compiles)", "warm-up": "warm-up steps",
               "held": "measured steps held while another worker started or ended",
               "measured": "measured steps", "profile": "profiles"}
"""What the report calls each part of a trial (`TrialResult.phases_s`)."""


def time_spent(timeline: list[dict]) -> str | None:
    """Where the runs' time went, part by part (summed over the time line's runs, largest
    first), and what their workers' clocks do not hold; None where no run timed its parts."""
    ran = [e for e in timeline if e.get("how") == "ran"]
    totals: dict[str, float] = {}
    for event in ran:
        for part, seconds in (event.get("phases_s") or {}).items():
            if seconds:
                totals[part] = totals.get(part, 0.0) + seconds
    if not totals:
        return None
    within = sum(e["ended_s"] - e["started_s"] for e in ran)
    parts = ", ".join(f"{PHASE_WORDS.get(part, part)} {seconds:.0f} s"
                      for part, seconds in sorted(totals.items(), key=lambda kv: -kv[1]))
    rest = max(0.0, within - sum(totals.values()))
    return (f"Where the runs' time went ({count(len(ran), 'run')}, {fmt.clock(within)}): {parts}; "
            f"the rest, {rest:.0f} s: waiting for a worker's start, the fp32 reference's losses, "
            f"runs that stopped before their measured steps")
