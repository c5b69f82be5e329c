"""openmim runs mmdet's and mmseg's own train/test scripts on soft_mm's demo configs (soft_mm via custom_imports)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the mim of this interpreter's environment first (where tools/install.sh puts it), else any on PATH
MIM = shutil.which('mim', path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get('PATH', '')]))
ON_CI = os.environ.get('CI', '').lower() in ('1', 'true')


@pytest.fixture(autouse=True)
def _mim_installed() -> None:
    """tools/install.sh installs openmim unless SOFT_MM_WITH_MIM=0: on CI (CI=true) a missing mim fails the tests
    instead of skipping them unnoticed."""
    if MIM is None:
        message = 'openmim is not installed: bash tools/install.sh installs it (unless SOFT_MM_WITH_MIM=0)'
        if ON_CI:
            pytest.fail(f'{message}; CI=true, so the mim tests must run')
        pytest.skip(message)


SMALL_DATA = [f'{loader}.{key}' for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader')
              for key in ('dataset.generator.num_train=16', 'dataset.generator.num_val=4', 'num_workers=0',
                          'persistent_workers=False')]


def _mim(args: list[str], cwd: Path) -> str:
    done = subprocess.run([MIM, *args], cwd=cwd, capture_output=True, text=True, timeout=900, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    return output


@pytest.mark.slow  # three short runs of mmdet's own scripts: about 2-3 minutes on 2 busy cores
def test_mim_train_resume_and_test_mmdet(tmp_path: Path) -> None:
    config = str(ROOT / 'configs/retinanet_soft_tiny_demo.py')
    _mim(['train', 'mmdet', config, '--work-dir', 'work', '--cfg-options', 'train_cfg.max_epochs=1', *SMALL_DATA],
         tmp_path)
    assert (tmp_path / 'work/epoch_1.pth').is_file()
    resumed = _mim(['train', 'mmdet', config, '--work-dir', 'work', '--resume', '--cfg-options',
                    'train_cfg.max_epochs=2', *SMALL_DATA], tmp_path)
    assert 'resumed from the latest checkpoint' in resumed and (tmp_path / 'work/epoch_2.pth').is_file()
    tested = _mim(['test', 'mmdet', config, '--checkpoint', 'work/epoch_2.pth', '--cfg-options', *SMALL_DATA],
                  tmp_path)
    assert 'Epoch(test)' in tested


@pytest.mark.slow
def test_mim_train_mmseg(tmp_path: Path) -> None:
    config = str(ROOT / 'configs/upernet_soft_tiny_demo.py')
    _mim(['train', 'mmseg', config, '--work-dir', 'work', '--cfg-options', 'train_cfg.max_iters=4',
          'train_cfg.val_interval=4', 'default_hooks.checkpoint.interval=4', *SMALL_DATA], tmp_path)
    assert (tmp_path / 'work/iter_4.pth').is_file()


def _installed_checkout() -> Path | None:
    """The folder an editable install of soft_mm points at, or None."""
    from importlib.metadata import distributions

    for dist in distributions(name='soft_mm'):  # the installed dist-info (a checkout's soft_mm.egg-info has no URL)
        url = json.loads(dist.read_text('direct_url.json') or '{}')
        if url.get('dir_info', {}).get('editable') and url.get('url', '').startswith('file://'):
            return Path(url['url'][len('file://'):]).resolve()
    return None


@pytest.mark.slow  # pip builds the editable wheel: about 30 s; every requirement is already installed
def test_mim_install_editable(tmp_path: Path) -> None:
    if _installed_checkout() != ROOT.resolve():
        pytest.skip('soft_mm is not installed editable from this checkout; reinstalling it elsewhere would move it')
    output = _mim(['install', '-e', str(ROOT)], tmp_path)
    assert 'Successfully installed soft_mm' in output
    assert _installed_checkout() == ROOT.resolve()
