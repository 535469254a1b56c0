"""A trial whose loss was never compared with the fp32 reference (it ran at another batch than
the reference's): what the search may conclude from it, and what it does before recommending it.
Torch-free: the search's References and Priors on rows made here."""

import dataclasses

from strategies.config import TuneConfig
from tuner_tui.engine.reference_cache import ReferenceCache
from tuner_tui.engine.search import History, default_space
from tuner_tui.engine.search.priors import Context, Priors
from tuner_tui.engine.search.references import References, lost_with
from search_cases import GPU, row_of

COMMON = {"precision": "bf16", "attention": "sdpa", "compile_mode": "default"}
LOSSES = (10.0, 9.9, 9.8, 9.7, 9.6, 9.5, 9.4, 9.3)


def unchecked(tokens_per_s: float, **config) -> object:
    """A row that ran at another batch than the reference's: no loss compared."""
    c = TuneConfig.from_dict(config)
    return dataclasses.replace(row_of(tokens_per_s, **config), loss_ok=None,
                               batch_size=c.batch_size, losses=LOSSES)


def lost(tokens_per_s: float, **config) -> object:
    c = TuneConfig.from_dict(config)
    return dataclasses.replace(row_of(tokens_per_s, status="loss-mismatch", **config),
                               loss_ok=False, batch_size=c.batch_size)


def references(tmp_path, rows, run=None) -> References:
    history = History(default_space(GPU, 16))
    for r in rows:
        history.add(r.tune_config, r)
    refs = References(ReferenceCache(tmp_path), "w", {"gpu_name": "sim"}, 16, 16, history,
                      run=run or (lambda *a, **k: None), fits_device=lambda c: True)
    refs.losses[(16, 1.0)] = LOSSES  # the reference ran at the run's batch (16)
    return refs


def test_a_run_whose_loss_was_not_compared_does_not_clear_the_numerics_it_changes():
    priors = Priors(Context("cuda", large=False, default_batch=16), canonical=lambda c: c)
    fp8 = TuneConfig.from_dict({**COMMON, "fp8": "tensorwise", "batch_size": 16})
    priors.observe(fp8, lost(1000.0, **fp8.to_dict()))
    bigger = fp8.replace(batch_size=64)
    priors.observe(bigger, unchecked(1100.0, **bigger.to_dict()))
    # It ran (compile worked once more) but its loss was never compared: float8 stays the
    # suspect it became.
    assert ("fp8", "tensorwise") not in priors.successes and priors.chance_it_works(fp8) < 0.3
    # Its loss kept when checked after the run: now float8 has kept the loss here.
    priors.observe_check(bigger, dataclasses.replace(unchecked(1100.0, **bigger.to_dict()),
                                                     loss_ok=True))
    assert priors.chance_it_works(fp8) > 0.5


def test_a_best_with_the_numerics_that_lost_the_loss_elsewhere_is_not_recommended(tmp_path):
    # float8 beside bf16 weights lost the loss at batch 16, and bf16 weights kept it alone: the
    # blame is float8's. float8 without bf16 weights leads at batch 64, unchecked.
    weights = {**COMMON, "weights": "bf16", "batch_size": 16}
    failed = lost(900.0, **weights, fp8="tensorwise")
    best = unchecked(1200.0, **{**COMMON, "fp8": "tensorwise", "batch_size": 64,
                                "micro_batch_size": 16})
    # float8 rowwise never lost it: not judged by tensorwise's loss.
    rowwise = unchecked(1250.0, **{**COMMON, "fp8": "rowwise", "batch_size": 64})
    refs = references(tmp_path, [row_of(1000.0, **weights), failed, best, rowwise])
    [(row, by)] = refs.lost_unchecked()
    assert row is best and by is failed
    marked = lost_with(best, failed)
    assert marked.status == "loss-mismatch" and marked.loss_ok is False
    assert failed.label in marked.message and "fp8 tensorwise" in marked.message


def test_a_loss_lost_in_micro_batches_counts_only_against_configurations_that_split(tmp_path):
    # bf16 kept the loss, and lost it in micro-batches (a BatchNorm, a loss over a count that
    # differs between micro-batches): the split is blamed, not bf16.
    whole = {**COMMON, "batch_size": 16}
    split = unchecked(1100.0, **COMMON, batch_size=64, micro_batch_size=8)
    refs = references(tmp_path, [row_of(1000.0, **whole),
                                 lost(900.0, **whole, micro_batch_size=4),
                                 unchecked(1200.0, **COMMON, batch_size=64), split])
    assert [row for row, _ in refs.lost_unchecked()] == [split]


def test_where_no_reference_runs_at_the_best_s_batch_its_numerics_are_checked_at_the_run_s(
        tmp_path):
    # The fp32 reference at batch 64 crashes (out of memory, a dead worker); the reference at
    # the run's batch (16) is known: the best is measured there, in micro-batches no larger
    # than its own, and what that check says is the best's.
    best = unchecked(1200.0, **{**COMMON, "fp8": "rowwise", "batch_size": 64,
                                "micro_batch_size": 8})
    for kept in (False, True):
        ran = []

        def run(config, why, kind="reference"):
            ran.append((config, kind))
            if config.precision == "fp32":
                return dataclasses.replace(row_of(status="crash", **config.to_dict()),
                                           batch_size=config.batch_size)
            row = row_of(1100.0, **config.to_dict()) if kept else lost(1100.0,
                                                                       **config.to_dict())
            refs.history.add(config, row)
            return row

        refs = references(tmp_path / str(kept), [best], run)
        checked = refs.check_later(best.tune_config, best, 1e9, lambda step_s: 1.0)
        probe, kind = ran[-1]
        assert kind == "trial" and probe == best.tune_config.replace(batch_size=16)
        assert probe.micro_batch_size == 8 and probe.fp8 == "rowwise"
        if kept:
            assert checked is None and refs.checked_elsewhere(best.tune_config)
        else:
            assert checked.status == "loss-mismatch" and "batch 16" in checked.message


def test_every_unchecked_row_with_the_numerics_that_lost_is_found_not_only_the_best(tmp_path):
    # Rows that ran unchecked while another led can take the lead later (a leader lost the
    # loss, a re-measure): each is judged, whichever ran last.
    fp8 = {**COMMON, "fp8": "tensorwise"}
    rows = [row_of(1000.0, **COMMON, batch_size=16),
            lost(1100.0, **fp8, batch_size=16),
            unchecked(1300.0, **fp8, batch_size=64),
            unchecked(1250.0, **fp8, checkpointing="selective", batch_size=128),
            unchecked(1200.0, **COMMON, batch_size=64),
            unchecked(300.0, precision="fp32", batch_size=64)]
    # The same numerics as the one that lost, but kept at batch 16 in another trial: judged
    # by its own numerics' check, not by the loss of its neighbour (another compile mode).
    same = {**fp8, "compile_mode": "reduce-overhead"}
    rows += [row_of(1150.0, **same, batch_size=16), unchecked(1400.0, **same, batch_size=64)]
    refs = references(tmp_path, rows)
    found = refs.lost_unchecked()
    assert [(r.tokens_per_s, by.tokens_per_s) for r, by in found] == [(1300.0, 1100.0),
                                                                     (1250.0, 1100.0)]


def test_the_reference_ladder_halves_the_micro_batch_down_to_one_sample():
    from tuner_tui.engine.reference import reference_configs

    def ladder(batch):
        return [(c.precision, c.checkpointing, c.micro_batch_size)
                for c in reference_configs(TuneConfig().replace(batch_size=batch))]

    assert ladder(128)[:3] == [("fp32", "off", 0), ("fp32", "full", 0), ("fp32", "full", 64)]
    assert [m for _, _, m in ladder(128)[2:]] == [64, 32, 16, 8, 4, 2, 1]
    assert [m for _, _, m in ladder(96)[2:]] == [48, 24, 12, 6, 3, 1]  # each divides the batch
    assert [m for _, _, m in ladder(0)[2:]] == [1]  # the default batch: not known here


def test_a_reference_the_device_holds_only_split_runs_at_the_largest_micro_batch_it_holds(
        tmp_path):
    # GPT-2's fp32 reference at batch 128 ran one sample at a time on an H100: 4.7 s a step,
    # where micro-batches of 64 would have taken about 2.8 s.
    ran = []

    def run(config, why, kind="reference"):
        ran.append(config)
        return dataclasses.replace(row_of(50.0, **config.to_dict()),
                                   batch_size=config.batch_size, losses=LOSSES)

    refs = references(tmp_path, [], run)
    refs.fits_device = lambda c: c.checkpointing == "full" and 0 < c.micro_batch_size <= 32
    grown = TuneConfig.from_dict({**COMMON, "batch_size": 128})
    assert refs.for_config(grown, now=True) == LOSSES
    assert [(c.precision, c.checkpointing, c.micro_batch_size) for c in ran] == [
        ("fp32", "full", 32)]


def test_the_reference_ladder_steps_down_only_after_running_out_of_memory(tmp_path):
    # Simulated, a reference at batch 64 hung at micro-batches of 32, 16 and 8 in turn: a
    # minute each, where a smaller micro-batch mends only an out-of-memory run.
    for failed, expected in (("oom", ["off", "full"]), ("crash", ["off"])):
        ran = []

        def run(config, why, kind="reference"):
            ran.append(config.checkpointing)
            status = failed if config.checkpointing == "off" else "ok"
            return dataclasses.replace(row_of(50.0, status=status, **config.to_dict()),
                                       batch_size=config.batch_size,
                                       losses=LOSSES if status == "ok" else ())

        refs = references(tmp_path / failed, [], run)
        grown = TuneConfig.from_dict({**COMMON, "batch_size": 64})
        refs.for_config(grown, now=True)
        assert ran == expected


def test_the_reference_ladder_runs_no_rung_the_model_cannot_tell_apart(tmp_path):
    # A model without attention or repeated blocks: "fp32 + sdpa" is its fp32 baseline, and
    # full checkpointing changes nothing in it. An MLP whose baseline crashed had its reference
    # run again as "fp32 + sdpa", the same run. Out of memory, only the micro-batches mend it.
    why = {"attention": "no attention module", "checkpointing": "no repeated blocks"}
    space = default_space(GPU, 16, inapplicable=why)
    ran = []

    def run(config, why, kind="reference"):
        ran.append(config)
        found = refs.history.get(config)
        if found is not None:  # (the driver returns a decided configuration's row)
            return found
        status = "oom" if config.micro_batch_size in (0, 16) else "ok"
        return dataclasses.replace(row_of(50.0, status=status, **config.to_dict()),
                                   batch_size=config.batch_size,
                                   losses=LOSSES if status == "ok" else ())

    refs = references(tmp_path, [], run)
    refs.canonical = space.canonical
    grown = TuneConfig.from_dict({**COMMON, "batch_size": 32})
    assert refs.for_config(grown, now=True) == LOSSES
    assert [(c.attention, c.checkpointing, c.micro_batch_size) for c in ran] == [
        ("manual", "off", 0), ("manual", "off", 16), ("manual", "off", 8)]
