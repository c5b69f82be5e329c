"""soft_mm/utils/atomic.py: a write that fails or is killed leaves the old file and no temporary file."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

from soft_mm.utils.atomic import atomic_save, atomic_write, atomic_write_text


def test_atomic_save_replaces_only_when_complete(tmp_path):
    path = tmp_path / 'sub' / 'weights.pth'
    atomic_save({'w': torch.ones(3)}, path)
    assert torch.load(path, weights_only=True)['w'].tolist() == [1.0, 1.0, 1.0]

    def half_then_fail(f):
        f.write(b'PK\x03\x04 partial bytes')
        raise OSError('disk full')

    with pytest.raises(OSError, match='disk full'):
        atomic_write(path, half_then_fail)
    assert torch.load(path, weights_only=True)['w'].tolist() == [1.0, 1.0, 1.0]
    assert os.listdir(path.parent) == ['weights.pth']
    atomic_write_text(tmp_path / 'last_checkpoint', 'a/epoch_2.pth')
    assert (tmp_path / 'last_checkpoint').read_text() == 'a/epoch_2.pth'


def test_sigkill_during_atomic_save_keeps_the_old_file(tmp_path):
    path = tmp_path / 'weights.pth'
    atomic_save({'w': torch.zeros(2)}, path)
    script = ('import sys, time, torch\n'
              'from soft_mm.utils.atomic import atomic_write\n'
              'def slow(f):\n'
              '    f.write(b"PK" * 1000); f.flush(); print("writing", flush=True); time.sleep(600)\n'
              'atomic_write(sys.argv[1], slow)\n')
    proc = subprocess.Popen([sys.executable, '-c', script, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == 'writing'
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert torch.load(path, weights_only=True)['w'].tolist() == [0.0, 0.0]
    partial = [p for p in os.listdir(tmp_path) if p != 'weights.pth']
    assert len(partial) == 1 and partial[0].startswith('.weights.pth.') and partial[0].endswith('.partial')
