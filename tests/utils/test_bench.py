"""soft_mm.utils.bench: the benchmark tools' shared size parsing, timing, peak memory and GEMM rate."""
import argparse
import subprocess
import sys

import pytest
import torch

from soft_mm.utils import bench
from soft_mm.utils.bench import gemm_gflops, parse_size, size_arg, timed


@pytest.mark.parametrize('text, expected', [('56', (56, 56)), ('200x334', (200, 334)), ('800X1344', (800, 1344))])
def test_parse_size(text, expected):
    assert parse_size(text) == size_arg(text) == expected


@pytest.mark.parametrize('text', ['0x5', '12y5', '3x4x5', '-3', '', 'x'])
def test_bad_sizes(text):
    with pytest.raises(ValueError, match='^' + text + '$'):
        parse_size(text)
    with pytest.raises(argparse.ArgumentTypeError, match='is not a size H or HxW of positive integers'):
        size_arg(text)


# in a fresh process, as the benchmark tools measure: in the test process the 64 MiB may be served from memory that
# earlier tests freed but the allocator kept resident, which raises no peak
PEAK_SCRIPT = """
import torch
from soft_mm.utils.bench import PeakMemory
memory = PeakMemory(torch.device('cpu'))
memory.start()
block = torch.ones(64 * 2 ** 20 // 4)  # 64 MiB, touched
print(memory.peak_mib(), float(block.sum()))
"""


def test_peak_memory_of_a_64_mib_block():
    done = subprocess.run([sys.executable, '-c', PEAK_SCRIPT], capture_output=True, text=True, timeout=300,
                          check=True)
    peak_mib, total = map(float, done.stdout.split())
    assert 60 <= peak_mib < 200 and total == 64 * 2 ** 20 // 4


def test_timing_and_gemm_rate_under_a_fake_clock(monkeypatch):
    """``timed`` is the clock's difference around the call; the GEMM rate is 2 n^3 / (median time) in GFLOP/s."""
    ticks = iter([10.0, 10.5, 20.0, 20.25, 30.0, 30.125, 40.0, 40.5])  # start / end of each timed call
    monkeypatch.setattr(bench.time, 'perf_counter', lambda: next(ticks))
    device = torch.device('cpu')
    calls = []
    assert timed(lambda: calls.append(1), device) == 0.5 and calls == [1]
    # three repeats of 0.25, 0.125 and 0.5 s: median 0.25 s for 2 * 64^3 FLOPs
    assert gemm_gflops(device, torch.float32, size=64, repeats=3) == 2 * 64 ** 3 / 0.25 / 1e9
    with pytest.raises(StopIteration):  # every tick used: one timed call per repeat, none besides
        next(ticks)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_gemm_rate_is_a_real_measurement(dtype):
    rate = gemm_gflops(torch.device('cpu'), dtype, size=256, repeats=2)
    assert 0.1 < rate < 1e5  # GFLOP/s of a real CPU: not 0, not a timer of nothing
