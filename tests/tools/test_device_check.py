"""tools/device_check.py, the prepared GPU check, run with --smoke: tiny sizes on CPU under the Triton interpreter, so
the script that a lent GPU runs once is known to work end to end."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from soft_mm.ops.triton_nystrom import triton_available

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(not triton_available(), reason='triton is not installed (bash tools/install.sh adds it)')
def test_smoke_run_checks_the_backend_and_fills_every_table(tmp_path):
    out = tmp_path / 'device_check.json'
    env = dict(os.environ, TRITON_INTERPRET='1')
    proc = subprocess.run([sys.executable, str(ROOT / 'tools/device_check.py'), '--smoke', '--out', str(out)],
                          capture_output=True, text=True, timeout=900, env=env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report['correctness'] and all(row['ok'] for row in report['correctness'])
    assert all(row['float32_error'] < 3e-5 for row in report['correctness'])
    methods = {(row['dtype'], row['method']) for row in report['op'] if 'fwd_bwd_ms' in row}
    assert methods == {(dtype, method) for dtype in ('bfloat16', 'float32') for method in ('triton', 'reference', 'sdpa')}
    assert {row['model'] for row in report['backbones'] if 'fwd_bwd_ms' in row} == {'soft_norm_small', 'swin_t',
                                                                                     'convnext_t'}
