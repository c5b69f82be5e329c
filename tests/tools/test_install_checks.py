"""tools/install.sh's checks before a CUDA build of mmcv, run for real with pip made a no-op: an nvcc whose CUDA
major version differs from torch's stops the install with one sentence naming both and the way out; a toolkit without
the math libraries' headers (cusparse.h, which torch's CUDA headers include) gets them from torch's nvidia wheels;
without a GPU to ask, the build targets Ampere and Hopper (TORCH_CUDA_ARCH_LIST="8.0;9.0") instead of every
architecture."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.repo import ROOT


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_installer(tmp_path: Path, nvcc_release: str, until: str | None = None, **env) -> tuple[int | None, str, str]:
    """``(exit status, stdout, stderr)`` of the installer with FORCE_CUDA=1, an nvcc that reports ``nvcc_release``,
    ``pip`` a no-op (everything it would install is installed) and a cache holding an mmcv wheel for CUDA ops, so
    nothing is built or downloaded; stopped (status None) once a line of its output contains ``until``."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    executable(bin_dir / 'python', '#!/bin/sh\n[ "$1" = -m ] && [ "$2" = pip ] && exit 0\n'
                                   f'exec {sys.executable} "$@"\n')
    executable(bin_dir / 'nvcc', '#!/bin/sh\n'
                                 f'echo "Cuda compilation tools, release {nvcc_release}, V{nvcc_release}.1"\n')
    py_tag = f'cp{sys.version_info.major}{sys.version_info.minor}'
    wheels = tmp_path / 'cache' / 'wheels' / f'mmcv-2.1.0-{py_tag}-torch{torch.__version__.replace("+", "_")}-cuda'
    wheels.mkdir(parents=True)
    (wheels / 'mmcv-2.1.0-cp311-cp311-linux_x86_64.whl').write_bytes(b'')
    environment = {key: value for key, value in os.environ.items() if key != 'TORCH_CUDA_ARCH_LIST'}
    environment.update(PATH=f'{bin_dir}:{os.environ["PATH"]}', PYTHON=str(bin_dir / 'python'), FORCE_CUDA='1',
                       SOFT_MM_CACHE=str(tmp_path / 'cache'), SOFT_MM_WITH_MIM='0', SOFT_MM_WITH_MMDEPLOY='0', **env)
    proc = subprocess.Popen(['bash', str(ROOT / 'tools' / 'install.sh')], env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if until is not None and until in line:
            os.killpg(proc.pid, 9)
            proc.wait()
            return None, ''.join(lines), proc.stderr.read()
    proc.wait(timeout=600)
    return proc.returncode, ''.join(lines), proc.stderr.read()


def test_an_nvcc_of_another_cuda_major_version_stops_the_install_with_one_sentence(tmp_path):
    torch_major = (torch.version.cuda or '0').split('.')[0]
    other = '11.8' if torch_major == '12' else '12.4'  # an nvcc of another major version than torch's CUDA
    status, out, err = run_installer(tmp_path, other)
    assert status == 1
    if torch.version.cuda is None:
        expected = ('soft_mm install failed: CUDA ops were requested but the installed torch is a CPU build; install '
                    'a CUDA build of torch 2.14.1 or unset FORCE_CUDA.')
    else:
        expected = (f'soft_mm install failed: torch was built with CUDA {torch.version.cuda} but nvcc is CUDA {other}; '
                    f"put an nvcc of CUDA {torch_major} first on PATH (e.g. pip install "
                    f"'nvidia-cuda-nvcc=={torch_major}.*') or unset FORCE_CUDA.")
    assert err.strip().splitlines()[-1] == expected, err[-2000:]
    assert 'cached wheel' not in out and 'building from source' not in out  # stopped before mmcv's build


@pytest.mark.skipif(torch.version.cuda is None, reason='needs a CUDA build of torch (the installer refuses a CPU one)')
def test_without_a_gpu_the_cuda_ops_target_ampere_and_hopper(tmp_path):
    if torch.cuda.is_available():
        pytest.skip('a GPU is visible: the architectures come from it')
    # a toolkit of nvcc and the runtime only, as on this machine: the math headers come from torch's nvidia wheels
    toolkit = tmp_path / 'toolkit'
    (toolkit / 'include').mkdir(parents=True)
    status, out, err = run_installer(tmp_path, torch.version.cuda, until='reusing the cached wheel',
                                     CUDA_HOME=str(toolkit))
    assert "CUDA math headers from torch's nvidia wheels: CPATH=" in out and '/nvidia/' in out, (out[-2000:], err)
    assert 'no GPU visible: building the CUDA ops for TORCH_CUDA_ARCH_LIST=8.0;9.0' in out, (out[-2000:], err)
    assert status is None and f'-torch{torch.__version__.replace("+", "_")}-cuda/mmcv-2.1.0' in out
    (tmp_path / 'chosen').mkdir()
    (toolkit / 'include' / 'cusparse.h').write_text('')
    status, out, err = run_installer(tmp_path / 'chosen', torch.version.cuda, until='reusing the cached wheel',
                                     TORCH_CUDA_ARCH_LIST='9.0', CUDA_HOME=str(toolkit))
    assert status is None and 'no GPU visible' not in out, (out[-2000:], err)  # a list the user set is kept
    assert 'CPATH' not in out  # the toolkit has the headers


def fake_torch(folder: Path, torch_version: str, torchvision_version: str) -> Path:
    """A folder that, first on PYTHONPATH, makes ``import torch`` / ``torchvision`` and their distributions' metadata
    report the given versions (nothing else of them is needed before the installer's checks stop or pin)."""
    for name, version in (('torch', torch_version), ('torchvision', torchvision_version)):
        (folder / name).mkdir(parents=True)
        (folder / name / '__init__.py').write_text(f'__version__ = {version!r}\n')
        (folder / f'{name}-{version}.dist-info').mkdir()
        (folder / f'{name}-{version}.dist-info' / 'METADATA').write_text(f'Name: {name}\nVersion: {version}\n')
    return folder


@pytest.mark.parametrize('torch_version', ['2.0.1', '2.15.0'])
def test_an_installed_torch_outside_the_supported_range_stops_the_install(tmp_path, torch_version):
    fake = fake_torch(tmp_path / 'fake', torch_version, '0.15.2')
    status, out, err = run_installer(tmp_path, '13.0', PYTHONPATH=str(fake))
    assert status == 1, out + err
    assert (f'soft_mm install failed: the installed torch {torch_version} is outside the range soft_mm supports '
            f'(torch>=2.1,<2.15); install a torch in that range') in err, err


def test_the_floor_torch_is_kept_with_its_numpy_for_the_rest_of_the_install(tmp_path):
    # torch 2.1.2 (what mmcv 2.1.0's prebuilt wheels were made for) was built for numpy 1.x: nothing may upgrade it
    fake = fake_torch(tmp_path / 'fake', '2.1.2', '0.16.2')
    status, out, err = run_installer(tmp_path, '13.0', until='pinned for the rest of the install', PYTHONPATH=str(fake))
    assert status is None, out + err
    assert 'keeping the installed torch 2.1.2 / torchvision 0.16.2' in out
    assert 'pinned for the rest of the install: torch==2.1.2 torchvision==0.16.2 numpy<2' in out, out
