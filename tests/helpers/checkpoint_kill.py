"""Kill a run while it writes a checkpoint (the crash-safety tests of tests/engine and tests/tools)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from helpers.repo import ROOT

# a sitecustomize that holds every checkpoint write open (just before the rename that publishes it)
CHECKPOINT_WRITE_HOLD = ROOT / 'tests' / 'engine' / 'checkpoint_write_hold'


def kill_during_checkpoint_write(command: list[str], work_dir: Path, cwd: Path | None = None,
                                 timeout: float = 600) -> Path:
    """Start ``command`` with its checkpoint writes held open (``CHECKPOINT_WRITE_HOLD``), SIGKILL it once a
    temporary checkpoint file exists.

    Returns the temporary file that was being written.
    """
    python_path = os.pathsep.join(filter(None, [str(CHECKPOINT_WRITE_HOLD), os.environ.get('PYTHONPATH')]))
    proc = subprocess.Popen(command, env=dict(os.environ, PYTHONPATH=python_path), cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            partial = sorted(work_dir.glob('.*.partial'))
            if partial and partial[0].stat().st_size > 0:  # written, not yet renamed
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
                assert proc.returncode == -signal.SIGKILL
                return partial[0]
            if proc.poll() is not None:
                raise AssertionError(f'the run ended ({proc.returncode}) before writing a checkpoint:\n'
                                     f'{proc.stderr.read()[-3000:]}')
            time.sleep(0.2)
        raise AssertionError('no checkpoint write within the timeout')
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
