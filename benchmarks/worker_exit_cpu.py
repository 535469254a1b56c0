"""How long a worker takes to exit after a trial (`WorkerClient.stop`), eager and after a
compile: the time `runner.EndingWorker` moves out of each trial. CPU, gpt2-tiny.

    python benchmarks/worker_exit_cpu.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from strategies.config import TuneConfig
from tuner_tui.engine import protocol
from tuner_tui.engine.protocol import WorkerSpec
from tuner_tui.engine.runner import start_worker


def exit_s(config: dict) -> float:
    """Seconds `stop` took after one short trial of `config` in a fresh worker."""
    client, _ = start_worker(WorkerSpec(workload="gpt2-tiny", device="cpu"))
    client.send(protocol.RunTrial(TuneConfig.from_dict(config), steps=3, warmup_steps=2,
                                  max_steps=3))
    while not isinstance(client.wait_event(300), (protocol.TrialFinished, protocol.RunFailed)):
        pass
    started = time.monotonic()
    client.stop()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    rounds = parser.parse_args().rounds
    for name, config in (("eager", {}), ("compile(default)", {"compile_mode": "default"})):
        seconds = [exit_s(config) for _ in range(rounds)]
        print(f"{name}: exit {statistics.median(seconds):.2f} s "
              f"(runs: {', '.join(f'{s:.2f}' for s in seconds)})")


if __name__ == "__main__":
    main()
