"""soft_mm.ops.soft.kernel_health: the landmark kernel's conditioning, effective rank and Newton convergence, against
hand-built kernels of known spectrum and independent float64 references."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from soft_mm.ops import gaussian_kernel, newton_inverse
from soft_mm.ops.soft.kernel_health import landmark_kernel_health, newton_residuals


def test_coincident_landmarks_sit_at_the_ridge_ceiling():
    # every landmark equal: A = 1 1^T, eigenvalues (m, 0, ..., 0), so cond(A + rI) = (m + r) / r exactly
    m, ridge = 49, 0.01
    landmarks = torch.randn(1, 1, 1, 32, dtype=torch.float64).expand(2, 3, m, 32)
    health = landmark_kernel_health(landmarks, num_iters=20, ridge=ridge)
    assert health.num_landmarks == m
    torch.testing.assert_close(health.condition, torch.full((2, 3), (m + ridge) / ridge, dtype=torch.float64),
                               rtol=1e-9, atol=0)
    assert health.effective_rank.eq(1).all()
    # 20 iterations leave the 48 ridge-sized directions half-inverted: 1 - (1 - alpha r^2)^(2^20) with
    # alpha = 1.8 / m^2 ~ 7.5e-8 gives 1 - exp(-0.079) = 0.076 of each, so the residual is sqrt(48 / 49) * 0.924
    expected = np.sqrt(48 / 49) * (1 - 1.8 * ridge ** 2 / m ** 2) ** (2 ** 20)
    torch.testing.assert_close(health.residual, torch.full((2, 3), expected, dtype=torch.float64), rtol=1e-6, atol=0)


def test_orthogonal_landmarks_are_inverted_exactly():
    # landmarks 10 e_i: pairwise squared distance 200, so A = I up to exp(-100); the inverse of (1 + r) I is reached
    # to rounding within a few iterations
    landmarks = 10.0 * torch.eye(32, dtype=torch.float64)[:16].expand(2, 16, 32)
    health = landmark_kernel_health(landmarks, num_iters=20, ridge=0.01)
    torch.testing.assert_close(health.condition, torch.ones(2, dtype=torch.float64), rtol=1e-12, atol=0)
    assert health.effective_rank.eq(16).all()
    assert health.residual.max() < 1e-14
    assert health.iters_to_target.le(8).all()


def test_figures_match_numpy_on_random_landmarks():
    gen = torch.Generator().manual_seed(0)
    landmarks = 0.4 * torch.randn(3, 20, 8, generator=gen, dtype=torch.float64)
    ridge = 1e-3
    health = landmark_kernel_health(landmarks, num_iters=20, ridge=ridge)
    for i in range(3):
        lm = landmarks[i].numpy()
        dist2 = ((lm[:, None, :] - lm[None, :, :]) ** 2).sum(-1)
        kernel = np.exp(-0.5 * dist2)
        assert float(health.condition[i]) == pytest.approx(np.linalg.cond(kernel + ridge * np.eye(20)), rel=1e-7)
        eigenvalues = np.linalg.eigvalsh(kernel)
        assert int(health.effective_rank[i]) == int((eigenvalues > ridge).sum())


def test_residuals_follow_newton_inverse_iteration_by_iteration():
    gen = torch.Generator().manual_seed(1)
    landmarks = 0.3 * torch.randn(4, 12, 8, generator=gen, dtype=torch.float64)
    kernel = gaussian_kernel(landmarks, landmarks)
    ridge = 0.01
    residuals = newton_residuals(kernel, 30, ridge)
    eye = torch.eye(12, dtype=torch.float64)
    for k in (0, 1, 5, 20, 30):
        inverse = newton_inverse(kernel, num_iters=k, ridge=ridge)
        expected = torch.linalg.matrix_norm((kernel + ridge * eye) @ inverse - eye) / 12 ** 0.5
        torch.testing.assert_close(residuals[k], expected, rtol=1e-10, atol=1e-14)
    health = landmark_kernel_health(landmarks, num_iters=20, ridge=ridge, target_residual=1e-6, max_iters=60)
    for i in range(4):
        needed = int(health.iters_to_target[i])
        assert residuals[needed, i] <= 1e-6 < residuals[needed - 1, i]


def test_unreachable_target_reports_minus_one():
    # unridged coincident landmarks: P is singular, so P X - I never vanishes
    landmarks = torch.zeros(1, 6, 4, dtype=torch.float64)
    health = landmark_kernel_health(landmarks, num_iters=20, ridge=0.0, max_iters=40)
    assert health.condition.isinf().all()
    assert health.iters_to_target.eq(-1).all()


def test_low_precision_landmarks_are_measured_in_float64():
    landmarks = 0.3 * torch.randn(2, 10, 8, generator=torch.Generator().manual_seed(2))
    low = landmark_kernel_health(landmarks.to(torch.bfloat16))
    assert low.condition.dtype == torch.float64
    reference = landmark_kernel_health(landmarks.to(torch.bfloat16).to(torch.float64))
    torch.testing.assert_close(low.condition, reference.condition, rtol=0, atol=0)


@pytest.mark.parametrize(('kwargs', 'message'), [
    ({'num_iters': -1}, 'num_iters must be an int >= 0'),
    ({'max_iters': 0}, 'max_iters must be an int >= 1'),
    ({'ridge': -0.1}, 'ridge must be a finite float >= 0'),
    ({'target_residual': 0.0}, 'target_residual must be a float > 0'),
])
def test_bad_arguments_name_themselves(kwargs, message):
    with pytest.raises(ValueError, match=message):
        landmark_kernel_health(torch.zeros(1, 4, 8), **kwargs)


def test_bad_landmarks_are_refused():
    with pytest.raises(TypeError, match=r'landmarks must be a floating-point tensor of shape \(\.\.\., m, d\)'):
        landmark_kernel_health(torch.zeros(4, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match='at least one landmark'):
        landmark_kernel_health(torch.zeros(2, 0, 8))
