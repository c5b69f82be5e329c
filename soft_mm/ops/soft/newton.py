"""Moore–Penrose inverse by the Newton–Schulz iteration, with an implicit (exact-inverse) backward."""
import math
import numbers

import torch
from torch import Tensor

from ..compat import eager_without_custom_ops
from ..custom_ops import differentiable_op
from ..graph_mode import exporting
from ..precision.autocast import compute_dtype, ieee_float32_matmuls, ieee_matmul, no_autocast

__all__ = ['BACKWARD_MODES', 'NEWTON_OP', 'alpha_floor', 'check_newton_arguments', 'exact_inverse', 'newton_inverse',
           'newton_inverse_macs', 'newton_schulz_start', 'newton_schulz_step']

BACKWARD_MODES = ('implicit', 'unrolled')
# Largest ridge, relative to sqrt(||mat||_1 ||mat||_inf), for which alpha * sigma_max(mat + ridge I)^2 < 2 still holds
# with alpha = 1.8 / (||mat||_1 ||mat||_inf): 1.8 * (1 + r)^2 < 2  <=>  r < sqrt(10 / 9) - 1 = 0.054.
_MAX_RELATIVE_RIDGE = 0.05


def _check_matrix(mat: Tensor, fn_name: str) -> None:
    if not isinstance(mat, Tensor):
        raise TypeError(f'{fn_name}: mat must be a torch.Tensor, got {type(mat).__name__}')
    if not mat.is_floating_point():
        raise TypeError(f'{fn_name}: mat must be a real floating-point tensor '
                        f'(float16, bfloat16, float32, float64), got {mat.dtype}')
    if mat.ndim < 2 or mat.shape[-1] != mat.shape[-2]:
        raise ValueError(f'{fn_name}: mat must be a batch of square matrices of shape (..., M, M), '
                         f'got shape {tuple(mat.shape)}')


def _check_ridge(ridge: float, fn_name: str) -> float:
    if isinstance(ridge, bool) or not isinstance(ridge, numbers.Real) or not ridge >= 0.0 \
            or ridge == float('inf'):
        raise ValueError(f'{fn_name}: ridge must be a finite float >= 0, got {ridge!r}')
    return float(ridge)


def _add_ridge(mat: Tensor, ridge: float) -> Tensor:
    if ridge == 0.0:
        return mat
    eye = torch.eye(mat.shape[-1], dtype=mat.dtype, device=mat.device)
    return mat + ridge * eye


def alpha_floor(dtype: torch.dtype, ridge: float) -> float:
    """The floor of ``||mat||_1 ||mat||_inf`` in alpha's denominator. It only matters where convergence is not
    guaranteed anyway: it keeps a zero matrix finite (V_0 = 0 for ridge = 0) and, for ridge > 0.05 * sqrt(norm
    product), shrinks alpha so that the ridge cannot make the iteration diverge."""
    return max(torch.finfo(dtype).tiny, (ridge / _MAX_RELATIVE_RIDGE) ** 2)


def newton_schulz_start(mat: Tensor, ridge: float) -> tuple[Tensor, Tensor]:
    """``(P, V_0)``: the matrix ``P = mat + ridge I`` that the iteration inverts and its initial guess ``alpha P^T``
    (``mat`` (..., M, M) with M >= 1, in its compute dtype; differentiable if ``mat`` is). Each iteration is then
    :func:`newton_schulz_step`."""
    abs_mat = mat.abs()
    norm_1 = abs_mat.sum(-2).amax(-1)  # max column sum, (...)
    norm_inf = abs_mat.sum(-1).amax(-1)  # max row sum, (...)
    alpha = 1.8 / (norm_1 * norm_inf).clamp_min(alpha_floor(mat.dtype, ridge))
    p = _add_ridge(mat, ridge)
    return p, alpha[..., None, None] * p.transpose(-2, -1)


def newton_schulz_step(v: Tensor, p: Tensor) -> Tensor:
    """One Newton–Schulz iteration ``2 V - (V P) V`` (IEEE float32 GEMMs in float32, forward and backward)."""
    return 2.0 * v - ieee_matmul(ieee_matmul(v, p), v)


def _newton_schulz(mat: Tensor, num_iters: int, ridge: float) -> Tensor:
    """The bare iteration on ``mat`` (..., M, M), already in its compute dtype; differentiable if ``mat`` is."""
    if mat.shape[-1] == 0:
        return mat.transpose(-2, -1).clone()
    p, v = newton_schulz_start(mat, ridge)
    for _ in range(num_iters):
        v = newton_schulz_step(v, p)
    return v


def _implicit_forward(mat: Tensor, num_iters: int, ridge: float) -> Tensor:
    """The real kernel of ``soft_mm::newton_inverse``: the iteration, contiguous (a fresh tensor, never ``mat``)."""
    with ieee_float32_matmuls():
        return _newton_schulz(mat, num_iters, ridge).contiguous()


def _implicit_backward(grad_v: Tensor, v: Tensor) -> Tensor:
    """The real kernel of ``soft_mm::newton_inverse_backward``: the exact inverse's gradient ``-V^T grad_V V^T`` at
    the final iterate (``d(mat + ridge I)/d(mat) = I``, so the gradient w.r.t. P is the gradient w.r.t. mat)."""
    with no_autocast(v.device), ieee_float32_matmuls():
        v_t = v.transpose(-2, -1)
        return (-(v_t @ grad_v.to(v.dtype) @ v_t)).contiguous()


# The implicit-backward inverse as a custom op (soft_mm::newton_inverse, its backward soft_mm::newton_inverse_backward,
# first order only): torch.compile records one node and runs this kernel, as eager does. The fake kernels give the
# real layouts (contiguous outputs).
_newton_op, _ = differentiable_op(
    'newton_inverse', _implicit_forward, '(Tensor mat, int num_iters, float ridge) -> Tensor',
    lambda mat, num_iters, ridge: mat.new_empty(mat.shape), backward=_implicit_backward,
    backward_schema='(Tensor grad_v, Tensor v) -> Tensor', backward_fake=lambda grad_v, v: v.new_empty(v.shape),
    save=lambda inputs, output: ((output,), ()))
NEWTON_OP = _newton_op  # the op, for callers that look for it in a graph or a dispatch trace


def newton_inverse_macs(shape: tuple[int, ...], num_iters: int) -> int:
    """Multiply-accumulates of :func:`newton_inverse` on matrices of ``shape`` (..., M, M): each iteration
    ``2V - (V P) V`` is two M×M matmuls, ``2 M^3`` MACs per matrix (the initial guess and the ridge are O(M^2))."""
    *batch, rows, cols = shape
    return 2 * int(num_iters) * math.prod(batch) * rows * cols * cols


def check_newton_arguments(num_iters: int, ridge: float, backward: str, fn_name: str) -> float:
    """Validate the iteration's arguments (ValueError naming each); returns ``ridge`` as a float."""
    if isinstance(num_iters, bool) or not isinstance(num_iters, numbers.Integral) or num_iters < 0:
        raise ValueError(f'{fn_name}: num_iters must be an int >= 0, got {num_iters!r}')
    ridge = _check_ridge(ridge, fn_name)
    if backward not in BACKWARD_MODES:
        raise ValueError(f'{fn_name}: backward must be one of {BACKWARD_MODES}, got {backward!r}')
    return ridge


@eager_without_custom_ops
def newton_inverse(mat: Tensor, num_iters: int = 20, ridge: float = 0.0, backward: str = 'implicit') -> Tensor:
    """Moore–Penrose inverse of every matrix in a batch by the Newton–Schulz iteration.

    ``V_{k+1} = 2 V_k - V_k P V_k`` with ``P = mat + ridge * I``, from ``V_0 = alpha * P^T`` with one ``alpha = 1.8 /
    (||mat||_1 ||mat||_inf)`` per matrix (SOFT's ``0.9 * 2 / max_row_sum^2`` on a kernel matrix; ``1.8 / (20 *
    ridge)^2`` where the ridge is too large for that to converge), so each result depends on its own matrix only. Runs
    with autocast off in at least float32, its float32 GEMMs in IEEE float32. Convergence, the iterations a condition
    number needs and the ridge against nearly duplicated landmarks: docs/advanced/precision_and_backends.md (the
    Newton–Schulz inverse).

    Args:
        mat: ``(..., M, M)`` floating-point matrices.
        num_iters: number of Newton–Schulz iterations, an int >= 0.
        ridge: ``ridge * I`` is added to every matrix before the iteration, a float >= 0.
        backward: ``'implicit'``: the final iterate ``V`` taken as the exact inverse, ``grad_mat = -V^T grad_V V^T``
            (the custom op :data:`NEWTON_OP`, one node under ``torch.compile``, first order only), the unrolled
            gradient once converged; ``'unrolled'``: autograd through the iterations. A graph being exported holds the
            iterations as plain matmuls either way.

    Returns:
        ``(..., M, M)`` approximations of ``(mat + ridge I)^+`` in the dtype of ``mat``.
    """
    _check_matrix(mat, 'newton_inverse')
    ridge = check_newton_arguments(num_iters, ridge, backward, 'newton_inverse')
    with no_autocast(mat.device), ieee_float32_matmuls():
        work = mat.to(compute_dtype(mat.dtype))
        if backward == 'implicit' and not exporting():
            inverse = _newton_op(work, int(num_iters), ridge)
        else:
            inverse = _newton_schulz(work, int(num_iters), ridge)
    return inverse.to(mat.dtype)


def exact_inverse(mat: Tensor, ridge: float = 0.0) -> Tensor:
    """Reference: ``torch.linalg.pinv(mat + ridge * I)`` in at least float32 (autocast off), cast back to ``mat``'s
    dtype.

    Args:
        mat: ``(..., M, M)`` floating-point matrices.
        ridge: a float >= 0 added to the diagonal before inverting.

    Returns:
        ``(..., M, M)`` Moore–Penrose inverses, differentiable by autograd.
    """
    _check_matrix(mat, 'exact_inverse')
    ridge = _check_ridge(ridge, 'exact_inverse')
    with no_autocast(mat.device), ieee_float32_matmuls():
        work = _add_ridge(mat.to(compute_dtype(mat.dtype)), ridge)
        return torch.linalg.pinv(work).to(mat.dtype)
