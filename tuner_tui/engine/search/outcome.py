"""What a search ended with, put together from the driver's state on every exit path (the
time budget, the strategy's end, Ctrl-C, an internal error): the rows in the order they ran and
ranked, the recommendation (the best by first measurement, unless the leaders' re-measure named
another), why, and the time line. The report, the JSON and the export are written from it.
Torch-free."""

from __future__ import annotations

from tuner_tui.engine.noise import simplest
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.remeasure import Verdict
from tuner_tui.engine.runner import best
from tuner_tui.engine.search.memory import pareto_front
from tuner_tui.engine.search.report import SearchOutcome, explain, tied_leaders


def recommendation(search) -> tuple[TrialResult | None, Verdict | None]:
    """The best by first measurement (the simplest of those tied with it), unless the last
    re-measurement of it named another (`search`: the driver, whose history and leaders'
    verdicts it reads)."""
    eligible = search.history.eligible() if search.history is not None else []
    top = best(eligible)
    for verdict in reversed(search.leaders.verdicts):
        originals = [c.original for c in verdict.candidates]
        if top is not None and any(o is top for o in originals):
            return (verdict.winner or top), verdict
    # Not re-measured: first measurements within their spread of the fastest are a tie, won by
    # the simpler configuration, as a verdict and the dashboard decide.
    return simplest(tied_leaders(eligible)) if top is not None else None, None


def assemble(search) -> SearchOutcome:
    """The outcome of `search` as it stands. Set up may have stopped part way (a worker that
    could not start): what is missing is left empty."""
    results = list(search.order)
    history = search.history
    eligible = history.eligible() if history is not None else []
    ranked = sorted(eligible, key=lambda r: -r.tokens_per_s)
    ranked += [r for r in results if not any(r is x for x in ranked)]
    top, verdict = recommendation(search)
    out_of_time = search.out_of_time or bool(
        search.plan.budget_s and not search.interrupted and search.time_left() <= 0)
    notes = (search.leaders.note, getattr(getattr(search, "refs", None), "unchecked_note", ""))
    outcome = SearchOutcome(
        results=results, ranked=ranked, eligible=len(eligible),
        front=pareto_front(eligible), recommendation=top, reason="",
        environment=getattr(search, "environment", {}), workload=getattr(search, "workload", {}),
        workload_key=getattr(search, "workload_key", ""), space=getattr(search, "space", None),
        budget_bytes=getattr(search, "budget_bytes", 0),
        ran=search.counts["ran"], reused=search.counts["reused"],
        skipped=search.counts["skipped"], errors=search.counts.get("error", 0),
        out_of_time=out_of_time, end_note=search.end_note, interrupted=search.interrupted,
        error=search.error, elapsed_s=search.elapsed(), compared=list(search.compared),
        steps=search.plan.steps, warmup_steps=search.plan.warmup_steps, remeasured=verdict,
        remeasure_note="; ".join(n for n in notes if n),
        timeline=[e.to_dict() for e in search.timeline],
        startup=dict(getattr(search, "startup", {})),
        optimizer_steps=warming.to_dict() if (warming := getattr(
            getattr(search, "times", None), "warming", None)) is not None else {},
        optimizer_steps_notes=list(warming.notes) if warming is not None else [],
    )
    try:
        outcome.reason = explain(outcome)
    except Exception as exc:  # the report must be written whatever the explanation does
        outcome.reason = f"(the reason could not be put in words: {type(exc).__name__})"
    return outcome
