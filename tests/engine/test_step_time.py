"""Step times on the CPU: each record is its own step's time."""

import time

from strategies.config import TuneConfig
from tuner_tui.engine import workloads
from tuner_tui.engine.trial import Trainer


def test_cpu_step_times_are_each_steps_own_time():
    # After the warm-up the host runs HOST_AHEAD steps ahead, so records arrive later than
    # their step ends: the time must be the step's own, not the time until it was collected.
    trainer = Trainer(workloads.load("gpt2-tiny", None, 0, None, "cpu"), TuneConfig(), "cpu",
                      warmup_steps=1)
    trainer.build()
    trainer.step()
    start = time.perf_counter()
    for _ in range(8):
        trainer.step()
    trainer.finish()
    wall_ms = (time.perf_counter() - start) * 1e3
    assert sum(r.step_ms for r in trainer.records[1:]) <= wall_ms
    trainer.close()


def test_the_optimizer_step_is_timed_apart_within_each_step():
    # More micro-batches per step share the optimizer step: the search predicts them from it.
    trainer = Trainer(workloads.load("gpt2-tiny", None, 0, None, "cpu"),
                      TuneConfig().replace(batch_size=4, micro_batch_size=2), "cpu",
                      warmup_steps=1)
    trainer.build()
    for _ in range(6):
        trainer.step()
    trainer.finish()
    measured = trainer.measured_records()
    assert measured and all(0 < r.optimizer_ms < r.step_ms for r in measured)
    result = trainer.result()
    assert 0 < result.optimizer_ms < result.step_ms
    trainer.close()
