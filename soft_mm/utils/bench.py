"""The one small bench utility of the benchmark tools: size parsing, device-synced timing, peak memory, the GEMM
rate, and (from :mod:`soft_mm.utils.bench_process`) the fresh-process runner and allocator setting."""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .bench_process import GLIBC_MALLOC_TUNING, add_glibc_malloc_argument, glibc_malloc_note, run_in_fresh_process

__all__ = ['GLIBC_MALLOC_TUNING', 'PeakMemory', 'add_glibc_malloc_argument', 'gemm_gflops', 'glibc_malloc_note',
           'parse_size', 'run_in_fresh_process', 'size_arg', 'sync', 'timed']


def parse_size(text: str) -> tuple[int, int]:
    """``'56'`` -> (56, 56); ``'200x334'`` -> (200, 334); anything else (or a side < 1) raises ``ValueError(text)``."""
    parts = text.lower().split('x')
    if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
        raise ValueError(text)
    h, w = int(parts[0]), int(parts[-1])
    if h < 1 or w < 1:
        raise ValueError(text)
    return h, w


def size_arg(text: str) -> tuple[int, int]:
    """:func:`parse_size` as an argparse ``type``: a bad size is a usage error naming the value."""
    try:
        return parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not a size H or HxW of positive integers (e.g. 512x512)') \
            from None


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); a no-op on CPU."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one call of ``fn``, synchronised with the device before and after."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def _rss_kib(field: str) -> int:
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith(field + ':'):
            return int(line.split()[1])
    raise RuntimeError(f'{field} not in /proc/self/status')


class PeakMemory:
    """Peak memory of what runs after :meth:`start`: CUDA allocator peak, or the rise of the peak RSS on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def start(self) -> None:
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return
        with contextlib.suppress(OSError):  # '5' resets the peak RSS to the current RSS (Linux >= 4.0)
            Path('/proc/self/clear_refs').write_text('5')
        self.base = _rss_kib('VmRSS') * 1024

    def peak_mib(self) -> float:
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
            return (torch.cuda.max_memory_allocated(self.device) - self.base) / 2 ** 20
        return (_rss_kib('VmHWM') * 1024 - self.base) / 2 ** 20


def gemm_gflops(device: torch.device, dtype: torch.dtype = torch.float32, size: int = 4096, repeats: int = 5) -> float:
    """The machine's matmul rate: a ``size``² matmul in ``dtype``, median of ``repeats`` (GFLOP/s, 2 per MAC)."""
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    a @ b
    return 2 * size ** 3 / statistics.median(timed(lambda: a @ b, device) for _ in range(repeats)) / 1e9
