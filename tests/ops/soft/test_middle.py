"""The m×m part of the SOFT op in one Triton kernel
(soft_mm.ops.soft.backends.triton.nystrom_launch.triton_nystrom_middle), run on CPU tensors under the Triton
interpreter: the landmark kernel, the Newton–Schulz iteration and SOFT-Norm's scaling against the PyTorch iteration and
float64, its backward, its place in the op, and the kernels one CUDA-path forward launches.
"""
from __future__ import annotations

import pytest
import torch
from helpers.kernel_launches import counted_launches, summary
from helpers.op_checks import check_custom_op, triton_kernels

from soft_mm.ops import soft_attention
from soft_mm.ops.soft.backends.triton.nystrom_launch import _middle_op, triton_nystrom_middle
from soft_mm.ops.soft.backends.triton.nystrom_reference import middle_reference

pytestmark = triton_kernels

# the most kernels one forward of the op may launch on the CUDA path (it launches 4, 5 or 6 with casts)
MAX_FORWARD_LAUNCHES = 6
# and one training step of the op, forward and backward (observed 9: the forward's 4, the backward's 5)
MAX_STEP_LAUNCHES = 12


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv('TRITON_INTERPRET', '1')


def landmarks_of(num_landmarks, head_dim=32, seed=0, spread=0.4):
    gen = torch.Generator().manual_seed(seed)
    return spread * torch.randn(2, 3, num_landmarks, head_dim, generator=gen, dtype=torch.float64)


def relative(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize('soft_norm', [True, False])
@pytest.mark.parametrize('num_landmarks, head_dim, ridge, num_iters', [
    (49, 32, 0.01, 20), (1, 32, 0.01, 20), (7, 5, 0.0, 20), (64, 64, 0.01, 20), (49, 32, 1.0, 20), (20, 16, 0.01, 0)])
def test_matches_the_pytorch_iteration_and_float64(num_landmarks, head_dim, ridge, num_iters, soft_norm):
    # m = d = 64: the largest tiles; ridge 1.0: beyond 0.05, where alpha's floor takes over; 0 iterations: the start
    landmarks = landmarks_of(num_landmarks, head_dim)
    exact = middle_reference(landmarks, num_iters, ridge, soft_norm)
    pytorch = middle_reference(landmarks.float(), num_iters, ridge, soft_norm)
    fused = triton_nystrom_middle(landmarks.float(), num_iters, ridge, soft_norm)
    assert fused.dtype == torch.float32 and fused.shape == (2, 3, num_landmarks, num_landmarks)
    # observed: the fused error 0.6-1.1 of the PyTorch float32 iteration's (7e-7 at m = 49); the two differ by their
    # summation order only
    assert relative(fused, exact) <= 3 * relative(pytorch, exact) + 1e-7
    # and from each other by less than 3e-6 or the float32 iteration's own error, whichever is larger (the summation
    # orders of numpy's and torch's matmuls: 2e-7..4e-7 with a ridge, 3.5e-6 at ridge 0, where that error is 7.2e-6)
    assert relative(fused, pytorch.double()) < max(3e-6, relative(pytorch, exact))


@pytest.mark.parametrize('soft_norm', [True, False])
@pytest.mark.parametrize('num_landmarks', [2, 49])
def test_landmark_gradient_is_the_implicit_backward_of_the_pytorch_path(num_landmarks, soft_norm):
    landmarks = landmarks_of(num_landmarks, seed=1)
    grad_out = torch.randn(2, 3, num_landmarks, num_landmarks, generator=torch.Generator().manual_seed(2),
                           dtype=torch.float64)
    exact_leaf = landmarks.clone().requires_grad_()
    exact, = torch.autograd.grad(middle_reference(exact_leaf, 20, 0.01, soft_norm), exact_leaf, grad_out)
    fused_leaf = landmarks.float().requires_grad_()
    fused, = torch.autograd.grad(triton_nystrom_middle(fused_leaf, 20, 0.01, soft_norm), fused_leaf, grad_out.float())
    assert relative(fused, exact) < 3e-5  # observed 1.4e-6..1.7e-6


def test_passes_opcheck():
    landmarks = landmarks_of(9, head_dim=8).float().requires_grad_()
    for soft_norm in (True, False):
        check_custom_op(_middle_op, (landmarks, 20, 0.01, soft_norm))


def test_refuses_sizes_above_its_tiles():
    with pytest.raises(ValueError, match=r'triton_nystrom_middle: m must be <= 64 and d <= 64 \(the kernel\'s shared '
                                         r'memory on an A100\), got m=65, d=8'):
        triton_nystrom_middle(torch.zeros(1, 1, 65, 8), 20, 0.0, False)


def op_inputs(num_tokens=300, num_landmarks=49, seed=3):
    gen = torch.Generator().manual_seed(seed)
    q = 0.42 * torch.randn(2, 2, num_tokens, 32, generator=gen)
    landmarks = q[:, :, :num_landmarks] + 0.05 * torch.randn(2, 2, num_landmarks, 32, generator=gen)
    v = torch.randn(2, 2, num_tokens, 32, generator=gen)
    return q, landmarks, v


@pytest.mark.parametrize('dtype, autocast', [(torch.float32, None), (torch.bfloat16, None),
                                             (torch.float32, torch.float16)])
def test_one_cuda_path_forward_launches_at_most_six_kernels(monkeypatch, dtype, autocast):
    # the Triton backend as on a GPU (forced here under the interpreter): 4 launches, 5 or 6 where casts are due (the
    # landmarks to float32, the output to bfloat16, or v to float16 under float16 autocast); the Newton–Schulz loop
    # alone, run as ATen matmuls, would be 40
    q, landmarks, v = (t.to(dtype) for t in op_inputs())
    with counted_launches(monkeypatch) as record, torch.autocast('cpu', dtype=autocast or torch.bfloat16,
                                                                 enabled=autocast is not None):
        soft_attention(q, landmarks, v, soft_norm=True, ridge=0.01, backend='triton')
    counts = summary(record)
    assert len(record) <= MAX_FORWARD_LAUNCHES, counts
    assert [r for r in record if r.startswith('triton.')] == ['triton.nystrom_middle_fwd_kernel_mid_inv',
                                                               'triton.nystrom_fwd_kernel_context',
                                                               'triton.nystrom_fwd_kernel_mc',
                                                               'triton.nystrom_fwd_kernel_o'], counts
    # no product left in torch: the Newton–Schulz iteration, the partial sums and middle @ (K1^T v) are kernels'
    assert not {'aten.matmul', 'aten.bmm', 'aten.mm', 'aten.sum'} & set(counts), counts


def test_one_cuda_path_training_step_of_the_op_launches_at_most_twelve_kernels(monkeypatch):
    q, landmarks, v = (t.requires_grad_() for t in op_inputs())
    with counted_launches(monkeypatch) as record:
        out = soft_attention(q, landmarks, v, soft_norm=True, ridge=0.01, backend='triton')
        torch.autograd.backward(out, torch.ones_like(out))
    counts = summary(record)
    assert len(record) <= MAX_STEP_LAUNCHES, counts
    backward = ['triton.nystrom_fwd_kernel_context', 'triton.nystrom_bwd_kernel_dmid_dctx',
                'triton.nystrom_bwd_kernel_dq_dv_dl', 'triton.nystrom_bwd_kernel_dl_sum',
                'triton.nystrom_middle_bwd_kernel_dl']
    assert [r for r in record if r.startswith('triton.')][4:] == backward, counts


def test_unrolled_backward_keeps_the_pytorch_iteration(monkeypatch):
    # backward='unrolled' differentiates the iterations themselves: the fused kernel (implicit backward) is not used
    q, landmarks, v = op_inputs(num_tokens=40, num_landmarks=5)
    with counted_launches(monkeypatch) as record:
        unrolled = soft_attention(q, landmarks, v, ridge=0.01, backward='unrolled', backend='triton')
    assert 'triton.nystrom_middle_fwd_kernel_mid_inv' not in record
    assert sum(record.count(f'aten.{mm}') for mm in ('mm', 'bmm', 'matmul')) >= 40  # the iteration in torch
    fused = soft_attention(q, landmarks, v, ridge=0.01, backend='triton')
    assert relative(fused, unrolled.double()) < 3e-6


def test_bad_newton_arguments_are_named_before_any_kernel():
    q, landmarks, v = op_inputs(num_tokens=20, num_landmarks=3)
    with pytest.raises(ValueError, match=r'soft_attention: num_iters must be an int >= 0, got -1'):
        soft_attention(q, landmarks, v, num_iters=-1, backend='triton')
    with pytest.raises(ValueError, match=r'soft_attention: ridge must be a finite float >= 0, got nan'):
        soft_attention(q, landmarks, v, ridge=float('nan'), backend='triton')
    with pytest.raises(ValueError, match=r"soft_attention: backward must be one of \('implicit', 'unrolled'\)"):
        soft_attention(q, landmarks, v, backward='exact', backend='triton')


def test_compiles_to_one_node_each_and_gives_the_eager_results():
    # torch.compile sees the m×m kernel and the products as one custom-op node each, and runs the same kernels
    from helpers.compile_recording import RecordingBackend
    q, landmarks, v = op_inputs(num_tokens=70, num_landmarks=9)
    grad_out = torch.randn(v.shape, generator=torch.Generator().manual_seed(5))

    def attention(q, landmarks, v):
        return soft_attention(q, landmarks, v, soft_norm=True, ridge=0.01, backend='triton')

    def outputs_and_grads(fn):
        leaves = [t.clone().requires_grad_() for t in (q, landmarks, v)]
        out = fn(*leaves)
        return (out.detach(), *torch.autograd.grad(out, leaves, grad_out))

    recorder = RecordingBackend()
    graph = outputs_and_grads(torch.compile(attention, backend=recorder, fullgraph=True))
    eager = outputs_and_grads(attention)
    targets = recorder.targets()
    assert targets.count(torch.ops.soft_mm.triton_nystrom_middle.default) == 1
    assert targets.count(torch.ops.soft_mm.triton_nystrom_products.default) == 1
    for a, b in zip(graph, eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
