"""The precision switches of soft_mm.ops.precision: the SOFT op runs its float32 GEMMs in IEEE float32, forward and
backward, whatever a training script set globally (``allow_tf32``, ``set_float32_matmul_precision('high')``), and
leaves that setting as it found it. The setting is readable on CPU, so the GEMMs' view of it is recorded here with a
dispatch mode; on a GPU the same switch decides whether cuBLAS rounds to TF32."""
from __future__ import annotations

import pytest
import torch
from helpers.op_checks import triton_kernels
from torch.utils._python_dispatch import TorchDispatchMode

from soft_mm.ops import newton_inverse, soft_attention
from soft_mm.ops.compat import float32_precision_switches
from soft_mm.ops.precision import float32_matmul_precision, float32_matmul_settings, ieee_matmul

aten = torch.ops.aten
GEMMS = (aten.mm, aten.bmm, aten.addmm, aten.baddbmm, aten.matmul)  # matmul: below autograd, in a custom op
# torch >= 2.9: one switch per backend; older torch: the one process-wide float32_matmul_precision
IEEE = {'cuda': 'ieee', 'mkldnn': 'ieee'} if float32_precision_switches() else {'legacy': 'highest'}
TF32 = {'cuda': 'tf32'} if float32_precision_switches() else {'legacy': 'high'}


class GemmSettings(TorchDispatchMode):
    """Records :func:`float32_matmul_settings` at every float32 GEMM that runs under it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == 'soft_mm':  # a custom op: record the GEMMs inside its kernel too
            with self:
                return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **kwargs)
        if func.overloadpacket in GEMMS and any(isinstance(a, torch.Tensor) and a.dtype == torch.float32
                                                for a in args):
            self.seen.append(float32_matmul_settings())
        return func(*args, **kwargs)


@pytest.fixture
def restore_settings():
    """Whatever a test sets globally is set back (the switches as they were, through the API that reads them)."""
    with float32_matmul_precision('ieee'):
        yield


def set_tf32(api: str) -> None:
    if api == 'legacy allow_tf32':
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        torch.set_float32_matmul_precision('high')


@pytest.mark.parametrize('api', ['legacy allow_tf32', "set_float32_matmul_precision('high')"])
@pytest.mark.parametrize('backend', ['reference', 'tiled', pytest.param('triton', marks=triton_kernels)])
def test_the_op_runs_every_float32_gemm_in_ieee_and_restores_the_callers_setting(restore_settings, monkeypatch, api,
                                                                                 backend):
    if backend == 'triton':
        monkeypatch.setenv('TRITON_INTERPRET', '1')
    gen = torch.Generator().manual_seed(0)
    q = (0.4 * torch.randn(1, 2, 40, 8, generator=gen)).requires_grad_()
    landmarks = (0.4 * torch.randn(1, 2, 5, 8, generator=gen)).requires_grad_()
    v = torch.randn(1, 2, 40, 8, generator=gen).requires_grad_()
    set_tf32(api)
    before = float32_matmul_settings()
    assert before.items() >= TF32.items()
    recorder = GemmSettings()
    with recorder:
        plain = q[0, 0] @ v[0, 0].T  # the caller's own GEMM: TF32 as set
        out = soft_attention(q, landmarks, v, soft_norm=True, ridge=0.01, backend=backend, tile_size=16)
        assert float32_matmul_settings() == before  # between the forward and the backward: the caller's setting
        torch.autograd.backward(out, torch.randn(out.shape, generator=gen))
    del plain
    assert recorder.seen[0].items() >= TF32.items()
    op_gemms = recorder.seen[1:]
    # forward and backward: 40 Newton-Schulz products, the kernels' exponents, the products (backend-dependent); on
    # the Triton backend every product, the m×m part and its backward included, runs inside its kernels (IEEE float32
    # dots, no tensor-core instruction: test_triton_cubins.py): no torch GEMM is left
    if backend == 'triton':
        assert op_gemms == [], len(op_gemms)
    else:
        assert len(op_gemms) >= 45, len(op_gemms)
    assert all(seen == IEEE for seen in op_gemms), [seen for seen in op_gemms if seen != IEEE][:3]
    assert float32_matmul_settings() == before
    if api == 'legacy allow_tf32':  # still readable through the API that set it
        assert torch.backends.cuda.matmul.allow_tf32 is True
    else:
        assert torch.get_float32_matmul_precision() == 'high'


def test_the_unrolled_inverse_keeps_its_backward_in_ieee(restore_settings):
    torch.set_float32_matmul_precision('high')
    points = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(1))
    kernel = torch.exp(-0.5 * torch.cdist(points, points).square()).requires_grad_()
    recorder = GemmSettings()
    with recorder:
        newton_inverse(kernel, 20, 0.01, backward='unrolled').sum().backward()
    assert len(recorder.seen) >= 80 and all(seen == IEEE for seen in recorder.seen)  # 40 forward, 80 backward
    assert torch.get_float32_matmul_precision() == 'high'


def test_ieee_matmul_has_the_gradients_and_second_derivatives_of_the_plain_product():
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(3, 1, 4, 5, generator=gen, dtype=torch.float64)  # broadcast over the second dim
    b = torch.randn(3, 2, 5, 6, generator=gen, dtype=torch.float64)
    # float64 takes the plain product; the autograd Function is checked in float32 against it below
    torch.autograd.gradcheck(lambda x, y: ieee_matmul(x.float(), y.float()).double(),
                             (a.requires_grad_(), b.requires_grad_()), eps=1e-2, atol=1e-2, rtol=1e-3)
    results = []
    for matmul in (ieee_matmul, torch.matmul):
        x, y = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()
        grad_x, grad_y = torch.autograd.grad(matmul(x, y).square().sum(), (x, y), create_graph=True)
        results.append((grad_x, grad_y, *torch.autograd.grad((grad_x.sum() + grad_y.square().sum()), (x, y))))
    for ours, plain in zip(*results):
        torch.testing.assert_close(ours, plain, rtol=1e-6, atol=1e-6)


def test_bad_value_is_named():
    with pytest.raises(ValueError, match=r"value must be one of \('ieee', 'tf32'\), got 'fp16'"):
        float32_matmul_precision('fp16')
