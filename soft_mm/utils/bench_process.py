"""Fresh-process cases for the benchmark tools, and the glibc allocator setting they run under.

glibc's malloc serves every allocation above its mmap threshold (at most 32 MB by default) with a fresh ``mmap`` and
returns it on free, so each new large tensor is page-faulted in again: measured here, allocating and filling a 69 MB
tensor takes 33 ms, against 4 ms once the memory is reused. At detection resolutions many activations are that big
(a stage-1 MLP hidden of a 1333×800 image is 69 MB), so the default allocator adds time that grows faster than the
pixels, for every backbone alike. ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` (glibc tunables read at
process start) keep freed memory for reuse; the benchmarks run all their cases with them by default
(``--glibc-malloc default`` runs without), and the same two variables speed up CPU training and inference.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

__all__ = ['GLIBC_MALLOC_TUNING', 'add_glibc_malloc_argument', 'glibc_malloc_note', 'run_in_fresh_process']

GLIBC_MALLOC_TUNING = {'MALLOC_MMAP_THRESHOLD_': str(1 << 32), 'MALLOC_TRIM_THRESHOLD_': str(1 << 36)}
_TUNING_TEXT = ', '.join(f'{key}={value}' for key, value in GLIBC_MALLOC_TUNING.items())


def add_glibc_malloc_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--glibc-malloc', choices=('tuned', 'default'), default='tuned',
                        help=f"allocator setting of every case: 'tuned' keeps freed memory for reuse ({_TUNING_TEXT}), "
                             "'default' is glibc's own (default: tuned)")


def glibc_malloc_note(setting: str) -> str:
    """The allocator setting, as the tables' headers state it."""
    return f'glibc malloc tuned ({_TUNING_TEXT})' if setting == 'tuned' else 'glibc malloc default'


def run_in_fresh_process(script: str, spec: dict[str, Any],
                         glibc_malloc: str) -> tuple[dict[str, Any] | None, str]:
    """Run ``script --worker <spec json>`` in a fresh interpreter; returns (its last stdout line as json, or None when
    it failed, and its stderr)."""
    env = os.environ.copy()
    for key in GLIBC_MALLOC_TUNING:
        env.pop(key, None)
    if glibc_malloc == 'tuned':
        env.update(GLIBC_MALLOC_TUNING)
    proc = subprocess.run([sys.executable, script, '--worker', json.dumps(spec)], capture_output=True, text=True,
                          check=False, env=env)
    if proc.returncode != 0:
        return None, proc.stderr or f'rc={proc.returncode}'
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr
