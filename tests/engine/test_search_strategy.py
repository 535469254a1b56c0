"""`gputune tune`'s strategy, its parts one at a time and without workers: the expert's recipe
and its opening, the moves and their predictions, what a trial teaches, the batch and the
micro-batches. The search as a whole is tested by simulation in test_search_simulated.py, with
real workers in test_search.py."""

import dataclasses
import math
import re

import pytest

from strategies.config import TuneConfig
from strategies.registry import Capabilities
from tuner_tui.engine.protocol import TrialResult
from tuner_tui.engine.search import AnytimeSearch, History, default_space
from tuner_tui.engine.search.moves import options_moved
from tuner_tui.engine.search.expert import variant
from tuner_tui.engine.search.priors import Context
from tuner_tui.engine.search.deadline import Deadline
from tuner_tui.engine.search.timing import TORCHAO_FIRST_S, TrialTimes
from search_cases import CPU, GPU, MEMORY_LEVERS_HELD, MiB, row_of


def _measured(config: TuneConfig, tokens_per_s: float, peak: int = 1, **extra) -> TrialResult:
    return dataclasses.replace(row_of(tokens_per_s, peak, **config.to_dict()), step_ms=100.0,
                               **extra)


def _recipes(strategy: AnytimeSearch, history: History) -> tuple:
    """The expert's eager recipe, measured, then the compiled one it proposes next (after the
    eager recipe with one option changed, measured slower, where such come between them)."""
    eager = strategy.next(history)
    history.add(eager.config, _measured(eager.config, 200e3))
    strategy.observe(eager.config, history.get(eager.config), 10.0, history)
    after = strategy.next(history)
    while after.why.startswith("the eager recipe with"):
        history.add(after.config, _measured(after.config, 190e3))
        strategy.observe(after.config, history.get(after.config), 10.0, history)
        after = strategy.next(history)
    return eager, after


@pytest.mark.parametrize("spread", [0.005, 0.06])
def test_a_scout_within_its_spread_of_the_eager_recipe_leaves_the_choice_to_the_prior(spread):
    """The doubled batch measured 1% slower eager, bf16 weights 5% faster. Quiet (+-0.5%), both
    differences stand and the compiled recipe follows them; noisy (+-6%, as a disturbed H200 row
    of GPT-2 ran), both are ties, and the priors under compile decide: a larger batch pays, bf16
    weights on a small model do not."""
    space = default_space(GPU, 16)
    history = History(space)
    history.add(space.start(), _measured(space.start(), 50e3))
    strategy = AnytimeSearch(space, Context("cuda", large=False, default_batch=16))

    def measure(config, tokens_per_s):
        history.add(config, _measured(config, tokens_per_s, step_ms_q1=100.0 * (1 - spread),
                                      step_ms_q3=100.0 * (1 + spread)))
        strategy.observe(config, history.get(config), 10.0, history)

    eager = strategy.next(history).config
    measure(eager, 200e3)
    proposal = strategy.next(history)
    scouts = []
    while proposal.why.startswith("the eager recipe with"):
        scouts.append(proposal.config)
        measure(proposal.config, 198e3 if proposal.config.weights == eager.weights else 210e3)
        proposal = strategy.next(history)
    assert [c.weights != eager.weights for c in scouts] == [False, True]
    compiled = proposal.config
    assert proposal.why == "the expert's recipe" and compiled.compile_mode != "off"
    noisy = spread > 0.05
    assert (compiled.batch_size or 16) == (32 if noisy else 16)
    assert (compiled.weights == eager.weights) == noisy


def test_the_expert_recipe_is_what_an_expert_writes_for_the_machine_and_model():
    space = default_space(GPU, 16)
    history = History(space)
    history.add(space.start(), _measured(space.start(), 50e3))
    small_history = History(space)
    small_history.add(space.start(), _measured(space.start(), 50e3))
    eager, small = _recipes(AnytimeSearch(space, Context("cuda", large=False, default_batch=16)),
                            small_history)
    # First without compile, with the fused kernels compile would replace; then compiled.
    assert eager.why.startswith("the expert's recipe without compile, first")
    assert eager.config.compile_mode == "off" and "layer_norm" in eager.config.fused_kernels
    assert small.why == "the expert's recipe"
    recipe = small.config
    assert eager.config == recipe.replace(compile_mode="off",
                                          fused_kernels=eager.config.fused_kernels)
    assert (recipe.precision, recipe.attention, recipe.optimizer, recipe.weights) == (
        "bf16", "sdpa", "fused", "fp32")
    assert recipe.compile_mode != "off" and recipe.fused_kernels == ("linear_cross_entropy",)
    assert recipe.fp8 == "off" and recipe.checkpointing == "off"
    # On a model of a billion parameters or more: bf16 weights and float8 pay (the priors say).
    _, large = _recipes(AnytimeSearch(space, Context("cuda", large=True, default_batch=16)),
                        history)
    assert large.config.weights == "bf16" and large.config.fp8 == "tensorwise"
    # On the CPU: no half precision, no kernels (Triton's interpreter), SDPA.
    cpu = default_space(CPU, 8)
    history = History(cpu)
    history.add(cpu.start(), _measured(cpu.start(), 5e3))
    on_cpu = AnytimeSearch(cpu, Context("cpu", default_batch=8)).next(history).config
    assert on_cpu.precision == "fp32" and on_cpu.attention == "sdpa" and not on_cpu.fused_kernels


@pytest.mark.parametrize("params, large, scope", [(2e9, True, "block"), (1.2e8, False, "model")])
def test_the_compiled_recipe_is_compiled_per_block_where_that_expects_more_gain_a_second(
        params, large, scope):
    """A 2B model's whole compile with float8 (about 160 s) would take most of the time left;
    per block it compiles in 0.4 of that for a cost its prior puts at -3% +- 5%: the recipe is
    compiled per block. GPT-2's whole compile takes 25 s and per block costs it 8%: whole. (The
    eager recipe measured far under what the priors predict from the baseline: the other scope
    is predicted from the recipe's prediction, not from the baseline's.) The eager recipe's
    reason quotes the compile at both scopes."""
    space = default_space(GPU, 16, fixed={"batch_size": 16})
    history = History(space)
    history.add(space.start(), _measured(space.start(), 50e3))
    times = TrialTimes("cuda", steps=20, warmup_steps=5, params=int(params))
    strategy = AnytimeSearch(space, Context("cuda", large=large, default_batch=16), times=times,
                             time_available=lambda: 240.0)
    eager, compiled = _recipes(strategy, history)
    assert compiled.why == "the expert's recipe" and compiled.config.compile_mode != "off"
    assert compiled.config.compile_scope == scope
    whole, block = re.search(r"about (\d+) s whole or (\d+) s per block", eager.why).groups()
    quoted = float(whole if scope == "model" else block)
    assert quoted == pytest.approx(compiled.trial_s, rel=0.25)
    assert float(block) < 0.6 * float(whole)


def test_the_scouts_run_where_the_recipe_compiled_per_block_leaves_them_time():
    """A 2B model with 170 s left: its whole compile (float8, about 160 s) leaves no time for
    the eager scouts beside it, its per-block compile does; the scouts run, then the recipe
    per block."""
    space = default_space(GPU, 16)
    history = History(space)
    history.add(space.start(), _measured(space.start(), 50e3))
    times = TrialTimes("cuda", steps=20, warmup_steps=5, params=int(2e9))
    strategy = AnytimeSearch(space, Context("cuda", large=True, default_batch=16), times=times,
                             time_available=lambda: 170.0)
    eager = strategy.next(history)
    history.add(eager.config, _measured(eager.config, 200e3))
    strategy.observe(eager.config, history.get(eager.config), 10.0, history)
    scouts, proposal = 0, strategy.next(history)
    while proposal.why.startswith("the eager recipe with"):
        scouts += 1
        history.add(proposal.config, _measured(proposal.config, 190e3))
        strategy.observe(proposal.config, history.get(proposal.config), 10.0, history)
        proposal = strategy.next(history)
    assert scouts >= 1
    assert proposal.why == "the expert's recipe" and proposal.config.compile_scope == "block"


def _after_the_compiled_recipe() -> tuple:
    """A search on the H200 whose eager recipe measured 200k and compiled one 480k: (space,
    strategy, history, eager, compiled)."""
    space = default_space(GPU, 16, fixed={"batch_size": 16, "fp8": "off"})
    strategy = AnytimeSearch(space, Context("cuda", default_batch=16))
    history = History(space)
    history.add(space.start(), _measured(space.start(), 50e3))
    eager, compiled = (p.config for p in _recipes(strategy, history))
    history.add(compiled, _measured(compiled, 480e3, compile_s=25.0))
    strategy.observe(compiled, history.get(compiled), 40.0, history)
    return space, strategy, history, eager, compiled


def test_a_candidate_near_a_measured_configuration_is_predicted_from_it():
    """After the compiled recipe (480k), an eager variant of it is one option (the kernels) from
    the eager recipe measured at 200k: it is predicted from that measurement, not from the
    compiled one by the compile prior's wide doubt (a short eager trial each, after a compile,
    on the H200 and in the simulation)."""
    space, strategy, history, eager, compiled = _after_the_compiled_recipe()
    parent = strategy.predictor.measured(history.get(compiled))
    child = variant(space, compiled, compile_mode="off")
    assert child not in history and len(options_moved(eager, child)) == 1
    keys = options_moved(compiled, child)
    from_parent = strategy.predictor.predict(parent, child, keys)
    guess, _, _ = strategy.predictor.estimate(parent, child, keys, history)
    assert guess.sd < from_parent.sd
    assert abs(guess.mean - math.log(200e3)) < abs(from_parent.mean - math.log(200e3))
    assert math.exp(guess.mean) < 300e3


def test_a_move_worth_more_per_second_than_the_leaders_re_measure_takes_its_time():
    """The time kept for re-measuring the leaders goes to a move only where the move expects
    more per second than the re-measure is worth."""
    _, strategy, history, _, compiled = _after_the_compiled_recipe()
    strategy.time_available = lambda: 1.0  # the time left, less the re-measure's 300 s
    assert strategy.next(history) is None
    strategy.remeasure_worth = lambda: (0.5, 300.0)  # the leaders may be 50% apart
    assert strategy.next(history) is None
    strategy.remeasure_worth = lambda: (1e-4, 300.0)
    move = strategy.next(history)
    assert move is not None and move.score / move.trial_s > 1e-4 / 300.0


def test_after_the_recipe_each_next_trial_is_a_move_from_the_best_weighed_by_its_cost():
    space = default_space(GPU, 16, fixed={"batch_size": 16, "fp8": "off"})
    strategy = AnytimeSearch(space, Context("cuda", default_batch=16))
    history = History(space)
    history.add(space.start(), _measured(space.start(), 50e3))
    expert = _recipes(strategy, history)[1].config
    history.add(expert, _measured(expert, 480e3, compile_s=25.0))
    strategy.observe(expert, history.get(expert), 40.0, history)
    proposal = strategy.next(history)
    assert proposal.parent == expert and proposal.keys and proposal.mean is not None
    assert proposal.why.startswith("move ")
    # A move that failed to compile is not proposed again, and the value it brought (another
    # compile mode) is blamed (the expert's, which ran, far less): another configuration with
    # it is less likely.
    failed = variant(space, expert, compile_mode="default")
    before = strategy.priors.chance_it_works(failed)
    history.add(failed, TrialResult(config=failed.to_dict(), label=failed.label(),
                                    status="compile", message="compile failed"))
    strategy.observe(failed, history.get(failed), 30.0, history)
    after = strategy.next(history)
    assert after is None or after.config != failed
    assert strategy.priors.chance_it_works(failed) < 0.7 * before
    assert strategy.priors.chance_it_works(expert) > 0.9


def test_a_compared_configuration_counts_as_measured_and_is_never_run_again():
    space = default_space(GPU, 16, fixed={"batch_size": 16})
    strategy = AnytimeSearch(space, Context("cuda", default_batch=16))
    history = History(space)
    compared = strategy_expert = None
    history.add(space.start(), _measured(space.start(), 50e3))
    strategy_expert = AnytimeSearch(space, Context("cuda", default_batch=16)).next(history).config
    compared = strategy_expert  # the user already trains with the expert's recipe
    history.add(compared, _measured(compared, 500e3))
    assert history.best().config == compared.to_dict()
    proposed = []
    for _ in range(5):  # (until no move is worth a trial: those measured fall short of it)
        proposal = strategy.next(history)
        if proposal is None:
            break
        proposed.append(proposal.config)
        history.add(proposal.config, _measured(proposal.config, 400e3))
    assert proposed and compared not in proposed


def test_the_batch_climbs_while_it_pays_and_memory_ends_the_climb():
    fixed = {"precision": "bf16", "attention": "sdpa", "compile_mode": "off",
             "optimizer": "fused", "fused_kernels": (), "checkpointing": "off",
             **MEMORY_LEVERS_HELD}
    space = default_space(GPU, 16, fixed=fixed)
    assert space.values("batch_size") == (0, 32, 64) and space.grow_batch
    # Throughput per batch: rising to 256; 512 runs out of memory.
    speed = {16: 100, 32: 110, 64: 120, 128: 130, 256: 134, 512: 140}
    strategy = AnytimeSearch(space, Context("cuda", default_batch=16), budget_bytes=2**40)
    history = History(space, budget_bytes=2**40)
    tried = []
    for _ in range(30):
        proposal = strategy.next(history)
        if proposal is None:
            break
        c = proposal.config
        n = c.batch_size or 16
        tried.append(n)
        row = (TrialResult(config=c.to_dict(), label=c.label(), status="oom") if n >= 512
               else _measured(c, speed[n] * 1e3, n * MiB))
        history.add(c, row)
        strategy.observe(c, row, 5.0, history)
    assert history.best().config["batch_size"] == 256
    assert 256 in tried and tried.count(512) <= 1  # one out-of-memory, never again
    # A grown batch lies in the space (it can be recommended); an arbitrary one does not, nor
    # one past MAX_GROWTH times the default.
    assert space.contains(TuneConfig.from_dict({**fixed, "batch_size": 256}))
    assert not space.contains(TuneConfig.from_dict({**fixed, "batch_size": 96}))
    assert not space.contains(TuneConfig.from_dict({**fixed, "batch_size": 512}))
    listed = default_space(GPU, 16, fixed=fixed, choices={"batch_size": ("x1", "x2")})
    assert not listed.grow_batch


def test_a_held_option_that_needs_another_value_of_a_searched_one_starts_from_it():
    """`tune --set weights=bf16` needs precision = bf16, which the search holds too: the
    baseline takes the first precision the rules accept, not a refusal (exit 2)."""
    space = default_space(GPU, 16, fixed={"weights": "bf16"})
    assert space.start().precision == "bf16" and space.start().weights == "bf16"


def test_kernels_left_to_inductor_under_compile_make_the_same_run():
    space = default_space(GPU, 16)
    norms = TuneConfig.from_dict({"precision": "bf16", "compile_mode": "default",
                                  "fused_kernels": ["layer_norm", "rms_norm", "swiglu", "gelu"]})
    every = norms.replace(fused_kernels=["layer_norm", "linear_cross_entropy"])
    # Under compile (inductor-first) the norms, SwiGLU and GELU are left to Inductor: the same
    # run as no kernels, or as the loss kernel alone; in eager every kernel swaps.
    assert space.canonical(norms) == norms.replace(fused_kernels=[])
    assert space.canonical(every).fused_kernels == ("linear_cross_entropy",)
    eager = norms.replace(compile_mode="off")
    assert space.canonical(eager) == eager
    # A canonical form of a listed kernel set lies in the space (it can be recommended).
    listed = next(v for v in space.values("fused_kernels") if "linear_cross_entropy" in v)
    assert space.contains(space.canonical(norms.replace(fused_kernels=list(listed))))


def test_a_compiled_recipes_kernels_run_eager_can_be_recommended():
    # On the H200 (llama-1b, 16 GiB) the compiled expert's kernels, the loss kernel alone, ran
    # eager at 10.4k tokens/s against 7.7k for the listed eager set; the faster was left out of
    # the ranking as outside the space. Any part of an allowed set is allowed.
    space = default_space(GPU, 16)
    listed = next(v for v in space.values("fused_kernels") if "linear_cross_entropy" in v)
    loss_only = TuneConfig.from_dict({"precision": "bf16", "fused_kernels": ["linear_cross_entropy"]})
    assert tuple(loss_only.fused_kernels) not in [tuple(v) for v in space.values("fused_kernels")]
    assert len(listed) > 1 and space.contains(loss_only)
    # A kernel the user held out stays out.
    held = default_space(GPU, 16, fixed={"fused_kernels": ["rms_norm"]})
    assert not held.contains(loss_only)
    assert held.contains(loss_only.replace(fused_kernels=["rms_norm"]))


def test_an_option_that_changes_the_training_is_expected_to_change_no_speed():
    from tuner_tui.engine.search.priors import move_prior

    ctx = Context("cuda", large=False, default_batch=16)
    base = TuneConfig()
    clip = move_prior("grad_clip", base, base.replace(grad_clip=0.5), ctx)
    fullgraph = move_prior("compile_fullgraph", base.replace(compile_mode="default"),
                     base.replace(compile_mode="default", compile_fullgraph=True), ctx)
    # A searched clip costs a new fp32 reference (it changes the losses) and can buy no speed:
    # it must rank below any lever with doubt of its own.
    assert clip.mean == 0.0 and clip.sd < 0.01 < fullgraph.sd


def test_a_batch_move_that_changes_neither_batch_nor_micro_batch_is_no_change_and_no_error():
    """Moving key by key from the incumbent, a batch move can land where an earlier key's move
    already put the batch (a 20-minute simulated search divided by its prior's zero deviation
    and ended 7 minutes early): it predicts no change, exactly."""
    from tuner_tui.engine.search.priors import Priors

    priors = Priors(Context("cuda", large=False, default_batch=16), canonical=lambda c: c)
    at = TuneConfig.from_dict({"precision": "bf16", "batch_size": 256, "micro_batch_size": 32})
    same = priors.move("batch_size", at, at)
    default = priors.move("batch_size", TuneConfig(), TuneConfig().replace(batch_size=16))
    assert (same.mean, same.sd) == (0.0, 0.0) and (default.mean, default.sd) == (0.0, 0.0)


def test_a_lost_loss_is_blamed_on_the_numerics_not_on_the_compiler_beside_them():
    from tuner_tui.engine.search.priors import Priors

    priors = Priors(Context("cuda", large=False, default_batch=16), canonical=lambda c: c)
    config = TuneConfig.from_dict({"precision": "fp16", "compile_mode": "default",
                                   "attention": "sdpa"})
    priors.observe(config, row_of(1000.0, status="loss-mismatch", precision="fp16"))
    assert priors.failures.get(("precision", "fp16"), 0) > 0
    assert ("compile_mode", "default") not in priors.failures
    assert ("attention", "sdpa") not in priors.failures
    # A crash is still shared among every risky value.
    priors.observe(config, row_of(status="crash", precision="fp16"))
    assert priors.failures.get(("compile_mode", "default"), 0) > 0


def test_a_failure_whose_message_names_its_cause_is_blamed_on_that_value_alone():
    """A CUDA graph capture error is the graphs' (reduce-overhead, and max-autotune, which
    captures them too): compiling without graphs, float8 and the kernels keep their chance;
    a float8 error is float8's. A message that names nothing is shared as before."""
    from dataclasses import replace

    from tuner_tui.engine.search.priors import Priors

    priors = Priors(Context("cuda", large=True, default_batch=16), canonical=lambda c: c)
    recipe = TuneConfig.from_dict({"precision": "bf16", "fp8": "tensorwise",
                                   "compile_mode": "reduce-overhead", "compile_scope": "block",
                                   "fused_kernels": ("linear_cross_entropy",)})
    default = recipe.replace(compile_mode="default")
    before = priors.chance_it_works(default)
    failed = replace(row_of(status="compile", **recipe.to_dict()),
                     message="compile failed: RuntimeError: CUDA error: operation not "
                             "permitted when stream is capturing")
    priors.observe(recipe, failed)
    assert priors.failures == {("compile_mode", "reduce-overhead"): 1.0,
                               ("compile_mode", "max-autotune"): 0.5}
    assert priors.chance_it_works(default) == before
    assert priors.chance_it_works(recipe) < 0.3 * before
    priors.observe(default, replace(row_of(status="compile", **default.to_dict()),
                                    message="compile failed: _scaled_mm needs sm_89"))
    assert priors.failures[("fp8", "tensorwise")] == 1.0
    assert priors.failures[("fp8", "rowwise")] == 0.5
    assert ("compile_mode", "default") not in priors.failures
    priors.observe(default, replace(row_of(status="crash", **default.to_dict()),
                                    message="the worker process died (exit code -11)"))
    assert priors.failures.get(("compile_mode", "default"), 0) > 0


def test_the_cuda_graph_errors_of_the_committed_gpu_runs_are_named_the_graphs():
    """The GPU's own words: the four trials of the committed H200 files that died with
    "accessing tensor output of CUDAGraphs that has been overwritten" (checkpointing under
    CUDA graphs, 2026-12-02) are blamed on reduce-overhead, as `fails_with` declares."""
    import json
    from pathlib import Path

    from tuner_tui.engine.search.priors import named_causes

    found = 0
    for path in sorted((Path(__file__).resolve().parents[2] / "benchmarks/results").glob(
            "**/*.json")):
        try:
            rows = json.loads(path.read_text()).get("results")
        except (ValueError, AttributeError):
            continue
        for row in rows if isinstance(rows, list) else ():
            if isinstance(row, dict) and "CUDAGraphs" in (row.get("message") or ""):
                found += 1
                named = named_causes(TuneConfig.from_dict(row["config"]), row["message"])
                assert named.get(("compile_mode", "reduce-overhead")) == 1.0, path
    assert found >= 4


def test_a_lost_loss_where_only_the_micro_batches_are_new_is_blamed_on_them():
    """A loss averaged over a count that differs between micro-batches, or a BatchNorm the
    worker did not see: the split changes the training. Where every value beside it that
    changes the numerics has kept them in this search, the split takes the blame, and further
    micro-batched configurations lose their chance; a whole batch keeps its own."""
    from tuner_tui.engine.search.priors import SPLIT, Priors

    priors = Priors(Context("cuda", large=False, default_batch=16), canonical=lambda c: c)
    bf16 = TuneConfig.from_dict({"precision": "bf16", "optimizer": "fused", "batch_size": 64})
    priors.observe(bf16, row_of(1000.0, precision="bf16"))
    split = bf16.replace(micro_batch_size=16)
    before = priors.chance_it_works(split.replace(checkpointing="full"))
    priors.observe(split, row_of(1000.0, status="numerics", precision="bf16"))
    assert priors.failures == {SPLIT: 1.0}
    assert priors.chance_it_works(split.replace(checkpointing="full")) < 0.3 * before
    assert priors.chance_it_works(bf16.replace(checkpointing="full")) \
        == priors.chance_it_works(bf16.replace(checkpointing="full", micro_batch_size=0))
    assert priors.chance_it_works(bf16.replace(batch_size=128)) > 0.9
    # Where a value that changes the numerics has not kept them yet (float8 here), it is the
    # suspect, as before.
    fresh = Priors(Context("cuda", large=False, default_batch=16), canonical=lambda c: c)
    fp8 = split.replace(compile_mode="default", fp8="tensorwise")
    fresh.observe(fp8, row_of(1000.0, status="numerics", precision="bf16"))
    assert SPLIT not in fresh.failures and fresh.failures.get(("fp8", "tensorwise"), 0) > 0


def test_the_expert_fits_a_budget_with_the_levers_that_cost_least_in_all():
    """Two cheap levers (bf16 optimizer state, -1%; selective checkpointing under compile, -2%)
    beat those that close the gap alone (full checkpointing, -17%, which frees the most memory
    per speed lost and was chosen before; every other block, -8%) and a micro-batch half the size
    with the state (-8% on the H200 compiled, -1%)."""
    from tuner_tui.engine.search import default_space
    from tuner_tui.engine.search.expert import fit

    gpu = Capabilities(device="cuda", cuda=True, bf16=True, triton=True, fp8=True)
    space = default_space(gpu, 8)

    class Memory:  # GiB freed per lever, as a memory model would estimate them
        @staticmethod
        def bytes(config):
            gib = 100.0
            gib -= {"fp32": 0, "bf16": 10, "8bit": 12, "offload": 20}[config.optimizer_state]
            gib -= {"off": 0, "selective": 6, "every-n": 20, "full": 60}[config.checkpointing]
            micro = config.micro_batch_size or 8
            gib -= {8: 0, 4: 14, 2: 20, 1: 23}[micro]
            return int(gib * 2**30)

    start = TuneConfig.from_dict({"precision": "bf16", "weights": "bf16", "attention": "sdpa",
                                  "compile_mode": "default"})
    got = fit(space, Context("cuda", large=True, default_batch=8), Memory(), start,
              budget=int(85 * 2**30), share=1.0)
    assert Memory.bytes(got) <= 85 * 2**30
    assert got.checkpointing == "selective" and got.optimizer_state == "bf16"
    assert got.micro_batch_size == 0
    # Where no set of levers fits, the one that frees the most.
    lean = fit(space, Context("cuda", large=True, default_batch=8), Memory(), start,
               budget=int(1 * 2**30), share=1.0)
    assert Memory.bytes(lean) < Memory.bytes(start)


def test_a_move_that_keeps_the_compiled_graph_is_told_apart_from_a_new_graph():
    """Another AdamW, its state, clipping and more micro-batches accumulated leave torch.compile's
    graph as it was (on the H200 they compiled from the cache in 0.11-0.14 of the cold time); a
    new micro-batch or a precision does not. A compile from the cache stays out of the cold
    compiles' median and teaches the share the leaders' re-measure is planned with."""
    from tuner_tui.engine.search.timing import WARM_COMPILE, TrialTimes, graph_key

    base = TuneConfig.from_dict({"precision": "bf16", "compile_mode": "default",
                                 "batch_size": 16})
    same = [base.replace(optimizer="foreach"), base.replace(grad_clip=0.0),
            base.replace(optimizer_state="bf16"),
            base.replace(batch_size=32, micro_batch_size=16)]
    other = [base.replace(batch_size=32), base.replace(precision="fp16"),
             base.replace(compile_mode="reduce-overhead"),
             base.replace(batch_size=32, micro_batch_size=8)]
    assert all(graph_key(c) == graph_key(base) for c in same)
    assert all(graph_key(c) != graph_key(base) for c in other)
    assert graph_key(base.replace(batch_size=0), default_batch=16) == graph_key(base)

    times = TrialTimes("cuda", steps=20, warmup_steps=5, default_batch=16)
    def ran(config, compile_s):
        times.observe(config, TrialResult(config=config.to_dict(), label=config.label(),
                                          status="ok", compile_s=compile_s, step_ms=30.0,
                                          measured_steps=20, warmup_s=0.1), compile_s + 8.0)
    ran(base, 28.0)
    assert times.warm_compile_s(base, 28.0) == pytest.approx(28.0 * WARM_COMPILE)
    ran(same[0], 3.5)  # from the cache
    ran(same[3], 3.0)
    assert times.compiles == {"model": [28.0]}
    assert times.warm_share() == pytest.approx(3.25 / 28.0)
    # A leader that itself compiled from the cache is planned from its graph's cold compile.
    assert times.warm_compile_s(same[3], 3.0) == pytest.approx(28.0 * 3.25 / 28.0)
    ran(other[0], 23.0)  # a new shape: cold
    assert times.compiles == {"model": [28.0, 23.0]}


def test_a_compile_of_a_kind_not_measured_yet_runs_only_where_the_measured_kind_would_fit():
    """ResNet-50 on the H200 compiled whole in 51 s and per block in 86 s (its stages' blocks
    differ), where the priors scale per-block to 0.4 of the whole: the per-block trial started
    with 49 s left and ended 51 s past the budget. Ranked by the scaled time, it must fit as long
    as the measured kind took; once its own kind is measured, by that."""
    from tuner_tui.engine.search.timing import TrialTimes

    space = default_space(GPU, 16, fixed={"batch_size": 16, "precision": "bf16",
                                          "compile_mode": "reduce-overhead"})
    left = [49.0]
    strategy = AnytimeSearch(space, Context("cuda", default_batch=16),
                             times=TrialTimes("cuda", steps=20, warmup_steps=5, default_batch=16),
                             time_available=lambda: left[0])
    history = History(space)
    whole = space.canonical(space.start().replace(optimizer="fused"))
    ran = _measured(whole, 100e3)
    history.add(whole, dataclasses.replace(ran, compile_s=51.0, step_ms=100.0, measured_steps=20,
                               warmup_s=0.5))
    strategy.observe(whole, history.get(whole), 60.0, history)
    per_block = whole.replace(compile_scope="block")
    assert strategy.times.trial_s(per_block, 0.1) < 49.0  # the scaled prediction fits
    assert strategy.times.unmeasured_compile_doubt_s(per_block) == pytest.approx(51.0 * 0.6)
    proposals = []
    for _ in range(40):
        proposal = strategy.next(history)
        if proposal is None:
            break
        proposals.append(proposal.config)
        history.add(proposal.config, _measured(proposal.config, 90e3))
    assert proposals and all(c.compile_scope == "model" for c in proposals)
    # Measured once, per-block compile is predicted by its own time.
    strategy.times.compiles["block"] = [10.0]
    assert strategy.times.unmeasured_compile_doubt_s(per_block) == 0.0


def test_more_micro_batches_accumulated_are_expected_to_pay_little_and_learn_apart():
    """A larger batch at the same micro-batch runs the same kernels more often (GPT-2 on the
    H200: -0.2%); a larger micro-batch runs larger ones (+7% from 16 to 32). Each is predicted by
    its own prior and sharpened only by pairs of its own kind."""
    from tuner_tui.engine.search.priors import Priors, batch_prior

    ctx = Context("cuda", large=False, default_batch=16)
    base = TuneConfig.from_dict({"precision": "bf16", "compile_mode": "default",
                                 "batch_size": 16})
    whole = base.replace(batch_size=32)
    accumulated = base.replace(batch_size=32, micro_batch_size=16)
    assert batch_prior(base, whole, ctx).mean >= 0.03
    small = batch_prior(base, accumulated, ctx)
    assert abs(small.mean) < 0.01 and small.sd < 0.02
    # Whole-batch doubling then micro-batch halving, one move: the accumulation's prior.
    assert batch_prior(whole, accumulated, ctx).mean < 0
    priors = Priors(ctx, canonical=lambda c: c)
    priors.add_pair(base, row_of(100e3), whole, row_of(120e3))  # +18% for larger kernels
    got = priors.move("batch_size", accumulated, accumulated.replace(batch_size=64))
    assert abs(got.mean) < 0.01  # says nothing about accumulating more
    assert priors.move("batch_size", whole, whole.replace(batch_size=64)).mean > 0.06  # prior 0.04


def test_more_micro_batches_are_predicted_from_the_measured_optimizer_step():
    """The optimizer step is shared by the micro-batches of one step: on the H200 a 1.5B llama,
    its optimizer step about a tenth of the step, ran 4 x 4 sequences 6.9% faster than 4; GPT-2,
    its step far longer than its optimizer's, gained nothing from 2 x 64. The search predicts an
    accumulated batch from the parent's measured optimizer step, not from one prior for all."""
    from tuner_tui.engine.search.proposal import Parent
    from tuner_tui.engine.search.priors import accumulation_move

    space = default_space(GPU, 16, fixed={"precision": "bf16", "compile_mode": "default"})
    strategy = AnytimeSearch(space, Context("cuda", default_batch=16))
    base = space.canonical(space.start().replace(precision="bf16", compile_mode="default",
                                                 batch_size=32))
    four = base.replace(batch_size=128, micro_batch_size=32)
    keys = ("batch_size", "micro_batch_size")

    def predicted(optimizer_s):
        parent = Parent(base, 0.0, 0.01, 0.1, True, optimizer_s=optimizer_s)
        return strategy.predictor.predict(parent, four, keys).mean

    share_tenth, share_half_percent = predicted(0.01), predicted(0.0005)
    assert share_tenth > 0.04 and 0 < share_half_percent < 0.005
    assert predicted(None) == strategy.priors.move("batch_size", base, four).mean  # unmeasured
    # One physics both ways: back from four micro-batches to one is the same ratio reversed.
    there = accumulation_move(0.1, 0.01, 1, 4)
    four_step = 4 * 0.09 + 0.01 + 3 * 0.3 * 0.01
    assert accumulation_move(four_step, 0.01, 4, 1).mean == pytest.approx(-there.mean)
    assert accumulation_move(0.01, 0.01, 1, 4) is None  # nothing but the optimizer measured
    # Moves that change the micro-batch's size are the batch prior's (other kernels run).
    whole = base.replace(batch_size=64)
    parent = Parent(base, 0.0, 0.01, 0.1, True, optimizer_s=0.01)
    assert strategy.predictor.predict(parent, whole, ("batch_size",)).mean == \
        strategy.priors.move("batch_size", base, whole).mean


def test_an_accumulating_trial_runs_as_many_micro_batches_not_optimizer_steps():
    """A step of sixteen micro-batches runs sixteen forwards and backwards: measured for as many
    optimizer steps as one micro-batch a step, its trial took sixteen times as long, and the
    search never reached the accumulated batches that pay most on large models. Its warm-up and
    measured steps are a sixteenth, down to two of warm-up and the losses its check compares."""
    from tuner_tui.engine.reference import LOSS_CHECK_STEPS
    from tuner_tui.engine.search.timing import TrialTimes, stepping

    base = TuneConfig().replace(batch_size=16)
    sixteen = base.replace(batch_size=256, micro_batch_size=16)
    assert stepping(base, 5, 10, 16) == (5, 10)
    warm, steps = stepping(sixteen, 5, 10, 16)
    assert warm >= 2 and warm + steps == LOSS_CHECK_STEPS
    assert stepping(base.replace(batch_size=32, micro_batch_size=16), 5, 10, 16) == (3, 5)
    assert stepping(base.replace(batch_size=0), 5, 10, 16) == (5, 10)  # the workload's batch
    # Where no loss of it is compared (the same numerics kept the loss at another batch; a
    # re-measure), it needs no eight: two of warm-up and MIN_MEASURED measured.
    from tuner_tui.engine.search.timing import MIN_MEASURED
    assert stepping(sixteen, 5, 10, 16, losses=0) == (2, MIN_MEASURED)
    times = TrialTimes("cuda", 10, 5, default_batch=16)
    stepped = times.trial_s(sixteen, 1.6) - times.first_step_s(sixteen, 1.6)
    assert stepped == pytest.approx(times.start_s() + (warm - 1 + steps) * 1.6)
    assert times.trial_s(sixteen, 1.6) < 0.6 * 16 * times.trial_s(base, 0.1)


def test_a_noisy_measurement_teaches_a_move_as_little_as_its_spread_allows():
    """On the H200 one eager trial of bf16 weights ran at +-11% and 9% under fp32 weights, where
    two quiet runs of it on other days measured 11% over: learned as sharply as a quiet pair, it
    kept the search off bf16 weights. A noisy pair moves the prediction less than a quiet one of
    the same ratio, and a quiet pair still moves it most of the way."""
    from dataclasses import replace as with_fields

    from tuner_tui.engine.search.priors import Priors

    ctx = Context("cuda", large=False, default_batch=16)
    fp32 = TuneConfig.from_dict({"precision": "bf16", "batch_size": 16})
    bf16 = fp32.replace(weights="bf16", optimizer="plain")
    prior = Priors(ctx, canonical=lambda c: c).move("weights", fp32, bf16).mean

    def learned(spread):
        priors = Priors(ctx, canonical=lambda c: c)
        slow = with_fields(row_of(90e3), step_ms=100.0, step_ms_q1=100.0 * (1 - spread),
                           step_ms_q3=100.0 * (1 + spread))
        priors.add_pair(fp32, row_of(100e3), bf16, slow)  # -10.5%
        return priors.move("weights", fp32, bf16).mean

    quiet, noisy = learned(0.01), learned(0.114)
    assert quiet < prior - 0.05
    assert quiet < noisy < prior
    assert noisy - quiet > 0.03


@pytest.mark.parametrize("check_s", [0.0, 60.0])
def test_a_new_numerics_class_runs_only_where_its_loss_check_fits_in_the_time_left(check_s):
    """A trial whose win could not be checked in the time left would be recommended on trust:
    where its numerics class (fp16, float8) has kept the loss nowhere in this search, the check
    must fit; in a class already checked (bf16), it need not."""
    from strategies.registry import numerics_class

    space = default_space(GPU, 16, fixed={"batch_size": 16, "compile_mode": "off"})
    strategy = AnytimeSearch(space, Context("cuda", default_batch=16),
                             time_available=lambda: 50.0,
                             reference_check_s=lambda c: check_s)
    history = History(space)
    history.add(space.start(), _measured(space.start(), 50e3))
    classes = []
    for _ in range(25):
        proposal = strategy.next(history)
        if proposal is None:
            break
        classes.append(numerics_class(dict(proposal.config.values)))
        history.add(proposal.config, _measured(proposal.config, 400e3))
    assert "bf16" in classes
    if check_s:
        assert set(classes) <= {"fp32", "tf32", "bf16"}
    else:
        assert {"fp16", "fp8"} & set(classes)


def test_torchao_s_step_compile_is_planned_by_the_model_s_parameter_shapes():
    """Seen on an H100: EfficientNet-B0's first trial with bf16 weights was stopped as hung
    after 68 s, still compiling torchao's step for its about 70 parameter shapes (ResNet-50's
    28 took 28-43 s); let run, it took 94 s for 76: the step compiles once per shape."""
    times = TrialTimes("cuda", steps=20, warmup_steps=5, default_batch=64)
    plain = TuneConfig.from_dict({"precision": "bf16", "optimizer": "fused"})
    torchao = plain.replace(weights="bf16", optimizer="plain")
    baseline = TrialResult(config={}, label="fp32", status="ok", compile_s=0.3, step_ms=50.0,
                           measured_steps=10, warmup_s=0.2, parameter_shapes=6)
    times.observe(TuneConfig.from_dict({}), baseline, 12.0)
    few = times.one_time_s(torchao)
    assert few == TORCHAO_FIRST_S["cuda"]  # a Llama's 6: what such models took
    times.observe(TuneConfig.from_dict({}), dataclasses.replace(baseline, parameter_shapes=70), 12.0)
    many = times.one_time_s(torchao)
    assert many > 2 * few
    times.observe(TuneConfig.from_dict({}), dataclasses.replace(baseline, parameter_shapes=76), 12.0)
    assert times.one_time_s(torchao) >= 94.0  # EfficientNet-B0 with bf16 weights
    deadline = Deadline(None, 3600.0, lambda: 0.0)
    expected = times.trial_s(torchao, 0.2)
    assert deadline.hang_s(expected, many) > 2 * 68  # twice as long as where it was stopped


def test_the_first_trial_that_steps_with_torchao_is_planned_with_its_step_compile():
    # (a CPU search started "+ bf16 state" with 10 s left, planned at 8 s; torchao compiled its
    # step for 18 s and the search ended 12 s past its budget, the trial giving nothing)
    times = TrialTimes("cpu", steps=20, warmup_steps=5, default_batch=16)
    plain = TuneConfig.from_dict({"precision": "bf16", "optimizer": "fused"})
    torchao = plain.replace(optimizer_state="bf16")
    assert times.one_time_s(plain) == 0.0
    assert times.trial_s(torchao, 0.1) == pytest.approx(
        times.trial_s(plain, 0.1) + TORCHAO_FIRST_S["cpu"])
    # a hung trial is waited for as long as without it, and the known cost once (not tripled)
    deadline = Deadline(None, 3600.0, lambda: 0.0)
    assert deadline.hang_s(times.trial_s(torchao, 2.0), times.one_time_s(torchao)) == \
        pytest.approx(deadline.hang_s(times.trial_s(plain, 2.0)) + TORCHAO_FIRST_S["cpu"])
    # once a trial has stepped with it, later workers read the step from the Inductor cache
    ran = TrialResult(config=torchao.to_dict(), label="bf16 state", status="ok", compile_s=18.5,
                      step_ms=100.0, measured_steps=10, warmup_s=0.4)
    times.observe(torchao, ran, 24.0)
    assert times.one_time_s(torchao) == 0.0
    assert times.trial_s(torchao, 0.1) == pytest.approx(times.trial_s(plain, 0.1))


def test_a_trial_plans_only_what_is_left_of_a_step_compile_made_beside_the_trials():
    """The optimizer steps' worker compiles the space's torchao pairs in turn, (bf16 weights,
    fp32 state) first; a trial plans what is left of its pair's compile when it starts, and its
    timeout allows for all of it until the worker has reported it."""
    from tuner_tui.engine.search.warming import StepWarming, WARM_START_S, optimizer_step_variants

    space = default_space(GPU, 16)
    variants = optimizer_step_variants(space, budget_binds=False)
    assert variants[0] == ("bf16", "fp32")
    assert set(variants) == {("bf16", "fp32"), ("bf16", "bf16"), ("bf16", "8bit"),
                             ("fp32", "bf16"), ("fp32", "8bit")}  # no offload: it steps on the CPU
    fixed = default_space(GPU, 16, fixed={"weights": "fp32", "optimizer_state": "fp32"})
    assert optimizer_step_variants(fixed, budget_binds=False) == ()

    now = [0.0]
    times = TrialTimes("cuda", steps=20, warmup_steps=5, default_batch=16)
    times.warming, times.now = StepWarming(variants, 0.0), lambda: now[0]
    full = TORCHAO_FIRST_S["cuda"]
    first = TuneConfig.from_dict({"precision": "bf16", "weights": "bf16"})
    second = first.replace(optimizer_state="bf16")
    assert times.one_time_s(first) == full  # at the start: no sooner than a compile of its own
    assert times.one_time_s(second) == full
    now[0] = WARM_START_S + full / 2
    assert times.one_time_s(first) == pytest.approx(full / 2)
    assert times.one_time_s(first, worst=True) == full
    now[0] = WARM_START_S + full + 1
    assert times.one_time_s(first) == 0.0  # expected done, not yet reported
    assert times.one_time_s(first, worst=True) == full
    times.warming.report({("bf16", "fp32"): 20.0}, now[0])
    assert times.one_time_s(first, worst=True) == 0.0
    assert times.one_time_s(second) == pytest.approx(full)  # the next one starts now
    times.warming.report({("bf16", "fp32"): 20.0, ("bf16", "bf16"): None}, now[0] + 5)
    assert times.one_time_s(second) == full  # its compile failed: the trial compiles its own
    assert times.warming.to_dict() == {"bf16 weights + fp32 state": 20.0,
                                       "bf16 weights + bf16 state": None}


def test_the_report_says_what_the_optimizer_steps_worker_compiled_and_what_went_wrong():
    """A worker that never compiled anything is not silent: the line names each pair it
    compiled, failed or never reached, and why (its notes)."""
    from tuner_tui.engine.search.warming import StepWarming

    warming = StepWarming((("bf16", "fp32"), ("bf16", "8bit"), ("fp32", "bf16")), 0.0)
    warming.report({("bf16", "fp32"): 14.6, ("bf16", "8bit"): None}, 90.0,
                   ("11 s: the worker did not start: CUDA error: out of memory",))
    line = warming.summary()
    assert "compiled bf16 weights + fp32 state in 15 s" in line
    assert "failed: bf16 weights + 8bit state" in line
    assert "not reached: fp32 weights + bf16 state" in line
    assert line.endswith("11 s: the worker did not start: CUDA error: out of memory")
    nothing = StepWarming((("bf16", "fp32"),), 0.0)
    nothing.report({}, 300.0, ())
    assert "compiled none; not reached: bf16 weights + fp32 state" in nothing.summary()


def test_a_move_that_only_costs_speed_is_not_tried_from_the_best_configuration():
    """Seen on an H100: with no memory budget binding, ResNet-50's search spent 56 s of its five
    minutes on its best configuration with selective checkpointing (16% slower; in simulation,
    such moves took 7 s a search). Recomputation and offloaded state never make a step faster
    (`SearchFacts.costs_only`): from the best, such a move cannot gain."""
    from tuner_tui.engine.search.anytime import costs_only

    space = default_space(GPU, 16)
    history = History(space)
    history.add(space.start(), _measured(space.start(), 50e3))
    strategy = AnytimeSearch(space, Context("cuda", large=False, default_batch=16))
    tried = []
    for i in range(40):
        proposal = strategy.next(history)
        if proposal is None:
            break
        if proposal.parent is not None and proposal.parent == history.best().tune_config:
            tried.append(costs_only(proposal.parent, proposal.config, proposal.keys))
        history.add(proposal.config, _measured(proposal.config, 200e3 + 100 * i))
        strategy.observe(proposal.config, history.get(proposal.config), 10.0, history)
    assert len(tried) > 10 and not any(tried)


def test_a_capped_improvement_is_the_improvement_of_the_draws_cut_at_the_cap():
    import random

    from tuner_tui.engine.search.proposal import capped_improvement, expected_improvement

    assert capped_improvement(0.1, 0.05, 0.0, math.inf) == pytest.approx(
        expected_improvement(0.1, 0.05, 0.0))
    assert capped_improvement(0.1, 0.05, 0.0, 0.0) == capped_improvement(0.1, 0.05, 0.0, -1) == 0
    rng = random.Random(0)
    draws = [rng.gauss(-0.02, 0.03) for _ in range(200_000)]
    cap, best = 0.01, -0.01
    sampled = sum(max(0.0, min(x, cap) - best) for x in draws) / len(draws)
    assert capped_improvement(-0.02, 0.03, best, cap) == pytest.approx(sampled, rel=0.02)


def test_a_model_of_many_parameter_shapes_is_planned_to_compile_longer_than_its_size_says():
    """EfficientNet-B0 on an H100 (5.3M parameters, 69 shapes): its compiled recipe was planned
    at 35 s from its size, so an eager scout of 105 s (torchao's step compile) ran before it
    with 176 s left, and the compile (76 s the search before) was stopped at the budget's end.
    Planned by its shapes too, the compile takes most of the time left: the scout that would
    leave it none does not run, and the compiled recipe follows the cheap one."""
    space = default_space(GPU, 64, fixed={"compile_scope": "model", "attention": "sdpa",
                                          "fused_kernels": (), "fp8": "off"})
    history = History(space)
    base = dataclasses.replace(_measured(space.start(), 1100.0, peak=1 << 30), step_ms=58.0,
                               compile_s=0.3, measured_steps=10, warmup_s=0.3,
                               parameter_shapes=69)
    history.add(space.start(), base)
    times = TrialTimes("cuda", steps=20, warmup_steps=5, params=int(5.3e6), default_batch=64)
    few = TrialTimes("cuda", steps=20, warmup_steps=5, params=int(5.3e6), default_batch=64)
    strategy = AnytimeSearch(space, Context("cuda", large=False, default_batch=64), times=times,
                             time_available=lambda: 176.0)
    strategy.observe(space.start(), base, 11.0, history)
    proposal, ran = strategy.next(history), []
    while proposal.config.compile_mode == "off":
        ran.append(proposal.config)
        history.add(proposal.config, dataclasses.replace(
            _measured(proposal.config, 1900.0, peak=12 << 30), compile_s=1.0, measured_steps=10,
            warmup_s=0.5, parameter_shapes=69))
        strategy.observe(proposal.config, history.get(proposal.config), 13.0, history)
        proposal = strategy.next(history)
    compiled = proposal.config
    assert proposal.why == "the expert's recipe"
    assert times.first_step_s(compiled, 0.1) > 2 * few.first_step_s(compiled, 0.1) > 40.0
    assert [c.weights for c in ran] == ["fp32", "fp32"]  # the recipe and its batch scout


def test_the_compiled_recipe_takes_the_other_scope_where_only_that_fits_the_time_left():
    """Simulated, a model of 83 parameter shapes: after its scouts 61 s were left, its whole
    compile was planned at 93 s and per block at 41 s. The opening proposed nothing, and no
    compile ran in five minutes (20% off the optimum); per block it is 15% off."""
    space = default_space(GPU, 16)
    history = History(space)
    base = dataclasses.replace(_measured(space.start(), 27e3, peak=1 << 30), compile_s=1.0,
                               measured_steps=10, warmup_s=0.3, parameter_shapes=83)
    history.add(space.start(), base)
    left = [280.0]
    times = TrialTimes("cuda", steps=20, warmup_steps=5, params=int(2.1e8), default_batch=16)
    strategy = AnytimeSearch(space, Context("cuda", large=False, default_batch=16), times=times,
                             time_available=lambda: left[0])
    strategy.observe(space.start(), base, 8.0, history)
    proposal = strategy.next(history)
    while proposal is not None and proposal.config.compile_mode == "off":
        history.add(proposal.config, dataclasses.replace(
            _measured(proposal.config, 330e3, peak=8 << 30), compile_s=1.0, measured_steps=10,
            warmup_s=0.5, parameter_shapes=83))
        strategy.observe(proposal.config, history.get(proposal.config), 10.0, history)
        whole = strategy.predictor.from_start(
            strategy.opening._compiled(history).replace(compile_scope="model"), "", history)
        left[0] = whole.trial_s - 1.0  # the whole compile no longer fits
        proposal = strategy.next(history)
    assert proposal is not None and proposal.why == "the expert's recipe"
    assert proposal.config.compile_scope == "block" and proposal.trial_s <= left[0]
