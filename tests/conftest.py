"""Shared test fixtures: tools and benchmarks loaded by path, and random checkpoints in the authors' (fudan-zvg/SOFT)
layout, generated from their key/shape lists.

``models/official/official_keys/soft_<size>.txt`` list every key and shape of the authors' five model definitions (the
second header line gives their parameter count); the tensors are random with the magnitudes of a trained network.
"""
from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

# The Triton backend's tests run its kernels in the Triton interpreter on CPU tensors, on every machine: triton takes
# the interpreter up only if the variable is set before triton is first imported (its library functions, e.g. tl.sum,
# are decorated then), so it is set here, GPU or not (left unset on a GPU machine, those tests fail with "Cannot call
# @triton.jit'd outside of the scope of a kernel"). It is used only where a test forces backend='triton' on CPU
# tensors; the real kernels on a GPU are checked by benchmarks/device_check.py.
os.environ.setdefault('TRITON_INTERPRET', '1')

from helpers.repo import ROOT  # tests/ is on sys.path (pyproject's pythonpath)

import soft_mm
from soft_mm.ops.compat import CPU_FLOAT16_AUTOCAST
from soft_mm.ops.triton_route import TRITON_VERSION, triton_available
from soft_mm.ops.triton_targets import MIN_TRITON

# Under pytest-xdist (the README's `-n 2`) each worker, and every process it starts (a tool, a training run, its
# DataLoader workers), computes on one thread: two workers of two threads each on two cores oversubscribe them (steps
# 5-10x slower: the OpenMP threads spin while preempted). Without xdist the tests keep torch's default.
if int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1')) > 1:
    for _variable in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS'):
        os.environ[_variable] = '1'
    torch.set_num_threads(1)

# Where CI runs (CI=true) every test must run: a skip (a missing triton, openmim or other package, a test's own
# pytest.skip) fails instead of hiding. Deselected slow tests are not skips; CI runs them too.
ON_CI = os.environ.get('CI', '').lower() in ('1', 'true')


def _fail_skip_on_ci(report) -> None:
    if ON_CI and report.skipped and not hasattr(report, 'wasxfail'):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = 'failed'
        report.longrepr = f'skipped where CI=true, where every test must run: {reason}'


def _absent_features() -> dict[str, str]:
    """marker -> why the installed stack lacks what the tests so marked run (newest torch: a CUDA device only)."""
    absent = {}
    if TRITON_VERSION is not None and not triton_available():
        found, needed = ('.'.join(map(str, v)) for v in (TRITON_VERSION, MIN_TRITON))
        absent['triton_kernels'] = (f'triton {found} is older than the {needed} they need (torch < 2.8 ships such a '
                                    'triton)')
    if not CPU_FLOAT16_AUTOCAST:
        absent['cpu_float16'] = (f'torch {torch.__version__} has no float16 autocast on CPU (torch >= 2.3 has; float16 '
                                 'GEMMs from 2.2)')
    if not torch.cuda.is_available():
        absent['cuda'] = ('no CUDA device here (the GPU machine runs them: the test command in '
                          'docs/advanced/precision_and_backends.md)')
    return absent


ABSENT = _absent_features()


def pytest_configure(config):
    config.addinivalue_line('markers', 'triton_kernels: runs the Triton kernels (op_checks.triton_kernels)')
    config.addinivalue_line('markers', 'cpu_float16: runs float16 autocast or float16 layers on CPU (torch >= 2.3)')
    config.addinivalue_line('markers', 'cuda: runs on a CUDA device (deselected where there is none)')


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist the longest work is handed out first, so the two workers finish together instead of one
    running the last demo alone: the groups of tests that share one run (``xdist_group``, e.g. the README's main job
    and the tests of its checkpoint), then the other long end-to-end runs (marked slow), then the rest (a stable
    sort: the order within each kind is kept).

    Tests of what the installed stack does not have (:data:`ABSENT`: the Triton kernels under a triton older than
    they need, float16 on CPU before torch 2.3, a CUDA device) do not apply: deselected and counted in the summary,
    not skipped (tests/ops/soft/test_dispatch.py holds the Triton backend's refusal with its reason there)."""
    if os.environ.get('PYTEST_XDIST_WORKER'):
        items.sort(key=lambda item: (item.get_closest_marker('xdist_group') is None,
                                     item.get_closest_marker('slow') is None))
    if not ABSENT:
        return
    kept, deselected = [], []
    for item in items:
        (deselected if any(item.get_closest_marker(marker) for marker in ABSENT) else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for marker, reason in ABSENT.items():
        terminalreporter.write_line(f'the tests marked {marker} were deselected: {reason}')


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip_on_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_skip_on_ci(outcome.get_result())


# Every process a test starts (a tool, a worker, a training run) imports this checkout's soft_mm, whatever copy of
# soft_mm is installed (an editable install of another checkout, or none).
os.environ['PYTHONPATH'] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))

# ... and so must the tests themselves: a stale install of another checkout would be tested instead, silently.
_TESTED = Path(soft_mm.__file__).resolve()
assert _TESTED.is_relative_to((ROOT / 'soft_mm').resolve()), (
    f'the tests would import soft_mm from {_TESTED.parent}, not from this checkout ({ROOT / "soft_mm"}): '
    f'install this checkout (pip install --no-deps -e {ROOT}, or bash tools/install.sh) or put {ROOT} '
    f'first on PYTHONPATH')

_SCRIPTS: dict[Path, ModuleType] = {}


def _load_script(path: Path) -> ModuleType:
    """Import the script at ``path`` once per session under a unique module name (``tools/test.py`` would shadow the
    standard library's ``test``): ``tools/deployment/export_onnx.py`` -> ``soft_mm_tools_deployment_export_onnx``."""
    if path not in _SCRIPTS:
        module_name = 'soft_mm_' + '_'.join(path.relative_to(ROOT).with_suffix('').parts)
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _SCRIPTS[path] = module
    return _SCRIPTS[path]


@pytest.fixture
def gpu_route(monkeypatch):
    """The GPU route on CPU tensors for the test (:func:`soft_mm.ops.triton_route.interpreted_triton_route`): the
    package's Triton kernels run in the interpreter where a CUDA tensor would take them."""
    from soft_mm.ops.triton_route import interpreted_triton_route

    monkeypatch.setenv('TRITON_INTERPRET', '1')
    with interpreted_triton_route():
        yield


@pytest.fixture(scope='session')
def load_tool() -> Callable[[str], ModuleType]:
    """``load_tool('analysis_tools/get_flops')`` -> the module of ``tools/analysis_tools/get_flops.py``."""
    return lambda name: _load_script(ROOT / 'tools' / f'{name}.py')


@pytest.fixture(scope='session')
def load_benchmark() -> Callable[[str], ModuleType]:
    """``load_benchmark('attention')`` -> the module of ``benchmarks/attention.py`` (the harness beside it imports as
    ``harness``: pyproject's pythonpath puts benchmarks/ on ``sys.path``)."""
    return lambda name: _load_script(ROOT / 'benchmarks' / f'{name}.py')

KEYS_DIR = Path(__file__).parent / 'models' / 'official' / 'official_keys'
OFFICIAL_VARIANTS = ('tiny', 'small', 'medium', 'large', 'huge')
# Scale of the landmark LayerNorm: landmarks ~0.3 per coordinate keep the Gaussian kernels K1 and A in (0.01, 1)
# (a unit scale gives A ~ identity and K1 ~ 1e-3, where the Nystrom term hardly matters and a test sees little).
LANDMARK_NORM_SCALE = 0.3


def read_official_layout(variant: str) -> tuple[dict[str, tuple[int, ...]], int]:
    """``({key: shape}, published parameter count)`` of the authors' ``soft_<variant>``."""
    lines = (KEYS_DIR / f'soft_{variant}.txt').read_text().splitlines()
    num_params = int(re.search(r'# (\d+) parameters', lines[1])[1])
    shapes = {}
    for line in lines[2:]:
        key, shape = line.split('\t')
        shapes[key] = tuple(int(s) for s in re.findall(r'\d+', shape))
    return shapes, num_params


def random_official_state_dict(variant: str, seed: int = 0, dtype: torch.dtype = torch.float32,
                               ) -> dict[str, torch.Tensor]:
    """Random tensors for every key of the authors' ``soft_<variant>``.

    Linear/conv weights, biases, position embeddings and the cls token ~ N(0, 0.02); LayerNorm/BatchNorm scales
    ~ 1 + N(0, 0.1) (landmark LayerNorm: ``LANDMARK_NORM_SCALE`` times that); BN running means ~ N(0, 0.1), running
    variances ~ U(0.5, 1.5).
    """
    gen = torch.Generator().manual_seed(seed)
    shapes, _ = read_official_layout(variant)

    def normal(shape: tuple[int, ...], std: float, mean: float = 0.0) -> torch.Tensor:
        return mean + std * torch.randn(shape, generator=gen, dtype=dtype)

    state_dict = {}
    for key, shape in shapes.items():
        if key.endswith('num_batches_tracked'):
            state_dict[key] = torch.tensor(1000)
        elif key.endswith('running_var'):
            state_dict[key] = 0.5 + torch.rand(shape, generator=gen, dtype=dtype)
        elif key.endswith('running_mean'):
            state_dict[key] = normal(shape, 0.1)
        elif key.endswith('.weight') and len(shape) == 1:  # LayerNorm / BatchNorm scale
            scale = LANDMARK_NORM_SCALE if 'Qnorm_act' in key else 1.0
            state_dict[key] = scale * normal(shape, 0.1, mean=1.0)
        else:
            state_dict[key] = normal(shape, 0.02)
    return state_dict


@pytest.fixture(scope='session')
def official_layout():
    """:func:`read_official_layout` (test modules import no helpers from conftest: fixtures only)."""
    return read_official_layout


@pytest.fixture(scope='session')
def make_official_state_dict():
    """:func:`random_official_state_dict`."""
    return random_official_state_dict


@pytest.fixture(scope='session')
def official_tiny() -> dict[str, torch.Tensor]:
    return random_official_state_dict('tiny')


@pytest.fixture(scope='session')
def official_small() -> dict[str, torch.Tensor]:
    """The authors' 'small' definition: depths 1,3,20,4 (38.9M), not the published 24M model."""
    return random_official_state_dict('small')

