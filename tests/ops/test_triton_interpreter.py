"""soft_mm.ops.triton_interpreter and the kernels' signatures: each Triton op declares its kernels (``KERNELS`` of its
``<op>_config.py``), none takes an interpreter-only constant, and no kernel or helper function takes more than 16
arguments; the interpreter's switch follows TRITON_INTERPRET as triton_route.load_kernels loads the kernels, and a
run-time loop bound reaches ``range`` as a Python int under the interpreter (triton 3.6 with numpy >= 2.4)."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from helpers.op_checks import triton_kernels

import soft_mm
from soft_mm.ops import triton_route

pytestmark = triton_kernels

# every Triton op's kernel module (``<op>_kernels.py``, found where it lies) and its declared kernels (``KERNELS`` of
# the ``<op>_config.py`` beside it)
_PACKAGE = Path(soft_mm.__file__).parent
KERNEL_MODULES = tuple(sorted('soft_mm.' + '.'.join(path.relative_to(_PACKAGE).with_suffix('').parts)
                              for path in _PACKAGE.rglob('*_kernels.py')))
MAX_ARGUMENTS = 16


def declared_kernels(module: str) -> tuple[str, ...]:
    """``KERNELS`` of the op whose kernel module is ``module``."""
    return importlib.import_module(module.removesuffix('_kernels') + '_config').KERNELS


def jit_functions(module):
    """The ``@triton.jit`` functions defined in a kernel module (kernels and helpers), by name."""
    return {name: fn for name, fn in vars(module).items()
            if hasattr(fn, 'arg_names') and getattr(fn.fn, '__module__', None) == module.__name__}


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv('TRITON_INTERPRET', '1')


def test_each_op_declares_its_kernels_and_none_takes_an_interpreter_constant_or_more_than_16_arguments():
    assert len(KERNEL_MODULES) == 3, KERNEL_MODULES  # the SOFT op's, add + LayerNorm's and the value conv's
    counts = {}
    for module in KERNEL_MODULES:
        functions = jit_functions(triton_route.load_kernels(module))
        kernels = {name for name in functions if '_kernel_' in name}
        assert kernels == set(declared_kernels(module)), (module, sorted(kernels))
        for name, fn in functions.items():
            assert not [arg for arg in fn.arg_names if arg.startswith('INTERPRET')], (name, fn.arg_names)
            counts[name] = len(fn.arg_names)
    assert max(counts.values()) <= MAX_ARGUMENTS, counts
    # the largest: the backwards, kernels and block helpers (the helpers take the kernels' state in tuples)
    assert counts['nystrom_bwd_kernel_dq_dv_dl'] == 14 and counts['add_norm_bwd_kernel_dx'] == 15, counts
    assert counts['bwd_block'] == 11 and counts['add_norm_bwd_block'] == 15, counts


def test_the_interpreter_switch_follows_the_setting_the_kernels_are_loaded_under(monkeypatch):
    import soft_mm.ops.triton_interpreter as interpreter
    name = 'soft_mm.ops.functional.add_norm.add_norm_kernels'
    other = 'soft_mm.ops.soft.backends.triton.nystrom_kernels'
    triton_route.load_kernels(other)
    interpreted = triton_route.load_kernels(name)
    assert interpreter.INTERPRET and interpreted.loop_bound is interpreter.loop_bound
    assert type(interpreted.add_norm_fwd_kernel_y).__name__ == 'InterpretedFunction'
    monkeypatch.setenv('TRITON_INTERPRET', '0')  # (decorated for the compiler: nothing is compiled until a launch)
    compiled = triton_route.load_kernels(name)
    assert not interpreter.INTERPRET and compiled.loop_bound is interpreter.loop_bound
    assert type(compiled.add_norm_fwd_kernel_y).__name__ == 'JITFunction'
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    # a module last loaded under this setting: the switch it reads (the interpreter module's) is this setting's again
    assert triton_route.load_kernels(other) and interpreter.INTERPRET
    again = triton_route.load_kernels(name)
    assert interpreter.INTERPRET and again.loop_bound is interpreter.loop_bound
    assert type(again.add_norm_fwd_kernel_y).__name__ == 'InterpretedFunction'


def test_a_run_time_loop_bound_runs_under_the_interpreter():
    # the middle kernel's Newton–Schulz loop runs num_iters times, a run-time argument: 0, 1 and 3 iterations give
    # the start, one step and three steps of the PyTorch iteration
    from soft_mm.ops.soft.backends.triton.nystrom_launch import triton_nystrom_middle
    from soft_mm.ops.soft.backends.triton.nystrom_reference import middle_reference
    landmarks = 0.4 * torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(0))
    for num_iters in (0, 1, 3):
        fused = triton_nystrom_middle(landmarks, num_iters, 0.01, False)
        reference = middle_reference(landmarks.double(), num_iters, 0.01, False)
        assert ((fused.double() - reference).norm() / reference.norm()).item() < 1e-5, num_iters
