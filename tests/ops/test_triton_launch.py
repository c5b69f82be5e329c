"""soft_mm.ops.triton_launch: the launch plans against triton's own ``kernel[grid]``.

A training step of a small SOFT-Norm pyramid on the GPU route of a stand-in sm_90 driver (triton's real launch path on
CPU tensors, without the interpreter, in a process of its own: ``tests/helpers/launch_parity.py``): every kernel of the
step, every signature, the plan's direct launch hands the driver's launcher exactly what ``kernel[grid]`` does, and the
stream is read at each launch, with and without a launch-enter hook; a plan that passes one argument wrong is seen. Run
on the installed triton (the torch matrix's ``2.8`` entry runs it on triton 3.4, the oldest the kernels take). The key's
parts and the fallback to ``kernel[grid]`` below triton 3.4, in this process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers.repo import ROOT

from soft_mm.ops import triton_launch
from soft_mm.ops.functional.add_norm import add_norm_config
from soft_mm.ops.functional.head_conv import CONV_ADD_KERNELS
from soft_mm.ops.soft.backends.triton import nystrom_config
from soft_mm.ops.triton_launch import MAX_PLANS, PlannedLauncher, once_differentiable, specialization
from soft_mm.testing.stub_driver import stub_triton_driver

SCRIPT = ROOT / 'tests' / 'helpers' / 'launch_parity.py'
# the kernels of a training step: every kernel the SOFT op and add + LayerNorm declare
STEP_KERNELS = {*nystrom_config.KERNELS, *add_norm_config.KERNELS, *CONV_ADD_KERNELS}


def _parity(*args: str) -> dict:
    env = {key: value for key, value in os.environ.items() if key != 'TRITON_INTERPRET'}
    result = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.triton_kernels
@pytest.mark.slow  # compiles each kernel of the step for sm_90 (cached by triton afterwards): about a minute cold
def test_plans_pass_exactly_what_kernel_grid_passes_for_every_kernel_of_a_training_step():
    report = _parity('--enter-hook-on', 'float16')
    kernels = report['kernels']
    assert set(kernels) == STEP_KERNELS, sorted(kernels)
    assert all(entry['equal'] == entry['launches'] > 0 for entry in kernels.values()), kernels
    # bfloat16 and float16 steps, stochastic depth, post- and pre-norm blocks: the add + LayerNorm kernel's variants
    assert kernels['add_norm_fwd_kernel_y']['signatures'] >= 8 and kernels['nystrom_fwd_kernel_o']['signatures'] >= 2
    assert report['stream_read_at_each_launch'] is True
    # with a launch-enter hook set (the float16 step: a profiler's), the plans hand the launcher triton's per-launch
    # metadata (its contents compared above) and the hook; without one, neither
    assert 0 < report['planned_launches_with_metadata'] < sum(entry['launches'] for entry in kernels.values())
    # the check sees a plan that passes one argument wrong
    mutated = _parity('--dtypes', 'bfloat16', '--mutate')['kernels']
    assert sum(entry['equal'] for entry in mutated.values()) < sum(entry['launches'] for entry in mutated.values())


def test_the_key_holds_what_triton_specialises_on():
    aligned = torch.zeros(8)
    offset = aligned[1:]  # 4 bytes past a 16-byte boundary
    assert specialization([aligned]) != specialization([offset])
    assert specialization([aligned]) != specialization([aligned.double()])
    assert specialization([1]) != specialization([2]) != specialization([16])
    assert specialization([16]) == specialization([32]) and specialization([3]) == specialization([5])
    assert specialization([2 ** 31]) != specialization([2 ** 4 * 3])  # (64-bit ints apart)
    assert specialization([(aligned, (1, 16))]) == specialization([(torch.zeros(4), (1, 32))])
    assert specialization([1.5]) == specialization([2.5]) and specialization([True]) != specialization([1])


class _Kernel:
    """A kernel stand-in: ``kernel[grid]`` records the call and returns a compiled kernel whose direct launch
    records too."""

    def __init__(self, calls: list) -> None:
        self.calls = calls
        self.params = ()

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.calls.append(('kernel[grid]', grid))
        return launch


def test_below_triton_3_4_every_launch_is_kernel_grid(monkeypatch):
    monkeypatch.setattr(PlannedLauncher, '_load', lambda self: False)
    calls: list = []
    launcher = PlannedLauncher()
    for _ in range(3):
        launcher(_Kernel(calls), (4,), (torch.zeros(4), 4), {'BLOCK': 16})
    assert calls == [('kernel[grid]', (4,))] * 3 and not launcher.plans


@pytest.mark.triton_kernels
def test_plans_are_bounded_and_hold_no_tensor(monkeypatch):
    launcher = PlannedLauncher()
    calls: list = []

    class Compiled:
        packed_metadata = function = None

    class Kernel(_Kernel):
        def __getitem__(self, grid):
            def launch(*args, **meta):
                calls.append(grid)
                return Compiled()
            return launch

    monkeypatch.setattr(triton_launch, 'MAX_PLANS', 3)
    kernel = Kernel(calls)
    with stub_triton_driver(90):
        for n in range(1, 6):
            launcher(kernel, (n,), (torch.zeros(4), 17 * n), {'BLOCK': 16 * n})  # a new signature each
    assert len(launcher.plans) <= 3 and MAX_PLANS >= 1024
    held = [v for plan in launcher.plans.values() for v in (*plan[2], *(k for key in launcher.plans for k in key))]
    assert not any(isinstance(v, torch.Tensor) for v in held)


_MODES: list[bool] = []  # the grad mode each _Cube backward ran in


class _Cube(torch.autograd.Function):
    """x ** 3 with a backward that records the grad mode it ran in."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        _MODES.append(torch.is_grad_enabled())
        (x,) = ctx.saved_tensors
        return 3 * x ** 2 * grad


def test_once_differentiable_is_torch_s_where_a_graph_is_made_and_the_plain_backward_elsewhere():
    x = torch.tensor([1.0, -2.0], dtype=torch.float64, requires_grad=True)
    _MODES.clear()
    (grad,) = torch.autograd.grad(_Cube.apply(x).sum(), x)
    assert grad.tolist() == [3.0, 12.0] and _MODES == [False]
    # create_graph with a gradient that needs its own: the first derivative as torch's decorator gives it (run without
    # grad), and differentiating it again raises the decorator's error instead of a silently wrong second derivative
    seed = torch.ones(2, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(_Cube.apply(x), x, grad_outputs=seed, create_graph=True)
    assert grad.tolist() == [3.0, 12.0] and grad.requires_grad and _MODES == [False, False]
    with pytest.raises(RuntimeError, match='marked with @once_differentiable'):
        grad.sum().backward()
