"""What a stage needs to replay as a CUDA graph (``compile_stages=dict(mode='reduce-overhead', pad_size_divisor=...)``),
checked on the GPU route with CPU tensors (Triton kernels interpreted): each stage's training forward and backward
traced whole (``fullgraph=True``, AOTAutograd's forward and backward graphs) with the eager results; a training step
that makes no host synchronisation (no ``.item()``, no data-dependent shape, no Python or numpy random numbers:
stochastic depth's masks drawn as tensor operations); a stage whose compile fails runs eagerly with one warning."""
from __future__ import annotations

import copy
import random
import warnings

import numpy
import pytest
import torch
from helpers.op_checks import triton_kernels
from torch.utils._python_dispatch import TorchDispatchMode

from soft_mm.models import SOFT
from soft_mm.models.compiled import CompileStagesFallbackWarning
from soft_mm.models.pyramid import SoftPyramid
from soft_mm.testing import relative_error

pytestmark = triton_kernels
# 3x3 value convs: their fused kernel's taps are a loop the interpreter runs tap by tap (9x9: 9 times the time)
ARCH = {'embed_dims': [16, 32, 48, 64], 'num_heads': [1, 2, 3, 4], 'depths': [1, 2, 1, 1], 'v_conv_kernels': [3, 3, 3]}


def _pyramid(drop_path_rate: float = 0.2) -> SoftPyramid:
    torch.manual_seed(0)
    model = SoftPyramid(ARCH, soft_norm=True, drop_path_rate=drop_path_rate).train()
    model.init_pyramid_weights()
    return model


def _stage_inputs(model: SoftPyramid, x: torch.Tensor) -> list[torch.Tensor]:
    """The input of each stage (the previous stage's map), detached."""
    inputs = []
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        for stage in model.stages:
            inputs.append(x.detach().clone())
            x, _ = stage(x)
    return inputs


def _run_stage(stage, norm, x, weights, bfloat16: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The stage's output for ``x`` and its parameters' gradients for the output gradient ``weights``."""
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bfloat16):
        out, _ = stage(x, None, norm)
    grads = torch.autograd.grad((out.to(weights.dtype) * weights).sum(), list(stage.parameters()))
    return out.detach(), grads


def test_each_stage_traces_whole_forward_and_backward_with_the_eager_results(monkeypatch):
    from soft_mm.ops.triton_route import interpreted_triton_route

    monkeypatch.setenv('TRITON_INTERPRET', '1')
    model = _pyramid(drop_path_rate=0.0)
    inputs = _stage_inputs(model, torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1)))
    for i, (stage, x) in enumerate(zip(model.stages, inputs)):
        norm = model.norm if i == len(model.stages) - 1 else None
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
            shape = stage(x, None, norm)[0].shape
        weights = torch.randn(shape, generator=torch.Generator().manual_seed(i))
        # each bfloat16 run measured against float64: plain PyTorch's (the CPU route: the fused kernels' reference
        # forms under autocast, which the graph takes too), the eager GPU route's (Triton kernels interpreted) and
        # the graph's on the GPU route, which may be at most twice the larger of the first two (seen: 1.14 times, AMD
        # EPYC; the fused kernels' LayerNorm gradients are 3-6 times more exact than plain PyTorch's)
        reference = copy.deepcopy(stage).double()
        exact = _run_stage(reference, copy.deepcopy(norm).double() if norm else None, x.double(), weights.double(),
                           bfloat16=False)
        plain = _run_stage(stage, norm, x, weights, bfloat16=True)
        with interpreted_triton_route():
            eager = _run_stage(stage, norm, x, weights, bfloat16=True)
            graphed = _run_stage(torch.compile(stage, fullgraph=True, backend='aot_eager'), norm, x, weights,
                                 bfloat16=True)
        names = ['output'] + [name for name, _ in stage.named_parameters()]
        for name, ref, *runs in zip(names, [exact[0], *exact[1]], *([r[0], *r[1]] for r in (plain, eager, graphed))):
            # (not the biases of the convs before a training-mode BatchNorm: their gradient is zero in exact
            # arithmetic, the norm taking the mean out, and rounding noise in every run)
            if not (name.startswith('downsample') and name.endswith('conv.bias')):
                plain_error, eager_error, graphed_error = (relative_error(r, ref) for r in runs)
                assert graphed_error <= 2 * max(plain_error, eager_error) + 1e-3, (
                    f'stage {i + 1}', name, plain_error, eager_error, graphed_error)
        torch._dynamo.reset()


class _NoSync(TorchDispatchMode):
    """Raises on every operator that makes the host wait for the device: a tensor's value read (``.item()``,
    ``bool()``, ``.tolist()``), a data-dependent shape (``nonzero``, a mask's ``masked_select``, ``unique``)."""

    observes_only = True  # (the package's eager paths stay on under it: only watching)
    FORBIDDEN = frozenset({'_local_scalar_dense', 'nonzero', 'masked_select', '_unique2', 'unique_consecutive',
                           'unique_dim', 'equal', 'is_nonzero', 'allclose'})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.FORBIDDEN:
            raise AssertionError(f'a host synchronisation: aten.{func.overloadpacket.__name__}')
        return func(*args, **(kwargs or {}))


def test_a_training_step_makes_no_host_synchronisation(gpu_route, monkeypatch):
    def no_python_random(*args, **kwargs):
        raise AssertionError('Python or numpy random numbers in the step (not replayed by a CUDA graph)')

    for name in ('random', 'randint', 'uniform', 'choice', 'shuffle', 'gauss'):
        monkeypatch.setattr(random, name, no_python_random)
    for name in ('rand', 'randn', 'randint', 'random', 'uniform', 'choice', 'binomial'):
        monkeypatch.setattr(numpy.random, name, no_python_random)
    model = _pyramid(drop_path_rate=0.2)  # stochastic depth on: its masks drawn as tensor operations
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with _NoSync():
        for _ in range(2):  # the first step makes the caches (plans, pooling matrices) the second one reads
            with torch.autocast('cpu', dtype=torch.bfloat16):
                maps, _ = model.forward_pyramid(x)
            torch.autograd.backward([m.float().mean() for m in maps])
            model.zero_grad(set_to_none=True)
    # the check itself sees a synchronisation
    with pytest.raises(AssertionError, match=r'a host synchronisation: aten\._local_scalar_dense'), _NoSync():
        maps[0].sum().item()


def test_a_stage_whose_compile_fails_runs_eagerly_with_one_warning():
    calls = []

    def failing_backend(graph_module, example_inputs):
        calls.append(1)
        raise RuntimeError('capture failed: a stand-in for a CUDA graph that could not be recorded')

    torch.manual_seed(0)
    eager = SOFT(ARCH, soft_norm=True, drop_path_rate=0.0)
    eager.init_weights()
    eager.eval()
    compiled = SOFT(ARCH, soft_norm=True, drop_path_rate=0.0, compile_stages=dict(backend=failing_backend)).eval()
    compiled.load_state_dict(eager.state_dict())
    x = torch.randn(1, 3, 64, 64)
    with pytest.warns(CompileStagesFallbackWarning) as record, torch.no_grad():
        maps = compiled(x)
    assert len(record) == 4 and 'compile_stages: stage 1 runs eagerly from now on' in str(record[0].message)
    with torch.no_grad():
        for a, b in zip(maps, eager(x)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    tried = len(calls)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with torch.no_grad():
            compiled(x)  # eager from now on: no new compile, no new warning
    assert len(calls) == tried
    torch._dynamo.reset()
