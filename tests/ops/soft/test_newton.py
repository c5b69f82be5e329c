"""Tests of soft_mm.ops.newton_inverse (forward) against torch.linalg.pinv / inv in float64."""
import math

import pytest
import torch

from soft_mm.ops import exact_inverse, gaussian_kernel, newton_inverse
from soft_mm.testing import relative_error


def separated_kernel(m: int, seed: int = 0) -> torch.Tensor:
    """Gaussian kernel of m points at least ~2 apart: SPD with condition number < 3."""
    gen = torch.Generator().manual_seed(seed)
    points = torch.arange(m, dtype=torch.float64)[:, None] * torch.tensor([2.0, 0.0, 0.0])
    points = points + 0.3 * torch.randn(m, 3, generator=gen, dtype=torch.float64)
    return gaussian_kernel(points, points)


def spd_with_condition(m: int, cond: float, seed: int = 0) -> torch.Tensor:
    """Random SPD matrix with eigenvalues log-spaced in [1 / cond, 1]."""
    gen = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=torch.float64))
    eigenvalues = torch.logspace(0, -math.log10(cond), m, dtype=torch.float64)
    return basis @ torch.diag(eigenvalues) @ basis.T


def duplicated_landmark_kernel(jitter: float) -> torch.Tensor:
    """Kernel of 8 random points plus copies of the first 4 (offset by `jitter`): PSD of rank 8, size 12."""
    gen = torch.Generator().manual_seed(3)
    points = 1.5 * torch.randn(8, 8, generator=gen, dtype=torch.float64)
    copies = points[:4] + jitter * torch.randn(4, 8, generator=gen, dtype=torch.float64)
    points = torch.cat([points, copies])
    return gaussian_kernel(points, points)


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def test_well_conditioned_matches_pinv_after_20_iterations():
    batch = torch.stack([separated_kernel(16, seed=0), separated_kernel(16, seed=1), spd_with_condition(16, 10.0)])
    out = newton_inverse(batch)
    assert out.shape == batch.shape and out.dtype == torch.float64
    assert max_error(out, torch.linalg.pinv(batch)) < 1e-8


def test_initial_iterate_uses_per_matrix_alpha_before_ridge():
    mat = separated_kernel(6)
    # For a symmetric positive matrix alpha is the authors' 0.9 * 2 / max_row_sum^2.
    authors_alpha = 0.9 * 2 / mat.sum(-1).max() ** 2
    torch.testing.assert_close(newton_inverse(mat, num_iters=0), authors_alpha * mat, rtol=1e-14, atol=0)
    ridged = newton_inverse(mat, num_iters=0, ridge=0.01)
    torch.testing.assert_close(ridged, authors_alpha * (mat + 0.01 * torch.eye(6, dtype=mat.dtype)), rtol=1e-14, atol=0)
    # Non-symmetric: alpha = 1.8 / (||mat||_1 ||mat||_inf) and V_0 = alpha * mat^T.
    gen = torch.Generator().manual_seed(0)
    general = torch.randn(5, 5, generator=gen, dtype=torch.float64)
    alpha = 1.8 / (torch.linalg.matrix_norm(general, 1) * torch.linalg.matrix_norm(general, float('inf')))
    torch.testing.assert_close(newton_inverse(general, num_iters=0), alpha * general.T, rtol=1e-14, atol=0)


def test_converges_for_non_symmetric_matrices():
    gen = torch.Generator().manual_seed(1)
    general = torch.eye(8, dtype=torch.float64) * 3 + torch.randn(8, 8, generator=gen, dtype=torch.float64)
    assert torch.linalg.cond(general) < 20
    assert max_error(newton_inverse(general, num_iters=30), torch.linalg.inv(general)) < 1e-10


def test_truncated_iteration_is_a_spectral_filter():
    # For symmetric A, V_k = A^-1 (I - (I - alpha A^2)^(2^k)): directions with alpha * lambda^2 << 2^-k are not yet
    # inverted, i.e. too few iterations give a truncated (regularised) pseudo-inverse, not garbage.
    mat = spd_with_condition(12, 1e6)
    num_iters = 20
    alpha = 1.8 / mat.abs().sum(-1).max() ** 2
    eigenvalues, basis = torch.linalg.eigh(mat)
    response = -torch.expm1(2 ** num_iters * torch.log1p(-alpha * eigenvalues ** 2)) / eigenvalues
    expected = basis @ torch.diag(response) @ basis.T
    assert relative_error(newton_inverse(mat, num_iters), expected) < 1e-9
    assert relative_error(expected, torch.linalg.inv(mat)) > 0.9  # far from the exact inverse


@pytest.mark.parametrize('cond, not_yet, converged', [(1e4, 25, 40), (1e6, 35, 55), (1e7, 40, 60)])
def test_ill_conditioned_needs_about_two_log2_cond_iterations(cond, not_yet, converged):
    # Observed first iteration with relative error < 1e-6: 32 (cond 1e4), 45 (1e6), 52 (1e7), i.e. ~2 log2(cond) + 6.
    mat = spd_with_condition(16, cond)
    inverse = torch.linalg.inv(mat)
    assert relative_error(newton_inverse(mat, num_iters=20), inverse) > 0.5
    assert relative_error(newton_inverse(mat, num_iters=not_yet), inverse) > 0.1
    assert relative_error(newton_inverse(mat, num_iters=converged), inverse) < 1e-8


def test_exactly_duplicated_landmarks_match_pinv_at_any_iteration_count():
    mat = duplicated_landmark_kernel(jitter=0.0)
    assert torch.linalg.matrix_rank(mat) == 8
    pinv = torch.linalg.pinv(mat)
    assert max_error(newton_inverse(mat), pinv) < 1e-12  # observed 5e-15
    # Exact duplicates keep their rows and columns bit-identical through every iteration, so the null space carries
    # no rounding noise at all and even 200 iterations stay at the pinv (observed 5e-15).
    assert max_error(newton_inverse(mat, num_iters=200), pinv) < 1e-12


def test_near_duplicated_landmarks_blow_up_without_ridge_and_stay_bounded_with_it():
    mat = duplicated_landmark_kernel(jitter=1e-9)  # numerically of rank 8: 4 eigenvalues at rounding level
    pinv = torch.linalg.pinv(mat)
    eye = torch.eye(12, dtype=mat.dtype)
    # Default 20 iterations: the rounding noise in the null space has grown only ~2^20-fold (observed error 8e-10).
    assert max_error(newton_inverse(mat), pinv) < 1e-8
    # 200 iterations, no ridge: the noise doubles every iteration until it is inverted (observed 2e14 at 100, NaN at
    # 200 iterations).
    blown_up = newton_inverse(mat, num_iters=200)
    assert not torch.isfinite(blown_up).all() or max_error(blown_up, pinv) > 1e3
    # With a ridge the matrix is positive definite: 200 iterations converge to (A + ridge I)^-1, whose entries are
    # bounded by 1 / ridge (observed errors 1e-10 for ridge 1e-3 and 1e-12 for ridge 1e-2).
    for ridge in (1e-3, 1e-2):
        out = newton_inverse(mat, num_iters=200, ridge=ridge)
        assert torch.isfinite(out).all()
        assert out.abs().max() <= 1 / ridge
        assert max_error(out, torch.linalg.inv(mat + ridge * eye)) < 1e-6 * (1 / ridge)


def test_ridge_is_applied():
    mat = separated_kernel(10)
    eye = torch.eye(10, dtype=mat.dtype)
    out = newton_inverse(mat, ridge=0.05)
    assert max_error(out, torch.linalg.inv(mat + 0.05 * eye)) < 1e-10
    assert max_error(out, torch.linalg.inv(mat)) > 1e-2
    torch.testing.assert_close(exact_inverse(mat, ridge=0.05), torch.linalg.inv(mat + 0.05 * eye))


def test_ridge_beyond_the_safe_bound_still_converges():
    # ridge = 1 > 0.05 * sqrt(||mat||_1 ||mat||_inf) ~ 0.05: alpha is shrunk so the iteration cannot diverge.
    mat = 0.01 * separated_kernel(6)
    out = newton_inverse(mat, num_iters=30, ridge=1.0)
    assert max_error(out, torch.linalg.inv(mat + torch.eye(6, dtype=mat.dtype))) < 1e-12


def test_zero_matrix_gives_finite_result():
    zeros = torch.zeros(2, 4, 4)
    assert torch.equal(newton_inverse(zeros), zeros)
    torch.testing.assert_close(newton_inverse(zeros, ridge=0.01), 100 * torch.eye(4).expand(2, 4, 4))


def test_batch_entries_are_independent_bitwise():
    batch = torch.stack([separated_kernel(8, seed=s) for s in range(4)]).float()
    changed = batch.clone()
    changed[2] = 50.0 * spd_with_condition(8, 100.0).float()
    out, out_changed = newton_inverse(batch), newton_inverse(changed)
    assert not torch.equal(out[2], out_changed[2])
    for i in (0, 1, 3):
        assert torch.equal(out[i], out_changed[i])


def test_alpha_is_per_matrix():
    mat = spd_with_condition(8, 10.0)
    pair = newton_inverse(torch.stack([mat, 100 * mat]))
    alone = newton_inverse(mat)
    torch.testing.assert_close(pair[0], alone, rtol=1e-13, atol=0)
    torch.testing.assert_close(pair[1], newton_inverse(100 * mat), rtol=1e-13, atol=0)
    torch.testing.assert_close(pair[1], alone / 100, rtol=1e-12, atol=0)


def test_broadcast_leading_dims_and_empty_matrices():
    batch = torch.stack([separated_kernel(5, seed=s) for s in range(6)]).reshape(2, 3, 5, 5)
    out = newton_inverse(batch)
    assert out.shape == (2, 3, 5, 5)
    assert max_error(out, torch.linalg.inv(batch)) < 1e-10
    assert newton_inverse(torch.zeros(3, 0, 0)).shape == (3, 0, 0)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision_input_returns_input_dtype(dtype):
    mat = separated_kernel(16).to(dtype)
    out = newton_inverse(mat)
    assert out.dtype == dtype and torch.isfinite(out).all()
    # The iteration ran in float32: the only error left is rounding the result to `dtype`.
    reference = torch.linalg.inv(mat.double())
    assert relative_error(out, reference) < 2 * torch.finfo(dtype).eps


def test_float32_and_float64_keep_their_dtype():
    mat = separated_kernel(8)
    assert newton_inverse(mat).dtype == torch.float64
    assert newton_inverse(mat.float()).dtype == torch.float32
    assert max_error(newton_inverse(mat.float()), torch.linalg.inv(mat)) < 1e-5


def test_autocast_is_disabled_inside():
    mat = separated_kernel(16).float()
    with torch.autocast(device_type='cpu', dtype=torch.bfloat16):
        out = newton_inverse(mat)
        out_bf16 = newton_inverse(mat.bfloat16())
    assert out.dtype == torch.float32 and torch.equal(out, newton_inverse(mat))
    assert out_bf16.dtype == torch.bfloat16 and torch.isfinite(out_bf16).all()


@pytest.mark.parametrize('kwargs, match', [
    ({'num_iters': -1}, 'num_iters'),
    ({'num_iters': 2.5}, 'num_iters'),
    ({'num_iters': True}, 'num_iters'),
    ({'ridge': -0.1}, 'ridge'),
    ({'ridge': float('nan')}, 'ridge'),
    ({'ridge': '0.1'}, 'ridge'),
    ({'backward': 'exact'}, "backward must be one of \\('implicit', 'unrolled'\\)"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        newton_inverse(torch.eye(3), **kwargs)


@pytest.mark.parametrize('shape', [(3,), (3, 4), (2, 4, 3)])
def test_non_square_raises(shape):
    with pytest.raises(ValueError, match='square'):
        newton_inverse(torch.zeros(shape))


def test_integer_matrix_raises():
    with pytest.raises(TypeError, match='floating-point'):
        newton_inverse(torch.eye(3, dtype=torch.int64))


# ---------------------------------------------------------------------------------------------- backward


def input_gradient(fn, mat: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    leaf = mat.clone().requires_grad_()
    (fn(leaf) * grad_out).sum().backward()
    return leaf.grad


def test_implicit_backward_passes_gradcheck():
    batch = torch.stack([separated_kernel(5, seed=0), spd_with_condition(5, 10.0)]).requires_grad_()
    assert torch.autograd.gradcheck(lambda mat: newton_inverse(mat, num_iters=60), (batch,))
    assert torch.autograd.gradcheck(lambda mat: newton_inverse(mat, num_iters=60, ridge=0.02), (batch,))


def test_unrolled_backward_is_the_exact_derivative_of_the_truncated_iteration():
    # A non-symmetric matrix, so that no two row or column sums tie (alpha's max is not differentiable at ties).
    gen = torch.Generator().manual_seed(1)
    mat = 3 * torch.eye(5, dtype=torch.float64) + torch.randn(5, 5, generator=gen, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda m: newton_inverse(m, num_iters=5, backward='unrolled'),
                                    (mat.requires_grad_(),))


@pytest.mark.parametrize('ridge', [0.0, 0.02])
def test_implicit_gradient_equals_exact_inverse_gradient(ridge):
    gen = torch.Generator().manual_seed(0)
    mat = spd_with_condition(8, 10.0)
    grad_out = torch.randn(8, 8, generator=gen, dtype=torch.float64)
    eye = torch.eye(8, dtype=mat.dtype)
    implicit = input_gradient(lambda m: newton_inverse(m, ridge=ridge), mat, grad_out)
    exact = input_gradient(lambda m: torch.linalg.inv(m + ridge * eye), mat, grad_out)
    assert max_error(implicit, exact) < 1e-9


def test_implicit_and_unrolled_gradients_agree_only_after_convergence():
    gen = torch.Generator().manual_seed(1)
    mat = spd_with_condition(6, 10.0)
    grad_out = torch.randn(6, 6, generator=gen, dtype=torch.float64)

    def gradient_gap(num_iters: int) -> float:
        implicit = input_gradient(lambda m: newton_inverse(m, num_iters), mat, grad_out)
        unrolled = input_gradient(lambda m: newton_inverse(m, num_iters, backward='unrolled'), mat, grad_out)
        return max_error(implicit, unrolled)

    assert gradient_gap(20) < 1e-9  # observed 3e-14 (gradient entries ~100)
    assert gradient_gap(10) > 1e-3  # observed 0.12
    assert gradient_gap(5) > 1.0  # observed 22


def test_implicit_backward_refuses_double_backward():
    mat = separated_kernel(4).requires_grad_()
    (grad,) = torch.autograd.grad(newton_inverse(mat).square().sum(), mat, create_graph=True)
    # the custom op's message (torch >= 2.4), or the autograd.Function's that stands in for it on older torch
    with pytest.raises(RuntimeError, match=r'newton_inverse_backward.* no autograd formula|differentiate twice'):
        grad.sum().backward()


def count_saved_tensors(backward: str) -> int:
    mat = separated_kernel(6).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        newton_inverse(mat, num_iters=20, backward=backward)
    return len(saved)


def test_implicit_backward_saves_one_matrix_unrolled_saves_every_iterate():
    assert count_saved_tensors('implicit') == 1
    assert count_saved_tensors('unrolled') >= 40  # two per matmul per iteration


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision_gradient_is_finite_in_input_dtype(dtype):
    mat = separated_kernel(8).to(dtype).requires_grad_()
    newton_inverse(mat).sum().backward()
    assert mat.grad.dtype == dtype and torch.isfinite(mat.grad).all()
    exact = input_gradient(torch.linalg.inv, mat.detach().double(), torch.ones(8, 8, dtype=torch.float64))
    assert relative_error(mat.grad, exact) < 4 * torch.finfo(dtype).eps
