"""Gaussian (RBF) kernel between two sets of vectors, the softmax replacement of SOFT."""
from __future__ import annotations

import torch
from torch import Tensor

from ..graph_mode import exporting
from ..precision.autocast import ieee_float32_matmuls, ieee_matmul

__all__ = ['augment_kernel_cols', 'augment_kernel_rows', 'gaussian_kernel']


def gaussian_kernel(x: Tensor, y: Tensor) -> Tensor:
    """Gaussian kernel ``exp(-0.5 * ||x_i - y_j||^2)`` between every row of ``x`` and every row of ``y``.

    The squared distance is computed in the expanded form ``||x||^2 + ||y||^2 - 2 x y^T`` (one matmul of augmented
    rows, see :func:`augment_kernel_rows`; no N×M×d intermediate) and clamped at 0, because rounding can make it
    slightly negative; every value is therefore in [0, 1] and the kernel of a point with itself is 1 up to rounding,
    never above it. SOFT's bandwidth ``exp(-||q - k||^2 / (2 sqrt(d)))`` is obtained by scaling both inputs by
    ``d ** -0.25`` beforehand.

    Args:
        x: ``(..., N, d)`` query-side vectors.
        y: ``(..., M, d)`` key-side vectors; the leading dims broadcast against those of ``x``.

    Returns:
        ``(..., N, M)`` kernel values in the promoted dtype of ``x`` and ``y`` (under autocast the matmul may run in
        lower precision; in float32 it runs in IEEE float32, forward and backward, whatever the global TF32 setting:
        :func:`~soft_mm.ops.precision.ieee_matmul`).
    """
    for name, tensor in (('x', x), ('y', y)):
        if not isinstance(tensor, Tensor):
            raise TypeError(f'gaussian_kernel: {name} must be a torch.Tensor, got {type(tensor).__name__}')
        if tensor.ndim < 2:
            raise ValueError(f'gaussian_kernel: {name} must have shape (..., n, d) with ndim >= 2, '
                             f'got shape {tuple(tensor.shape)}')
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f'gaussian_kernel: x and y must share the last (feature) dim, got x {tuple(x.shape)} '
                         f'and y {tuple(y.shape)}')
    # -|x_i - y_j|^2 / 2 as one matmul of augmented rows: two element-wise passes over the (N, M) result instead of
    # the five of adding the norms, scaling, clamping and exponentiating separately
    with ieee_float32_matmuls():  # the exponent cancels: never TF32, forward or backward
        exponent = ieee_matmul(augment_kernel_rows(x), augment_kernel_cols(y).transpose(-2, -1))
    if exponent.requires_grad or exporting():
        return exponent.clamp_max(0.0).exp()
    return exponent.clamp_max_(0.0).exp_()  # no autograd record to keep: the same values in the matmul's buffer



def augment_kernel_rows(x: Tensor) -> Tensor:
    """Rows ``[x, -|x|^2 / 2, 1]``: with :func:`augment_kernel_cols` their products are the kernel's exponents.

    ``(augment_kernel_rows(x) @ augment_kernel_cols(y)^T)_ij = x_i . y_j - |x_i|^2 / 2 - |y_j|^2 / 2
    = -|x_i - y_j|^2 / 2``, so ``exp(min(., 0))`` of it equals :func:`gaussian_kernel` (same expanded form, same
    clamp) at the cost of one matmul and two element-wise passes; no factor that could overflow (such as
    ``exp(x . y)``) is ever formed. The tiled attention builds each kernel block this way in cache.

    Args:
        x: ``(..., N, d)``.

    Returns:
        ``(..., N, d + 2)``, contiguous.
    """
    return torch.cat([x, -0.5 * x.pow(2).sum(-1, keepdim=True), torch.ones_like(x[..., :1])], -1)


def augment_kernel_cols(y: Tensor) -> Tensor:
    """Rows ``[y, 1, -|y|^2 / 2]``, the key-side partner of :func:`augment_kernel_rows`: ``(..., M, d + 2)``."""
    return torch.cat([y, torch.ones_like(y[..., :1]), -0.5 * y.pow(2).sum(-1, keepdim=True)], -1)
