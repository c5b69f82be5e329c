"""openmim runs mmdet's and mmseg's own train/test scripts on soft_mm's demo configs (soft_mm via custom_imports),
and, from a wheel built from this checkout, soft_mm's own (``mim train soft_mm CONFIG.py``, ``mim search soft_mm``)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from helpers.repo import ROOT

# the mim of this interpreter's environment first (where tools/install.sh puts it), else any on PATH
MIM = shutil.which('mim', path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get('PATH', '')]))
ON_CI = os.environ.get('CI', '').lower() in ('1', 'true')
# pip builds in the checkout (build/, soft_mm.egg-info) and `mim install -e` reinstalls soft_mm into site-packages:
# under pytest-xdist these tests run on one worker, one after another
pytestmark = pytest.mark.xdist_group('site_packages')


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


def _run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """stdout and stderr of the command, which must succeed (the end of its output in the failure otherwise)."""
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    return output


def _mim(args: list[str], cwd: Path) -> str:
    return _run([MIM, *args], cwd)


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
    output = _mim(['install', '-e', str(ROOT), '--no-build-isolation'], tmp_path)  # offline: setuptools is here
    assert 'Successfully installed soft_mm' in output
    assert _installed_checkout() == ROOT.resolve()
    # setup.py links soft_mm/.mim/{configs,tools,model-index.yml} to the checkout's own, so edits are seen at once
    for name in MIM_RESOURCES:
        link = ROOT / 'soft_mm' / '.mim' / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), link
    # the README's command, as a user runs it: from any folder (top_level.txt points mim at the checkout, setup.py)
    listed = _mim(['search', 'soft_mm', '--valid-config'], tmp_path)
    assert all(f"'{name}'" in listed for name in _metafile_names()), listed[-3000:]


def _installer_pip_arguments() -> list[str]:
    """The pip arguments with which tools/install.sh installs soft_mm (its last step), read from the script."""
    step = re.search(r'^ *pip_q (.*) -e "\$ROOT"$', (ROOT / 'tools/install.sh').read_text(), re.MULTILINE)
    assert step, 'tools/install.sh has no `pip_q ... -e "$ROOT"` line'
    return step[1].split()


# pip builds the editable wheel in a fresh venv (a few seconds: every requirement is already installed)
def test_mim_search_from_another_folder_on_the_installers_editable_install(tmp_path: Path) -> None:
    """The README's `mim search soft_mm` on soft_mm installed as tools/install.sh installs it (editable, its own pip
    arguments), run from a folder outside the checkout. openmim 0.3.9 looks for <dist location>/soft_mm/.mim: for a
    PEP 660 editable install site-packages/soft_mm, which does not exist (it failed with "model-index.yml ... is not
    found, please upgrade your soft_mm"), then <dist location>/<first line of top_level.txt>: the checkout's."""
    # no pip of its own: this interpreter's pip and setuptools (the installer's pins) build it, as in the installer
    python, env = _venv_seeing_this_one(tmp_path, with_pip=False)
    _run([str(python), '-m', 'pip', 'install', '--disable-pip-version-check', '-q', *_installer_pip_arguments(), '-e',
          str(ROOT)], tmp_path, env)
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    where = _run([str(python), '-c', 'import soft_mm; print(soft_mm.__file__)'], elsewhere, env).split()[-1]
    assert Path(where).resolve() == (ROOT / 'soft_mm' / '__init__.py').resolve()  # the editable install, this checkout
    listed = _run([str(python), '-m', 'mim', 'search', 'soft_mm', '--valid-config'], elsewhere, env)
    names = _metafile_names()
    assert len(names) == 28 and all(f"'{name}'" in listed for name in names), listed[-3000:]
    shown = _run([str(python), '-m', 'mim', 'search', 'soft_mm', '--config', 'retinanet_soft_small_coco', '--field',
                  'backbone', 'coco/box_ap'], elsewhere, env)
    assert 'soft-norm-small' in shown and '42.8' in shown, shown


MIM_RESOURCES = ('configs', 'tools', 'model-index.yml')  # what setup.py ships as soft_mm/.mim


def _shipped_files() -> dict[str, bytes]:
    """soft_mm/.mim/<path> -> contents, for every file the checkout's configs, tools and model index hold."""
    files = {}
    for name in MIM_RESOURCES:
        source = ROOT / name
        for path in ([source] if source.is_file() else sorted(source.rglob('*'))):
            if path.is_file() and '__pycache__' not in path.parts and path.suffix != '.pyc':
                files[f'soft_mm/.mim/{path.relative_to(ROOT).as_posix()}'] = path.read_bytes()
    return files


@pytest.fixture(scope='module')
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this checkout, built as a user would (pip wheel; every build requirement is installed already)."""
    out = tmp_path_factory.mktemp('wheel')
    done = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation',
                           '--disable-pip-version-check', '-q', '-w', str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    [built] = out.glob('soft_mm-*.whl')
    return built


def test_wheel_ships_configs_tools_and_model_index_for_mim(wheel: Path) -> None:
    """mim looks for <installed soft_mm>/.mim/{configs,tools,model-index.yml}: the wheel holds the checkout's files
    there, byte for byte (configs with their _base_ and metafiles, tools/train.py and tools/test.py among them)."""
    expected = _shipped_files()
    assert {'soft_mm/.mim/tools/train.py', 'soft_mm/.mim/tools/test.py', 'soft_mm/.mim/model-index.yml',
            'soft_mm/.mim/configs/retinanet_soft_tiny_demo.py',
            'soft_mm/.mim/configs/_base_/demo_runtime.py'} <= set(expected)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        shipped = {name: archive.read(name) for name in names if name.startswith('soft_mm/.mim/')}
    assert sorted(set(expected) - set(shipped)) == [], 'missing from the wheel'
    assert sorted(set(shipped) - set(expected)) == [], 'in the wheel but not in the checkout'
    assert [name for name in expected if shipped[name] != expected[name]] == []
    # the benchmarks (benchmarks/, beside tools/) stay in the checkout: not in .mim, not in the wheel at all
    assert not [name for name in names if 'benchmark' in name or 'device_check' in name], 'a benchmark in the wheel'


# what a checkout holds besides its sources (.gitignore's build outputs, data and run outputs, and soft_mm/.mim, the
# editable install's links): the sdist is built from a copy of the rest, as from an unpacked release, no git needed
NOT_SOURCE = ('.git', '__pycache__', '*.py[cod]', '*.egg-info', 'build', 'dist', '.pytest_cache', '.ruff_cache',
              'data', 'checkpoints', 'work_dirs', 'outputs', '*.pth', '*.pt', '.mim')
BUILD_SDIST = 'import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))'


def test_sdist_builds_a_wheel_with_the_mim_resources(tmp_path: Path) -> None:
    """`python -m build` builds the wheel from the sdist: MANIFEST.in must put configs, tools and the model index in
    it, or that wheel would have no soft_mm/.mim. The sdist is built from a clean copy of the checkout's source files
    (a checkout's stale soft_mm.egg-info/SOURCES.txt would otherwise stand in for MANIFEST.in)."""
    clean = tmp_path / 'checkout'
    shutil.copytree(ROOT, clean, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    sdist = subprocess.run([sys.executable, '-c', BUILD_SDIST, str(tmp_path)], cwd=clean,
                           capture_output=True, text=True, timeout=600, check=True).stdout.split()[-1]
    _run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '--disable-pip-version-check',
          '-q', '-w', str(tmp_path / 'wheel'), str(tmp_path / sdist)], tmp_path)
    [built] = (tmp_path / 'wheel').glob('soft_mm-*.whl')
    with zipfile.ZipFile(built) as archive:
        shipped = {name for name in archive.namelist() if name.startswith('soft_mm/.mim/')}
    assert shipped == set(_shipped_files())


def _venv_seeing_this_one(tmp_path: Path, with_pip: bool = True) -> tuple[Path, dict[str, str]]:
    """A fresh venv at ``tmp_path/venv`` that sees this interpreter's packages (torch, mmcv, mmdet, ...), its python
    and the environment for its processes, which has no PYTHONPATH (conftest puts the checkout there)."""
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--system-site-packages', *([] if with_pip else ['--without-pip']),
                    str(venv)], check=True, timeout=300)
    python = venv / 'bin' / 'python'
    env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
    if sys.prefix != sys.base_prefix:  # this interpreter is itself a venv: --system-site-packages misses its packages
        purelib = subprocess.run([str(python), '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
                                 capture_output=True, text=True, check=True, env=env).stdout.strip()
        import site

        Path(purelib, '_outer_site_packages.pth').write_text('\n'.join(site.getsitepackages()) + '\n')
    return python, env


def _venv(tmp_path: Path, wheel: Path) -> tuple[Path, dict[str, str]]:
    """A fresh venv that sees this interpreter's packages with only the wheel installed in it (and its environment)."""
    python, env = _venv_seeing_this_one(tmp_path)
    _run([str(python), '-m', 'pip', 'install', '--no-deps', '--disable-pip-version-check', '-q', str(wheel)],
         tmp_path, env)
    return python, env


def _metafile_names() -> list[str]:
    index = yaml.safe_load((ROOT / 'model-index.yml').read_text())
    return [model['Name'] for metafile in index['Import'] for model in yaml.safe_load((ROOT / metafile).read_text())
            ['Models']]


WHERE = 'import soft_mm, sysconfig; print(soft_mm.__file__); print(sysconfig.get_path("purelib"))'


@pytest.mark.slow  # the wheel, a venv, 1 short epoch and a test run through mim: about 1-2 minutes on 2 busy cores
def test_wheel_in_fresh_venv_mim_train_test_search_soft_mm(tmp_path: Path, wheel: Path) -> None:
    python, env = _venv(tmp_path, wheel)
    run_dir = tmp_path / 'run'  # not the checkout: `python -m` puts the working directory first on sys.path
    run_dir.mkdir()
    where = subprocess.run([str(python), '-c', WHERE], cwd=run_dir, env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    assert Path(where[-2]).resolve().parent == (Path(where[-1]) / 'soft_mm').resolve(), where
    assert Path(where[-1]).resolve().is_relative_to((tmp_path / 'venv').resolve())
    mim = [str(python), '-m', 'mim']
    mim_dir = Path(where[-1]) / 'soft_mm' / '.mim'

    trained = _run([*mim, 'train', 'soft_mm', 'retinanet_soft_tiny_demo.py', '--work-dir', 'work', '--cfg-options',
                    'train_cfg.max_epochs=1', *SMALL_DATA], run_dir, env)
    assert f'will use {mim_dir}/configs/retinanet_soft_tiny_demo.py' in trained  # the config mim found by its name
    assert f'{mim_dir}/tools/train.py' in trained  # soft_mm's own train script
    assert (run_dir / 'work/epoch_1.pth').is_file()

    tested = _run([*mim, 'test', 'soft_mm', 'retinanet_soft_tiny_demo.py', '--checkpoint', 'work/epoch_1.pth',
                   '--work-dir', 'work', '--cfg-options', *SMALL_DATA], run_dir, env)
    assert f'{mim_dir}/tools/test.py' in tested and 'Epoch(test)' in tested

    listed = _run([*mim, 'search', 'soft_mm', '--valid-config'], run_dir, env)
    names = _metafile_names()
    assert len(names) == 28 and all(f"'{name}'" in listed for name in names), listed[-3000:]
    shown = _run([*mim, 'search', 'soft_mm', '--config', 'retinanet_soft_small_coco', 'soft_small_in1k', '--field',
                  'backbone', 'soft-norm', 'parameters(millions)', 'coco/box_ap', 'imagenet-1k/top_1_accuracy'],
                 run_dir, env)
    assert all(f in shown for f in ('soft-norm-small', 'soft-small', '34', '24', '42.8', '82.2')), shown
