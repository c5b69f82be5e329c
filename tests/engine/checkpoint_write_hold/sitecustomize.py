"""Test-only: holds every checkpoint write open, so that a test can SIGKILL a run in the middle of one.

``kill_during_checkpoint_write`` (tests/engine/test_hooks.py) puts this folder first on the ``PYTHONPATH`` of the run
it kills, and Python imports ``sitecustomize`` at start-up. soft_mm's AtomicCheckpointHook writes a checkpoint to a
hidden ``.<name>.<random>.partial`` file in the same folder and renames it into place with ``os.replace``
(``soft_mm.utils.atomic.publish``); here that rename of a ``.pth`` file waits ``HOLD_S`` seconds first, longer than
the test waits, so the run is killed with the checkpoint written to its temporary file and not yet published: no
``epoch_N.pth``, ``last_checkpoint`` still naming the previous one, the old checkpoints not yet deleted.
"""
import os
import time

HOLD_S = 600

_replace = os.replace


def _held_replace(src, dst, *args, **kwargs):
    if str(src).endswith('.partial') and str(dst).endswith('.pth'):
        time.sleep(HOLD_S)
    return _replace(src, dst, *args, **kwargs)


os.replace = _held_replace
