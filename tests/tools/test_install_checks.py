"""tools/install.sh's checks before a CUDA build of mmcv, run for real with pip made a no-op: an nvcc whose CUDA
major version differs from torch's stops the install with one sentence naming both and the way out; a toolkit without
the math libraries' headers (cusparse.h, which torch's CUDA headers include) gets them from torch's nvidia wheels;
without a GPU to ask, the build targets Ampere and Hopper (TORCH_CUDA_ARCH_LIST="8.0;9.0") instead of every
architecture; the cached CUDA wheel is keyed by the architectures it was built for and reused only where they cover the
visible GPU (a fake torch reports one). A ROCm torch (a fake with torch.version.hip set) gets mmcv's ops built for ROCm
where torch finds the ROCm toolkit, else its CPU ops, said so, and no word of nvcc or FORCE_CUDA (the build, faked,
records what it was given). Whether an environment holds the cached wheel is read off that environment (a venv,
real pip installs of small fake mmcv wheels)."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from helpers.repo import ROOT


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


# what `pip download mmcv==2.1.0 -d DIR` writes in the tests: a source tree whose setup.py, run as the installer runs
# it (setup.py bdist_wheel -d DIST), records the environment it was given and leaves an empty wheel
FAKE_SOURCE = '''import io, sys, tarfile
folder = sys.argv[sys.argv.index('-d') + 1]
setup = b"""import json, os, sys
keys = ('MMCV_WITH_OPS', 'FORCE_CUDA', 'HIP_VISIBLE_DEVICES', 'CUDA_VISIBLE_DEVICES', 'PYTORCH_ROCM_ARCH')
with open(os.environ['SOFT_MM_TEST_BUILD_ENV'], 'w') as record:
    json.dump({key: os.environ.get(key) for key in keys}, record)
dist = sys.argv[sys.argv.index('-d') + 1]
os.makedirs(dist, exist_ok=True)
open(os.path.join(dist, 'mmcv-2.1.0-py3-none-any.whl'), 'wb').close()
"""
with tarfile.open(f'{folder}/mmcv-2.1.0.tar.gz', 'w:gz') as archive:
    info = tarfile.TarInfo('mmcv-2.1.0/setup.py')
    info.size = len(setup)
    archive.addfile(info, io.BytesIO(setup))
'''


def run_installer(tmp_path: Path, nvcc_release: str | None, until: str | None = None,
                  cached: str | None = 'cuda-sm80-sm90', force_cuda: bool = True,
                  interpreter: str = sys.executable, real_pip: bool = False, **env) -> tuple[int | None, str, str]:
    """``(exit status, stdout, stderr)`` of the installer with FORCE_CUDA=1 (``force_cuda``), an nvcc that reports
    ``nvcc_release`` (None: no nvcc), ``pip`` a no-op (everything it would install is installed; ``real_pip``: but
    the cached mmcv wheel, installed for real) and a cache holding an mmcv wheel of the ops ``cached`` (by default
    CUDA ops for sm_80 and sm_90, what a build without a GPU makes; None: no wheel), so nothing is built or downloaded
    where it is taken (an mmcv source that is not taken is :data:`FAKE_SOURCE`); stopped (status None) once a line of
    its output contains ``until``. ``interpreter`` is the Python that the installer's ``PYTHON`` runs."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'fake_mmcv_source.py').write_text(FAKE_SOURCE)
    install_wheel = f'case "$*" in *--force-reinstall*) exec {interpreter} "$@";; esac\n' if real_pip else ''
    executable(bin_dir / 'python', '#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = pip ]; then\n'
                                   f'  [ "$3" = download ] && exec {interpreter} {bin_dir}/fake_mmcv_source.py "$@"\n'
                                   f'  {install_wheel}  exit 0\nfi\nexec {interpreter} "$@"\n')
    path = os.environ['PATH']
    if nvcc_release is None:  # no nvcc at all: the machine's own left off PATH too
        path = os.pathsep.join(d for d in path.split(os.pathsep) if not (Path(d) / 'nvcc').exists())
    else:
        executable(bin_dir / 'nvcc', '#!/bin/sh\n'
                                     f'echo "Cuda compilation tools, release {nvcc_release}, V{nvcc_release}.1"\n')
    if cached is not None:
        wheels = cached_wheel_dir(tmp_path, cached, env.get('PYTHONPATH'))
        wheels.mkdir(parents=True)
        (wheels / 'mmcv-2.1.0-cp311-cp311-linux_x86_64.whl').write_bytes(b'')
    environment = {key: value for key, value in os.environ.items()
                   if key not in ('TORCH_CUDA_ARCH_LIST', 'FORCE_CUDA', 'PYTORCH_ROCM_ARCH')}
    environment.update(PATH=f'{bin_dir}:{path}', PYTHON=str(bin_dir / 'python'),
                       SOFT_MM_CACHE=str(tmp_path / 'cache'), SOFT_MM_WITH_MIM='0', SOFT_MM_WITH_MMDEPLOY='0',
                       SOFT_MM_TEST_BUILD_ENV=str(tmp_path / 'build_env.json'))
    environment.update(env)
    if force_cuda:
        environment['FORCE_CUDA'] = '1'
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


def cached_wheel_dir(tmp_path: Path, ops: str, pythonpath: str | None = None) -> Path:
    """The cache folder of the installer's mmcv wheel of ``ops`` for this Python and the (fake) torch."""
    py_tag = f'cp{sys.version_info.major}{sys.version_info.minor}'
    torch_version = _fake_torch_version(pythonpath) or torch.__version__
    return tmp_path / 'cache' / 'wheels' / f'mmcv-2.1.0-{py_tag}-torch{torch_version.replace("+", "_")}-{ops}'


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
    assert status is None and f'-torch{torch.__version__.replace("+", "_")}-cuda-sm80-sm90/mmcv-2.1.0' in out
    (tmp_path / 'chosen').mkdir()
    (toolkit / 'include' / 'cusparse.h').write_text('')
    status, out, err = run_installer(tmp_path / 'chosen', torch.version.cuda, until='reusing the cached wheel',
                                     cached='cuda-sm90', TORCH_CUDA_ARCH_LIST='9.0', CUDA_HOME=str(toolkit))
    assert status is None and 'no GPU visible' not in out, (out[-2000:], err)  # a list the user set is kept, and keys
    assert '-cuda-sm90/mmcv-2.1.0' in out
    assert 'CPATH' not in out  # the toolkit has the headers


def fake_torch(folder: Path, torch_version: str, torchvision_version: str,
               gpu_capability: tuple[int, int] | None = None) -> Path:
    """A folder that, first on PYTHONPATH, makes ``import torch`` / ``torchvision`` and their distributions' metadata
    report the given versions (nothing else of them is needed before the installer's checks stop or pin) and, with
    ``gpu_capability``, a CUDA 13.0 torch (built for sm_75 to sm_120) that sees one GPU of that capability."""
    for name, version in (('torch', torch_version), ('torchvision', torchvision_version)):
        (folder / name).mkdir(parents=True)
        (folder / name / '__init__.py').write_text(f'__version__ = {version!r}\n')
        (folder / f'{name}-{version}.dist-info').mkdir()
        (folder / f'{name}-{version}.dist-info' / 'METADATA').write_text(f'Name: {name}\nVersion: {version}\n')
    if gpu_capability is not None:
        with open(folder / 'torch' / '__init__.py', 'a') as module:
            module.write('from types import SimpleNamespace\n'
                         "version = SimpleNamespace(cuda='13.0')\n"
                         'cuda = SimpleNamespace(is_available=lambda: True, device_count=lambda: 1,\n'
                         f'                      get_device_capability=lambda index: {tuple(gpu_capability)!r},\n'
                         "                      get_arch_list=lambda: ['sm_75', 'sm_80', 'sm_86', 'sm_90', 'sm_100',"
                         " 'sm_120'])\n")
    return folder


def _fake_torch_version(pythonpath: str | None) -> str | None:
    """The version of the fake torch first on ``pythonpath`` (None: the real one is imported)."""
    if pythonpath is None:
        return None
    init = Path(pythonpath.split(os.pathsep)[0]) / 'torch' / '__init__.py'
    return init.read_text().split("'")[1] if init.exists() else None


@pytest.mark.parametrize('capability, cached, taken', [
    ((8, 6), 'cuda-sm80-sm90', True),  # sm_80 code runs on an sm_86 GPU (same major version, lower minor)
    ((9, 0), 'cuda-sm80-sm90', True),
    ((7, 5), 'cuda-sm80-sm90', False),  # a T4: no code for it in a wheel built without a GPU
    ((12, 0), 'cuda-sm80-sm90', False),  # an RTX 5090 (Blackwell) likewise
    ((12, 0), 'cuda-sm90ptx', True),  # PTX of an older architecture: compiled for the GPU when loaded
    ((8, 6), 'cuda-sm90a', False),  # arch-specific code runs on exactly that architecture
    ((8, 6), 'cpu', False),  # a CPU-ops wheel has no architectures: never taken for CUDA ops
])
def test_a_cached_cuda_wheel_is_reused_only_where_its_architectures_cover_the_gpu(tmp_path, capability, cached, taken):
    fake = fake_torch(tmp_path / 'fake', '2.14.1', '0.29.1', gpu_capability=capability)
    toolkit = tmp_path / 'toolkit'
    (toolkit / 'include').mkdir(parents=True)
    (toolkit / 'include' / 'cusparse.h').write_text('')
    stop = 'reusing the cached wheel' if taken else 'no cached wheel in'
    status, out, err = run_installer(tmp_path, '13.0', until=stop, cached=cached, PYTHONPATH=str(fake),
                                     CUDA_HOME=str(toolkit))
    assert status is None, (out[-2000:], err[-2000:])
    own = f'{capability[0]}{capability[1]}'
    assert f'building the CUDA ops for the visible GPU: TORCH_CUDA_ARCH_LIST={capability[0]}.{capability[1]}+PTX' in out
    if taken:
        assert f'the cached wheel in {tmp_path}/cache/wheels/mmcv-2.1.0-' in out and f'-{cached} holds code for this ' \
            f'GPU (compute capability {capability[0]}.{capability[1]})' in out, out[-2000:]
        assert f'-{cached}/mmcv-2.1.0' in out.splitlines()[-1]
    else:  # built for the GPU's own architecture, under its own key
        assert out.splitlines()[-1].startswith('no cached wheel in ') and f'-cuda-sm{own}ptx: building from source' \
            in out.splitlines()[-1], out[-2000:]


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


# --- a ROCm torch (AMD GPUs) ----------------------------------------------------------------------------------------

HIP = '6.4.43482-0f2d60242'
CUDA_WORDS = ('nvcc', 'CUDA toolkit', 'FORCE_CUDA', 'CUDA ops')


def fake_rocm_torch(folder: Path, rocm_home: Path | None, gpu: bool = True) -> Path:
    """A ROCm build of torch 2.14.1 (HIP 6.4, no CUDA) that sees an MI300X when ``gpu``, and whose extension builder
    (``torch.utils.cpp_extension.ROCM_HOME``, what mmcv's setup.py asks) finds the ROCm toolkit at ``rocm_home``."""
    fake_torch(folder, '2.14.1', '0.29.1')
    with open(folder / 'torch' / '__init__.py', 'a') as module:
        module.write('from types import SimpleNamespace\n'
                     f'version = SimpleNamespace(cuda=None, hip={HIP!r})\n'
                     f'cuda = SimpleNamespace(is_available=lambda: {gpu}, device_count=lambda: {int(gpu)},\n'
                     '                      get_device_capability=lambda index: (9, 4),\n'
                     "                      get_arch_list=lambda: ['gfx90a', 'gfx942'])\n")
    (folder / 'torch' / 'utils').mkdir()
    (folder / 'torch' / 'utils' / '__init__.py').write_text('')
    (folder / 'torch' / 'utils' / 'cpp_extension.py').write_text(
        f'ROCM_HOME = {str(rocm_home) if rocm_home else None!r}\n')
    return folder


def _rocm_toolkit(tmp_path: Path) -> Path:
    toolkit = tmp_path / 'rocm'
    (toolkit / 'bin').mkdir(parents=True)
    executable(toolkit / 'bin' / 'hipcc', '#!/bin/sh\necho "HIP version: 6.4.43482-0f2d60242"\n')
    return toolkit


@pytest.mark.parametrize(('arch', 'ops'), [(None, 'rocm6.4'), ('gfx942', 'rocm6.4-gfx942')])
def test_a_rocm_torch_with_the_toolkit_builds_mmcvs_ops_for_rocm(tmp_path, arch, ops):
    toolkit = _rocm_toolkit(tmp_path)
    fake = fake_rocm_torch(tmp_path / 'fake', toolkit)
    extra = {'PYTORCH_ROCM_ARCH': arch} if arch else {}
    status, out, err = run_installer(tmp_path, '12.4', until='cached /', cached=None, force_cuda=False,
                                     PYTHONPATH=str(fake), **extra)
    assert status is None, (out[-3000:], err[-3000:])
    archs = f'PYTORCH_ROCM_ARCH={arch}' if arch else 'the architectures torch was built for (set PYTORCH_ROCM_ARCH'
    assert f"ROCm torch (HIP {HIP}): building mmcv's ops for ROCm with the toolkit in {toolkit}, for {archs}" in out
    assert f'-torch2.14.1-{ops}: building from source ({ops} ops;' in out, out[-3000:]
    assert f'cached {cached_wheel_dir(tmp_path, ops, str(fake))}/mmcv-2.1.0-py3-none-any.whl' in out
    # mmcv's own setup.py takes the ROCm branch (torch.version.hip and ROCM_HOME): nothing hidden, nothing forced
    assert json.loads((tmp_path / 'build_env.json').read_text()) == {
        'MMCV_WITH_OPS': '1', 'FORCE_CUDA': None, 'HIP_VISIBLE_DEVICES': None, 'CUDA_VISIBLE_DEVICES': None,
        'PYTORCH_ROCM_ARCH': arch}
    assert not [word for word in CUDA_WORDS if word in out + err], out + err


@pytest.mark.parametrize('gpu', [True, False])
def test_a_rocm_torch_without_the_toolkit_builds_mmcvs_cpu_ops_and_says_so(tmp_path, gpu):
    fake = fake_rocm_torch(tmp_path / 'fake', None, gpu=gpu)
    status, out, err = run_installer(tmp_path, '12.4', until='cached /', cached=None, force_cuda=False,
                                     PYTHONPATH=str(fake))
    assert status is None, (out[-3000:], err[-3000:])
    assert (f"ROCm torch (HIP {HIP}) without the ROCm toolkit (no hipcc; set ROCM_HOME if it is installed elsewhere): "
            "building mmcv's CPU ops. The backbones, segmentation and classification run on the AMD GPU with them; "
            "detection's nms and RoIAlign need mmcv's GPU ops: install ROCm's HIP SDK and rerun to build them.") in out
    assert '-torch2.14.1-cpu: building from source (cpu ops; 15-30 minutes on 2 cores)' in out, out[-3000:]
    # the build sees no GPU, or mmcv's setup.py would take its GPU branch (torch.cuda.is_available()) without ROCm
    hidden = '-1' if gpu else None
    assert json.loads((tmp_path / 'build_env.json').read_text()) == {
        'MMCV_WITH_OPS': '1', 'FORCE_CUDA': None, 'HIP_VISIBLE_DEVICES': hidden, 'CUDA_VISIBLE_DEVICES': hidden,
        'PYTORCH_ROCM_ARCH': None}
    assert not [word for word in CUDA_WORDS if word in out + err], out + err


def test_force_cuda_on_a_rocm_torch_without_the_toolkit_stops_with_one_sentence(tmp_path):
    fake = fake_rocm_torch(tmp_path / 'fake', None)
    status, out, err = run_installer(tmp_path, '12.4', cached=None, PYTHONPATH=str(fake))
    assert status == 1 and err.strip().splitlines()[-1] == (
        f"soft_mm install failed: FORCE_CUDA=1 asks for mmcv's GPU ops, but the installed torch is a ROCm build (HIP "
        f"{HIP}) and torch finds no ROCm toolkit (hipcc); install ROCm's HIP SDK (or set ROCM_HOME to where it is) "
        "and rerun, or unset FORCE_CUDA to build mmcv's CPU ops."), err[-3000:]
    assert 'nvcc' not in out + err and 'building from source' not in out


def test_a_visible_gpu_without_nvcc_names_no_force_cuda_the_user_never_set(tmp_path):
    fake = fake_torch(tmp_path / 'fake', '2.14.1', '0.29.1', gpu_capability=(8, 6))
    status, _, err = run_installer(tmp_path, None, cached=None, force_cuda=False, PYTHONPATH=str(fake))
    assert status == 1 and err.strip().splitlines()[-1] == (
        "soft_mm install failed: torch sees a GPU, so mmcv's CUDA ops are built but nvcc is not on PATH; install the "
        'CUDA toolkit.'), err[-2000:]


# --- whether an environment holds the cached mmcv wheel -------------------------------------------------------------

def fake_mmcv_wheel(folder: Path, ops: bytes) -> Path:
    """A small mmcv 2.1.0 wheel whose "compiled ops" (``mmcv/_ext...so``) hold ``ops``: a build of its own."""
    files = {'mmcv/__init__.py': b"__version__ = '2.1.0'\n",
             'mmcv/ops/__init__.py': b'batched_nms = roi_align = None\n',
             'mmcv/_ext.cpython-311-x86_64-linux-gnu.so': ops,
             'mmcv-2.1.0.dist-info/METADATA': b'Metadata-Version: 2.1\nName: mmcv\nVersion: 2.1.0\n',
             'mmcv-2.1.0.dist-info/WHEEL': b'Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n'
                                           b'Tag: py3-none-any\n'}

    def digest(data: bytes) -> str:
        return 'sha256=' + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()

    record = ''.join(f'{name},{digest(data)},{len(data)}\n' for name, data in files.items())
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / 'mmcv-2.1.0-py3-none-any.whl'
    with zipfile.ZipFile(wheel, 'w') as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr('mmcv-2.1.0.dist-info/RECORD', record + 'mmcv-2.1.0.dist-info/RECORD,,\n')
    return wheel


def _installed_ops(python: Path) -> bytes:
    where = subprocess.run([str(python), '-c', 'import mmcv, os; print(os.path.dirname(mmcv.__file__))'],
                           capture_output=True, text=True, check=True).stdout.strip()
    return (Path(where) / '_ext.cpython-311-x86_64-linux-gnu.so').read_bytes()


def test_the_mmcv_wheel_counts_as_installed_only_in_the_environment_that_holds_it(tmp_path):
    """The cache is shared by every environment on the machine; the installer's old marker there
    (<wheel folder>/.installed, written by the environment that installed the wheel) skipped any other environment
    that had an mmcv 2.1.0 with ops, here another build of it. Now the installed RECORD says which build it is."""
    fake = fake_torch(tmp_path / 'fake', '2.14.1', '0.29.1')
    cached = cached_wheel_dir(tmp_path / 'run', 'cpu', str(fake))
    fake_mmcv_wheel(cached, b'the cached build')
    (cached / '.installed').write_text('')  # what another environment's install left with the old installer
    venv = tmp_path / 'second_env'
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True, timeout=300)
    python = venv / 'bin' / 'python'
    other = fake_mmcv_wheel(tmp_path / 'other', b'another build of mmcv 2.1.0')
    subprocess.run([str(python), '-m', 'pip', 'install', '-q', '--no-deps', '--disable-pip-version-check', str(other)],
                   check=True, timeout=300)
    assert _installed_ops(python) == b'another build of mmcv 2.1.0'

    def install(run: str) -> str:
        """The installer's output up to the step after mmcv's, in this environment, with the shared cache."""
        (tmp_path / run).mkdir()
        status, out, err = run_installer(tmp_path / run, '13.0', until='mmdet, mmsegmentation', cached=None,
                                         force_cuda=False, interpreter=str(python), real_pip=True,
                                         PYTHONPATH=str(fake), SOFT_MM_CACHE=str(tmp_path / 'run' / 'cache'))
        assert status is None, (out[-3000:], err[-3000:])
        return out

    out = install('first')
    assert f'reusing the cached wheel {cached}/mmcv-2.1.0-py3-none-any.whl' in out, out[-3000:]
    assert _installed_ops(python) == b'the cached build'
    out = install('second')  # now it holds it
    assert 'mmcv 2.1.0 with ops already installed (built for torch 2.14.1, cpu ops)' in out, out[-3000:]
    assert _installed_ops(python) == b'the cached build'
