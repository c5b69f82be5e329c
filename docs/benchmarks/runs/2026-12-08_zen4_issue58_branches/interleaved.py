"""The timing loop of this run's one-off scripts: each call warmed up, then timed in rounds interleaved across the
calls, with a garbage collection before each and a mean of 5 calls per round."""
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

# host_time (the meter's setup), for the scripts beside this file: they import it from here
sys.path.insert(0, str(Path(__file__).resolve().parents[4] / 'benchmarks'))
import host_time as ht

__all__ = ['ht', 'interleaved_times', 'median']


def interleaved_times(runs: dict[str, Callable[[], None]], rounds: int, calls: int = 5) -> dict[str, list[float]]:
    """Seconds a call of each of ``runs``, one mean of ``calls`` calls per round, ``rounds`` rounds interleaved."""
    for run in runs.values():
        for _ in range(calls):
            run()
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            gc.collect()
            start = time.perf_counter()
            for _ in range(calls):
                run()
            times[name].append((time.perf_counter() - start) / calls)
    return times


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]
