"""The joint model of every measurement at a candidate's batch (`joint.py`)."""

import math
from dataclasses import replace

from strategies.config import TuneConfig
from tuner_tui.engine.search.joint import features, predict
from tuner_tui.engine.search.priors import Context, Priors

from search_cases import row_of

CTX = Context("cuda", large=True, default_batch=16)
EAGER = TuneConfig.from_dict({"precision": "bf16", "weights": "bf16", "attention": "sdpa",
                              "fused_kernels": ["rms_norm", "linear_cross_entropy"]})
EAGER_FP8 = EAGER.replace(fp8="tensorwise")
COMPILED_FP8 = EAGER_FP8.replace(compile_mode="reduce-overhead", compile_scope="block")
COMPILED = EAGER.replace(compile_mode="default")


def truth(config: TuneConfig, compile_off_by: float) -> float:
    """A machine where every value does what its prior expects but compiling, which gives
    `compile_off_by` (log) less than expected, whatever mode."""
    total = math.log(50e3)
    for feature, (mean, _) in features(config, CTX).items():
        total += mean + (compile_off_by if feature[0] == "compile_mode" else 0.0)
    return total


def measured(config: TuneConfig, log_speed: float, **fields):
    row = row_of(math.exp(log_speed), **config.to_dict())
    return replace(row, **fields) if fields else row


def test_compiling_alone_is_learned_from_runs_that_differ_in_more_than_compile():
    """The eager recipe, its float8 variant and the compiled recipe (float8, CUDA graphs, per
    block) differ from each other in up to three options: no pair of them measures one move,
    yet together they tell what compiling does. Where it gives 25% less than its prior, the
    whole-model compile of the eager recipe is predicted near the truth; from the eager run and
    the priors alone it is not."""
    off = -0.25
    runs = [measured(c, truth(c, off)) for c in (EAGER, EAGER_FP8, COMPILED_FP8)]
    joint = predict(COMPILED, runs, CTX)
    priors = Priors(CTX, canonical=lambda c: c)
    alone = math.log(runs[0].tokens_per_s) + priors.move("compile_mode", EAGER, COMPILED).mean
    real = truth(COMPILED, off)
    assert abs(joint.mean - real) < 0.5 * abs(alone - real)
    assert joint.sd < priors.move("compile_mode", EAGER, COMPILED).sd


def test_with_one_run_the_prediction_is_that_run_moved_by_the_priors():
    run = measured(EAGER, math.log(40e3))
    joint = predict(EAGER_FP8, [run], CTX)
    priors = Priors(CTX, canonical=lambda c: c)
    move = priors.move("fp8", EAGER, EAGER_FP8)
    assert abs(joint.mean - (math.log(40e3) + move.mean)) < 0.01
    assert abs(joint.sd - move.sd) < 0.02


def test_runs_at_another_batch_leave_it_to_the_step_time_physics():
    """The batch's doublings and accumulation are predicted from step times elsewhere."""
    run = measured(EAGER.replace(batch_size=64), math.log(40e3))
    assert predict(EAGER_FP8, [run], CTX) is None
    assert predict(EAGER_FP8.replace(batch_size=64), [run], CTX) is not None


def test_a_disturbed_run_moves_the_prediction_less_than_a_quiet_one():
    """A run measured at +-11% says as little as its spread allows."""
    base = measured(EAGER, math.log(40e3))

    def predicted(spread):
        slow = measured(EAGER_FP8, math.log(40e3) - 0.4, step_ms=100.0,
                        step_ms_q1=100.0 * (1 - spread), step_ms_q3=100.0 * (1 + spread))
        return predict(EAGER_FP8.replace(optimizer_state="bf16"), [base, slow], CTX).mean

    prior = predict(EAGER_FP8.replace(optimizer_state="bf16"), [base], CTX).mean
    quiet, noisy = predicted(0.01), predicted(0.114)
    assert quiet < noisy < prior


def test_a_failed_loss_or_a_run_without_speed_teaches_nothing():
    lost = replace(measured(EAGER_FP8, math.log(10e3)), loss_ok=False)
    crashed = row_of(None, status="crash", **COMPILED_FP8.to_dict())
    assert predict(COMPILED, [lost, crashed], CTX) is None


def test_the_search_takes_the_joint_prediction_where_it_is_surer():
    """After the three runs above, compiling the eager recipe is predicted by the joint model
    (surer than the move's prior from the eager run), and its mean is the joint model's."""
    from tuner_tui.engine.search import History, default_space
    from tuner_tui.engine.search.moves import options_moved
    from tuner_tui.engine.search.prediction import Predictor
    from tuner_tui.engine.search.timing import TrialTimes

    from search_cases import GPU

    space = default_space(GPU, 16)
    history = History(space, None)
    runs = [measured(c, truth(c, -0.25)) for c in (EAGER, EAGER_FP8, COMPILED_FP8)]
    for run in runs:
        history.add(run.tune_config, run)
    predictor = Predictor(space, Priors(CTX, space.canonical),
                          TrialTimes("cuda", 20, 5, default_batch=16), lambda c: True)
    parent = predictor.measured(runs[0])
    keys = options_moved(EAGER, COMPILED)
    guess, _, _ = predictor.estimate(parent, COMPILED, keys, history)
    assert guess == predict(COMPILED, runs, CTX)
    assert guess.sd < predictor.predict(parent, COMPILED, keys).sd


def test_the_joint_prediction_counts_unless_the_store_taught_a_surer_move():
    """Where the joint model can predict, it counts, even where the move-by-move prediction
    claims more certainty from this search's pairs (the joint model holds the same runs); the
    moves' prediction stays where it is surer and the store (earlier searches, whose runs the
    joint model lacks) taught its move."""
    from tuner_tui.engine.search import History, default_space
    from tuner_tui.engine.search.moves import options_moved
    from tuner_tui.engine.search.prediction import Predictor
    from tuner_tui.engine.search.priors import Pair
    from tuner_tui.engine.search.timing import TrialTimes

    from search_cases import GPU

    space = default_space(GPU, 16)
    history = History(space, None)
    run = measured(EAGER, math.log(40e3))
    history.add(run.tune_config, run)
    keys = options_moved(EAGER, COMPILED)
    pairs = [Pair(key, EAGER, COMPILED, 0.3, 0.0) for key in keys for _ in range(10)]
    joint = predict(COMPILED, [run], CTX)
    times = TrialTimes("cuda", 20, 5, default_batch=16)

    learned_here = Priors(CTX, space.canonical)
    for pair in pairs:
        learned_here.pairs[pair.key].append(pair)
    here = Predictor(space, learned_here, times, lambda c: True)
    parent = here.measured(run)
    assert here.predict(parent, COMPILED, keys).sd < joint.sd  # (the moves claim more)
    assert here.estimate(parent, COMPILED, keys, history)[0] == joint

    stored = Predictor(space, Priors(CTX, space.canonical, store_pairs=pairs), times,
                       lambda c: True)
    moves = stored.predict(parent, COMPILED, keys)
    assert moves.sd < joint.sd
    assert stored.estimate(parent, COMPILED, keys, history)[0] == moves


def test_a_joint_model_that_cannot_be_fitted_leaves_the_moves_prediction(monkeypatch):
    """Whatever goes wrong in it, the search goes on with the move-by-move prediction."""
    from tuner_tui.engine.search import History, default_space, joint
    from tuner_tui.engine.search.moves import options_moved
    from tuner_tui.engine.search.prediction import Predictor
    from tuner_tui.engine.search.timing import TrialTimes

    from search_cases import GPU

    def broken(*args, **kwargs):
        raise ValueError("singular")

    space = default_space(GPU, 16)
    history = History(space, None)
    run = measured(EAGER, math.log(40e3))
    history.add(run.tune_config, run)
    predictor = Predictor(space, Priors(CTX, space.canonical),
                          TrialTimes("cuda", 20, 5, default_batch=16), lambda c: True)
    monkeypatch.setattr(joint, "features", broken)
    parent = predictor.measured(run)
    keys = options_moved(EAGER, COMPILED)
    guess, _, _ = predictor.estimate(parent, COMPILED, keys, history)
    assert guess == predictor.predict(parent, COMPILED, keys)
