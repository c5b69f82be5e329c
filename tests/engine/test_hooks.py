"""AtomicCheckpointHook and InvalidLossHook on a few-second mmengine training (tests/engine/toy_training.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.checkpoint_kill import kill_during_checkpoint_write
from helpers.repo import ROOT

from soft_mm.engine.hooks import InvalidLossHook
from soft_mm.utils.checkpoint.reader import read_checkpoint

TOY = ROOT / 'tests' / 'engine' / 'toy_training.py'
def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, **extra)


def _train(work_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(TOY), str(work_dir), *args], env=_env(), capture_output=True,
                          text=True, timeout=300, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc


def test_sigkill_during_checkpoint_write_then_resume(tmp_path):
    work_dir = tmp_path / 'work'
    _train(work_dir, '1')
    assert (work_dir / 'last_checkpoint').read_text() == str(work_dir / 'epoch_1.pth')

    # resume to 3 epochs; killed while epoch_2.pth is being written (max_keep_ckpts=1: mmengine would already have
    # deleted epoch_1.pth and left a truncated epoch_2.pth behind last_checkpoint)
    partial = kill_during_checkpoint_write([sys.executable, str(TOY), str(work_dir), '3', '--resume'], work_dir)
    assert partial.name.startswith('.epoch_2.pth.')
    partial.write_bytes(partial.read_bytes()[:100])  # as if killed in the middle of the write itself
    assert not (work_dir / 'epoch_2.pth').exists()
    assert (work_dir / 'last_checkpoint').read_text() == str(work_dir / 'epoch_1.pth')
    assert read_checkpoint(work_dir / 'epoch_1.pth')['meta']['epoch'] == 1

    proc = _train(work_dir, '3', '--resume')
    output = proc.stdout + proc.stderr
    assert 'resumed epoch: 1, iter: 4' in output
    assert 'the unfinished checkpoint of an earlier run' in output
    assert 'Epoch(train) [1]' not in output and 'Epoch(train) [3][4/4]' in output
    assert sorted(p.name for p in work_dir.glob('*.pth')) == ['epoch_3.pth'] and not list(work_dir.glob('.*'))
    final = read_checkpoint((work_dir / 'last_checkpoint').read_text())
    assert (final['meta']['epoch'], final['meta']['iter']) == (3, 12)
    assert final['message_hub']['runtime_info']['keep_ckpt_ids'] == [3]
    assert set(final['state_dict']) == {'linear.weight', 'linear.bias'}


def test_checkpoints_and_last_checkpoint_are_complete_files(tmp_path):
    work_dir = tmp_path / 'work'
    _train(work_dir, '2', '--interval', '1')
    assert sorted(p.name for p in work_dir.glob('*.pth')) == ['epoch_2.pth']  # max_keep_ckpts=1
    assert not list(work_dir.glob('.*'))  # no temporary files left
    checkpoint = read_checkpoint(work_dir / 'epoch_2.pth')
    assert checkpoint['message_hub']['runtime_info']['last_ckpt'] == str(work_dir / 'epoch_2.pth')
    assert oct((work_dir / 'epoch_2.pth').stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_nan_input_stops_training_with_iteration_and_last_checkpoint(tmp_path):
    work_dir = tmp_path / 'work'
    proc = _train(work_dir, '3', '--nan-at', '6', check=False)  # epoch 2, after epoch_1.pth
    assert proc.returncode == 1
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith('soft_mm.engine.hooks.InvalidLossError: training stopped at iteration 6 (epoch 2) '
                              'because the loss is not finite (loss=nan); the last good checkpoint is '
                              f'{work_dir / "epoch_1.pth"}: resume from it with --resume')
    assert not (work_dir / 'epoch_2.pth').exists()
    assert torch.isfinite(read_checkpoint(work_dir / 'epoch_1.pth')['state_dict']['linear.weight']).all()


def test_nan_before_any_checkpoint_says_restart(tmp_path):
    proc = _train(tmp_path / 'work', '1', '--nan-at', '2', check=False)
    assert 'training stopped at iteration 2 (epoch 1) because the loss is not finite (loss=nan); no checkpoint ' \
           'was saved before it: restart' in proc.stderr


def test_invalid_loss_hook_checks_loss_terms_only():
    class Runner:
        iter, epoch, work_dir = 9, 0, '/nonexistent'

        class message_hub:
            @staticmethod
            def get_info(key):
                return None

    hook = InvalidLossHook()
    hook.after_train_iter(Runner, 0, outputs={'loss': torch.tensor(1.0), 'acc': torch.tensor(float('nan'))})
    with pytest.raises(RuntimeError, match=r'iteration 10 \(epoch 1\) .*\(loss_bbox=inf\)'):
        hook.after_train_iter(Runner, 0, outputs={'loss': torch.tensor(1.0), 'loss_bbox': torch.tensor(float('inf'))})
    with pytest.raises(ValueError, match='interval must be an int >= 1'):
        InvalidLossHook(interval=0)
