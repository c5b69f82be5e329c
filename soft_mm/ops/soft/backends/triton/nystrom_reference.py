"""The PyTorch math of the Triton backend's two custom ops (:mod:`.nystrom_launch`), which the kernels are checked
against and which a backward falls back to where its kernel cannot launch (triton's ``OutOfResources``).

* :func:`middle_reference` — ``soft_mm::triton_nystrom_middle``'s m×m middle matrix: the landmarks' Gaussian kernel
  ``A``, its Newton–Schulz inverse ``V`` (:func:`~soft_mm.ops.soft.newton.newton_inverse`, implicit backward) and
  SOFT-Norm's ``D^-1/2 V D^-1/2``, differentiable, in the landmarks' dtype;
* :func:`middle_backward_reference` — the landmarks' gradient through it, as ``nystrom_middle_bwd_kernel_dl`` forms
  it from the final iterate (float32);
* :func:`products_backward_reference` — ``soft_mm::triton_nystrom_products``' backward: the tiled backend's
  (:func:`~soft_mm.ops.soft.backends.tiled.tiled_products_backward`), float32 products.

The products' forward is the ``'reference'`` backend's
(:func:`~soft_mm.ops.soft.backends.reference.reference_products`), against which
``tests/ops/soft/backends/triton/test_backend.py`` checks the whole op.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ....precision.autocast import ieee_float32_matmuls
from ...kernel import gaussian_kernel
from ...middle import Middle
from ...newton import newton_inverse
from ..tiled import DEFAULT_TILE_SIZE, tiled_products_backward

__all__ = ['middle_backward_reference', 'middle_reference', 'products_backward_reference']


def middle_reference(landmarks: Tensor, num_iters: int, ridge: float, soft_norm: bool) -> Tensor:
    """The m×m middle matrix of ``landmarks`` ``(B, h, m, d)``: ``A^+`` by ``num_iters`` Newton–Schulz iterations of
    ``A + ridge I``, or with ``soft_norm`` ``D^-1/2 A^+ D^-1/2`` (``D = A 1``, the un-ridged row sums); ``(B, h, m,
    m)`` in the landmarks' dtype, differentiable (the inverse's implicit backward)."""
    kernel = gaussian_kernel(landmarks, landmarks)
    inverse = newton_inverse(kernel, num_iters, ridge)
    return Middle(inverse, kernel.sum(-1).rsqrt() if soft_norm else None).matrix()


def middle_backward_reference(grad_middle: Tensor, landmarks: Tensor, inverse: Tensor, soft_norm: bool) -> Tensor:
    """The landmarks' gradient ``(B, h, m, d)`` float32 through the middle matrix, from its gradient ``grad_middle``
    and the final Newton–Schulz iterate ``inverse`` (each ``(B, h, m, m)``): what ``nystrom_middle_bwd_kernel_dl``
    computes (its docstring has the math) — the exact inverse's gradient at the iterate, ``-V^T G V^T``, SOFT-Norm's
    row sums' share, through ``A = exp(min(E, 0))`` to the landmarks."""
    with ieee_float32_matmuls():
        lm, grad, v = landmarks.float(), grad_middle.float(), inverse.float()
        half_sq = 0.5 * (lm * lm).sum(-1)
        exponent = lm @ lm.mT - half_sq[..., :, None] - half_sq[..., None, :]
        kernel = exponent.clamp_max(0.0).exp()
        row_term = 0.0
        if soft_norm:
            scale = kernel.sum(-1).rsqrt()  # D^-1/2
            weighted = grad * v
            grad_scale = (weighted * scale[..., None, :]).sum(-1) + (weighted * scale[..., :, None]).sum(-2)
            row_term = (-0.5 * scale ** 3 * grad_scale)[..., :, None]
            grad = scale[..., :, None] * grad * scale[..., None, :]
        grad_kernel = row_term - v.mT @ grad @ v.mT
        grad_exponent = torch.where(exponent <= 0.0, grad_kernel * kernel, 0.0)
        both = grad_exponent + grad_exponent.mT
        return both @ lm - both.sum(-1, keepdim=True) * lm


def products_backward_reference(grad_out: Tensor, q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor,
                                context: Tensor, middle_context: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of q, landmarks, v and middle of ``K1 @ middle @ (K1^T v)`` (shapes as the inputs'), from the
    forward's ``context = K1^T v`` and ``middle_context = middle @ context`` ``(B, h, m, d_v)``: the tiled backend's
    PyTorch math with float32 products (the float16 kernels' range scaling is theirs alone)."""
    return tiled_products_backward(grad_out, q, landmarks, v, middle, context, middle_context, DEFAULT_TILE_SIZE,
                                   torch.float32)
