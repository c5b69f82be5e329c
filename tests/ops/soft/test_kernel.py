"""Tests of soft_mm.ops.gaussian_kernel against a brute-force float64 reference."""
import pytest
import torch

from soft_mm.ops import gaussian_kernel


def brute_force_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    diff = x.double()[..., :, None, :] - y.double()[..., None, :, :]
    return torch.exp(-0.5 * diff.pow(2).sum(-1))


def test_matches_brute_force_float64():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    y = torch.randn(9, 5, generator=gen, dtype=torch.float64)
    out = gaussian_kernel(x, y)
    assert out.shape == (7, 9) and out.dtype == torch.float64
    torch.testing.assert_close(out, brute_force_kernel(x, y), rtol=0, atol=1e-13)


def test_float32_close_to_float64_reference():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 16, 8, generator=gen)
    y = torch.randn(3, 12, 8, generator=gen)
    out = gaussian_kernel(x, y)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), brute_force_kernel(x, y), rtol=0, atol=1e-5)


def test_values_in_unit_interval_and_self_kernel_is_one():
    # Large, nearly identical points: the expanded form of the distance cancels catastrophically and goes negative
    # somewhere, so only the clamp keeps exp(-0.5 dist^2) <= 1.
    gen = torch.Generator().manual_seed(2)
    x = 30.0 + torch.randn(64, 16, generator=gen)
    y = torch.cat([x[:32], x[:32] + 1e-3 * torch.randn(32, 16, generator=gen)])
    raw_dist_sq = x.pow(2).sum(-1)[:, None] + y.pow(2).sum(-1)[None] - 2 * x @ y.T
    assert (raw_dist_sq < 0).any(), 'test data must exercise the clamp'
    out = gaussian_kernel(x, y)
    assert out.min() >= 0 and out.max() <= 1
    self_kernel = gaussian_kernel(x, x)
    assert self_kernel.max() <= 1
    diagonal = self_kernel.diagonal()
    assert diagonal.min() > 1 - 1e-2  # rounding of |x|^2 ~ 1.4e4 in float32
    exact = gaussian_kernel(x.double(), x.double()).diagonal()
    torch.testing.assert_close(exact, torch.ones_like(exact), rtol=0, atol=1e-10)


def test_far_points_underflow_to_zero_not_nan():
    x = torch.tensor([[0.0, 0.0], [1e3, 0.0]])
    out = gaussian_kernel(x, x)
    assert torch.equal(out, torch.eye(2))


def test_broadcasts_over_leading_dims():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 1, 5, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(1, 4, 6, 3, generator=gen, dtype=torch.float64)
    out = gaussian_kernel(x, y)
    assert out.shape == (2, 4, 5, 6)
    for i in range(2):
        for j in range(4):
            torch.testing.assert_close(out[i, j], brute_force_kernel(x[i, 0], y[0, j]), rtol=0, atol=1e-13)


def test_gradient_matches_brute_force():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randn(5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((gaussian_kernel(x, y) * weights).sum(), (x, y))
    ref_grads = torch.autograd.grad((brute_force_kernel(x, y) * weights).sum(), (x, y))
    for grad, ref in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref, rtol=0, atol=1e-12)


def test_autocast_bfloat16_stays_in_unit_interval():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(32, 8, generator=gen)
    with torch.autocast(device_type='cpu', dtype=torch.bfloat16):
        out = gaussian_kernel(x, x)
    assert torch.isfinite(out).all() and out.min() >= 0 and out.max() <= 1
    torch.testing.assert_close(out.double(), brute_force_kernel(x, x), rtol=0, atol=5e-2)


@pytest.mark.parametrize('x_shape, y_shape, match', [
    ((5,), (4, 5), 'x must have shape'),
    ((4, 5), (5,), 'y must have shape'),
    ((3, 4), (3, 5), 'last'),
    ((2, 3, 4), (2, 3, 6), 'last'),
])
def test_bad_shapes_raise(x_shape, y_shape, match):
    with pytest.raises(ValueError, match=match):
        gaussian_kernel(torch.zeros(x_shape), torch.zeros(y_shape))


def test_non_tensor_raises():
    with pytest.raises(TypeError, match=r'x must be a torch.Tensor'):
        gaussian_kernel([[0.0]], torch.zeros(1, 1))
