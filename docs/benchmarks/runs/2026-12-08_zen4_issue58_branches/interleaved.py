"""The setup of this run's one-off scripts: ``benchmarks/`` on the path, and from it host_time (the meter's setup) and
harness's ``interleaved_medians`` (the timing loop: the cases interleaved round by round, each round's median of
``repeats`` calls after a warm-up call)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / 'benchmarks'))
import host_time as ht
from harness import interleaved_medians

__all__ = ['ht', 'interleaved_medians']
