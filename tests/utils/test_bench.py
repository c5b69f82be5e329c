"""soft_mm.utils.bench: the benchmark tools' shared size parsing, timing, peak memory and GEMM rate."""
import argparse
import subprocess
import sys

import pytest
import torch

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


def test_timing_memory_and_gemm_rate():
    device = torch.device('cpu')
    assert timed(lambda: sum(range(1000)), device) > 0
    done = subprocess.run([sys.executable, '-c', PEAK_SCRIPT], capture_output=True, text=True, timeout=300,
                          check=True)
    peak_mib, total = map(float, done.stdout.split())
    assert 60 <= peak_mib < 200 and total == 64 * 2 ** 20 // 4
    assert gemm_gflops(device, torch.float32, size=256, repeats=2) > 0
    assert gemm_gflops(device, torch.bfloat16, size=256, repeats=2) > 0
