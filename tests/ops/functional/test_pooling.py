"""soft_mm.ops.functional.pooling: both matmul forms of adaptive average pooling equal ``F.adaptive_avg_pool2d`` in
float64, forward and backward, at sizes whose bins overlap (33 -> 7, 47 -> 7, 200 -> 56, 334 -> 56), stay single inputs
(12 -> 12) or share inputs while upsampling (10 -> 12)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from soft_mm.ops.functional.pooling import _pool_matrix, adaptive_avg_pool2d_matmul, adaptive_avg_pool_tokens

# (input H, W) -> output (h, w): overlapping bins, identity rows with upsampled columns, a stage-1 detection map
CASES = [((33, 47), (7, 7)), ((12, 10), (12, 12)), ((200, 334), (56, 56))]
# float64: measured max |difference| <= 3.4e-16 (outputs and input gradients, all three cases); a wrong bin is off
# by ~0.1-2 (bins ending at the floor instead of the ceiling: 0.31, 2.2, 0.58), so 1e-12 leaves room both ways
TOL = 1e-12


def _map(size: tuple[int, int], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, *size, generator=gen, dtype=torch.float64)


def _forward_and_input_grad(pool, x: torch.Tensor, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = x.clone().requires_grad_()
    out = pool(leaf)
    (grad,) = torch.autograd.grad(out, leaf, grad_out)
    return out.detach(), grad


@pytest.mark.parametrize('in_size, out_size', CASES)
def test_matmul_path_equals_torch(in_size, out_size):
    x = _map(in_size)
    grad_out = torch.randn(2, 3, *out_size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out, grad = _forward_and_input_grad(lambda t: adaptive_avg_pool2d_matmul(t, out_size), x, grad_out)
    ref, ref_grad = _forward_and_input_grad(lambda t: F.adaptive_avg_pool2d(t, out_size), x, grad_out)
    assert out.shape == ref.shape == (2, 3, *out_size)
    torch.testing.assert_close(out, ref, rtol=0, atol=TOL)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=TOL)


@pytest.mark.parametrize('in_size, out_size', CASES)
def test_token_path_equals_torch(in_size, out_size):
    """The (B, H, W, C) form on a channels-last view of the NCHW map (as the attention layer passes it)."""
    x = _map(in_size)
    grad_out = torch.randn(2, *out_size, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def tokens(t: torch.Tensor) -> torch.Tensor:
        return adaptive_avg_pool_tokens(t.permute(0, 2, 3, 1), out_size)

    def reference(t: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(t, out_size).permute(0, 2, 3, 1)

    out, grad = _forward_and_input_grad(tokens, x, grad_out)
    ref, ref_grad = _forward_and_input_grad(reference, x, grad_out)
    assert out.shape == ref.shape == (2, *out_size, 3)
    torch.testing.assert_close(out, ref, rtol=0, atol=TOL)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=TOL)


@pytest.mark.parametrize('in_size, out_size, bins', [
    (7, 3, [(0, 3), (2, 5), (4, 7)]),  # overlapping: floor(i * 7 / 3) .. ceil((i + 1) * 7 / 3)
    (3, 5, [(0, 1), (0, 2), (1, 2), (1, 3), (2, 3)]),  # upsampling: each input feeds one or two outputs
])
def test_pool_matrix_rows_average_pytorchs_bins(in_size, out_size, bins):
    matrix = _pool_matrix(in_size, out_size, torch.zeros((), dtype=torch.float64))
    expected = torch.zeros(out_size, in_size, dtype=torch.float64)
    for row, (start, end) in enumerate(bins):
        expected[row, start:end] = 1 / (end - start)
    torch.testing.assert_close(matrix, expected, rtol=0, atol=0)


def test_eager_pooling_builds_each_matrix_once_and_tracing_builds_its_own():
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils.flop_counter import FlopCounterMode

    from soft_mm.ops.functional.pooling import _cached_pool_matrix, _eager_pool_matrix
    like = torch.zeros(3, dtype=torch.float64)
    first = _eager_pool_matrix(200, 56, like)
    assert _eager_pool_matrix(200, 56, like) is first  # one tensor per (size, device, dtype): no kernels per call
    torch.testing.assert_close(first, _pool_matrix(200, 56, like), rtol=0, atol=0)
    assert _eager_pool_matrix(200, 56, like.float()).dtype == torch.float32
    # under a dispatch mode (a counter here; fake tensors alike) the matrix is built in the mode, never from the cache
    with FlopCounterMode(display=False):
        assert _eager_pool_matrix(200, 56, like) is not first
    hits = _cached_pool_matrix.cache_info().hits
    traced = make_fx(lambda t: adaptive_avg_pool_tokens(t, (7, 7)))(torch.zeros(1, 33, 47, 2, dtype=torch.float64))
    assert _cached_pool_matrix.cache_info().hits == hits
    assert any('arange' in str(node.target) for node in traced.graph.nodes)  # the graph builds its bins itself


def test_a_matrix_first_built_under_inference_mode_serves_training():
    """The cache outlives the call that filled it: a tensor made under ``torch.inference_mode`` could not be saved for
    a later backward, so the cached one is an ordinary tensor."""
    with torch.inference_mode():
        adaptive_avg_pool_tokens(torch.randn(1, 37, 41, 2, dtype=torch.float64), (5, 5))
    x = _map((37, 41)).requires_grad_()
    adaptive_avg_pool_tokens(x.permute(0, 2, 3, 1), (5, 5)).sum().backward()
    ref = x.detach().clone().requires_grad_()
    F.adaptive_avg_pool2d(ref, (5, 5)).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad, rtol=0, atol=TOL)
