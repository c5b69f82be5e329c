"""The landmark kernel's health, on landmarks alone (torch only): how well ``A = K(landmarks, landmarks)`` is
conditioned and how far ``num_iters`` Newton–Schulz iterations get in inverting ``A + ridge I``.

SOFT's attention ``K1 A^+ K1^T v`` is only as good as its m×m landmark kernel ``A``:

* when the landmarks nearly coincide under the kernel's bandwidth, ``A`` tends to the all-ones matrix (rank one,
  eigenvalues m, 0, ..., 0) and the whole Nyström term to a rank-one map: every token gets the same mixture of values;
  ``cond(A + ridge I)`` then sits at its ceiling ``(m + ridge) / ridge``;
* ``num_iters`` Newton–Schulz iterations invert ``A + ridge I`` only up to a condition number of about
  ``2^((num_iters - 6) / 2)`` (:func:`~soft_mm.ops.soft.newton.newton_inverse`): beyond it the residual
  ``||(A + ridge I) X - I||_F / sqrt(m)`` stays O(1), the forward uses a truncated inverse and the implicit backward
  differentiates an inverse the forward did not compute.

:func:`landmark_kernel_health` measures both for a batch of landmark sets, any caller's;
:func:`soft_mm.models.attention_health.attention_health` for every SOFT layer of a model.
"""
from __future__ import annotations

import dataclasses
import math
import numbers

import torch
from torch import Tensor

from .kernel import gaussian_kernel
from .newton import _check_ridge, newton_schulz_start, newton_schulz_step

__all__ = ['DEFAULT_MAX_ITERS', 'DEFAULT_TARGET_RESIDUAL', 'KernelHealth', 'landmark_kernel_health',
           'newton_residuals']

# A residual of 1e-3: the inverse is accurate to about 0.1% in every eigen-direction.
DEFAULT_TARGET_RESIDUAL = 1e-3
# Iterations tried when searching for the count that reaches the target (the ridge 0.01 needs about 30 on
# coincident landmarks; an unridged rank-deficient kernel never gets there).
DEFAULT_MAX_ITERS = 100


@dataclasses.dataclass
class KernelHealth:
    """Figures of ``A + ridge I`` for every landmark set of a batch; each field has the batch shape ``(...)``.

    Attributes:
        num_landmarks: m (the same for the whole batch; an int).
        condition: ``cond(A + ridge I) = (lambda_max + ridge) / (lambda_min + ridge)`` (inf for a singular unridged
            kernel).
        effective_rank: eigenvalues of ``A`` above ``max(ridge, m * eps * lambda_max)``: the directions the ridge
            does not swamp (1 for coincident landmarks, m for well-spread ones).
        residual: ``||(A + ridge I) X_k - I||_F / sqrt(m)`` after the given ``num_iters`` iterations (0 = converged,
            about 1 = the small eigen-directions not inverted at all).
        iters_to_target: the fewest iterations whose residual is <= the target, or -1 if ``max_iters`` did not reach
            it.
    """

    num_landmarks: int
    condition: Tensor
    effective_rank: Tensor
    residual: Tensor
    iters_to_target: Tensor


def _check_count(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f'landmark_kernel_health: {name} must be an int >= {minimum}, got {value!r}')
    return int(value)


def newton_residuals(mat: Tensor, num_iters: int, ridge: float = 0.0) -> Tensor:
    """Residuals ``||(mat + ridge I) V_k - I||_F / sqrt(M)`` of the Newton–Schulz iterates ``V_0 .. V_num_iters`` of
    :func:`~soft_mm.ops.soft.newton.newton_inverse` (same initial guess, same step), in ``mat``'s dtype.

    Args:
        mat: ``(..., M, M)`` floating-point matrices, M >= 1.
        num_iters: iterations, an int >= 0.
        ridge: a float >= 0 added to the diagonal.

    Returns:
        ``(num_iters + 1, ...)``: row k is the residual after k iterations.
    """
    m = mat.shape[-1]
    p, v = newton_schulz_start(mat, ridge)
    eye = torch.eye(m, dtype=mat.dtype, device=mat.device)
    residuals = []
    for k in range(num_iters + 1):
        if k:
            v = newton_schulz_step(v, p)
        residuals.append(torch.linalg.matrix_norm(p @ v - eye) / math.sqrt(m))
    return torch.stack(residuals)


@torch.no_grad()
def landmark_kernel_health(landmarks: Tensor, num_iters: int = 20, ridge: float = 0.01,
                           target_residual: float = DEFAULT_TARGET_RESIDUAL,
                           max_iters: int = DEFAULT_MAX_ITERS) -> KernelHealth:
    """Condition number, effective rank and Newton–Schulz convergence of the landmark kernels of a batch, in float64.

    ``A = exp(-0.5 ||l_i - l_j||^2)`` is recomputed from ``landmarks`` in float64 (:func:`gaussian_kernel`, the kernel
    SOFT's attention inverts; the landmarks must already carry SOFT's ``d ** -0.25`` scale, as the attention layers'
    landmarks do), its spectrum by ``eigvalsh`` (A is symmetric), and the iteration of
    :func:`~soft_mm.ops.soft.newton.newton_inverse` is run on it for ``max(num_iters, max_iters)`` steps.

    Args:
        landmarks: ``(..., m, d)`` landmark tokens, any floating dtype (m >= 1).
        num_iters: the layer's Newton–Schulz iterations: ``residual`` is read after this many.
        ridge: the layer's ridge (a float >= 0).
        target_residual: the residual ``iters_to_target`` asks for (> 0).
        max_iters: the most iterations tried for ``iters_to_target`` (>= 1).

    Returns:
        :class:`KernelHealth` with fields of shape ``(...)``.
    """
    if not isinstance(landmarks, Tensor) or not landmarks.is_floating_point() or landmarks.ndim < 2:
        raise TypeError('landmark_kernel_health: landmarks must be a floating-point tensor of shape (..., m, d), got '
                        f'{type(landmarks).__name__ if not isinstance(landmarks, Tensor) else tuple(landmarks.shape)}')
    m = landmarks.shape[-2]
    if m == 0:
        raise ValueError('landmark_kernel_health: landmarks must hold at least one landmark (m >= 1), got m = 0')
    num_iters = _check_count(num_iters, 'num_iters', 0)
    max_iters = _check_count(max_iters, 'max_iters', 1)
    ridge = _check_ridge(ridge, 'landmark_kernel_health')
    if isinstance(target_residual, bool) or not isinstance(target_residual, numbers.Real) or not target_residual > 0:
        raise ValueError(f'landmark_kernel_health: target_residual must be a float > 0, got {target_residual!r}')

    lm = landmarks.detach().to(torch.float64)
    kernel = gaussian_kernel(lm, lm)
    kernel = 0.5 * (kernel + kernel.transpose(-2, -1))  # exactly symmetric for eigvalsh (rounding of the matmul)
    eigenvalues = torch.linalg.eigvalsh(kernel).clamp_min(0.0)  # PSD: negatives are rounding
    top = eigenvalues[..., -1]
    condition = (top + ridge) / (eigenvalues[..., 0] + ridge)
    threshold = torch.maximum(torch.full_like(top, ridge), m * torch.finfo(torch.float64).eps * top)
    effective_rank = (eigenvalues > threshold[..., None]).sum(-1)

    residuals = newton_residuals(kernel, max(num_iters, max_iters), ridge)  # (K + 1, ...)
    reached = residuals <= target_residual
    first = reached.to(torch.int64).argmax(0)
    iters_to_target = torch.where(reached.any(0), first, torch.full_like(first, -1))
    return KernelHealth(num_landmarks=m, condition=condition, effective_rank=effective_rank,
                        residual=residuals[num_iters], iters_to_target=iters_to_target)
