"""The custom-op pair of a backend of the SOFT op's N×m products ``K1 @ middle @ (K1^T @ v)``.

:func:`products_op` registers, through :func:`soft_mm.ops.custom_ops.differentiable_op`:

* forward ``(q, landmarks, v, middle, *options) -> (out, context, middle_context)``: the output (v's dtype and memory
  layout), ``context = K1^T v`` and ``middle_context = middle @ context`` (m×d_v, the work dtype of the landmarks),
  which the backward needs;
* backward ``(grad_out, q, landmarks, v, middle, context, middle_context, *options) -> (grad_q, grad_landmarks,
  grad_v, grad_middle)``: grad q and grad v in the layouts of q and v.

The wrapper makes the real kernels' layouts those of the fake ones (the m-sized tensors contiguous), which
``torch.library.opcheck`` verifies in the tests, and runs both kernels' float32 GEMMs in IEEE float32 whatever the
global TF32 setting (:func:`~soft_mm.ops.precision.ieee_float32_matmuls`).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..custom_ops import differentiable_op
from ..precision.autocast import ieee_float32_matmuls

__all__ = ['products_op']

_TENSORS = 'Tensor q, Tensor landmarks, Tensor v, Tensor middle'


def _context_like(landmarks: Tensor, v: Tensor) -> Tensor:
    return landmarks.new_empty((*v.shape[:-2], landmarks.shape[-2], v.shape[-1]))


def products_op(name: str, forward: Callable[..., tuple[Tensor, Tensor, Tensor]],
                backward: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]], options_schema: str,
                ) -> Callable[..., Tensor]:
    """Register ``soft_mm::<name>`` and ``soft_mm::<name>_backward``; return ``f(q, landmarks, v, middle, *options)
    -> out`` (4-d inputs ``(B, h, rows, cols)``), differentiable in the four tensors.

    Args:
        name: the op's name in the ``soft_mm`` namespace.
        forward: the real forward kernel (see the module docstring for both signatures).
        backward: the real backward kernel.
        options_schema: the schema of the non-tensor options, e.g. ``'int tile_size, ScalarType products'``.
    """

    def forward_kernel(q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, *options) -> tuple[Tensor, ...]:
        with ieee_float32_matmuls():
            out, context, middle_context = forward(q, landmarks, v, middle, *options)
        return out, context.contiguous(), middle_context.contiguous()

    def backward_kernel(grad_out: Tensor, q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, context: Tensor,
                        middle_context: Tensor, *options) -> tuple[Tensor, ...]:
        with ieee_float32_matmuls():
            grad_q, grad_landmarks, grad_v, grad_middle = backward(grad_out, q, landmarks, v, middle, context,
                                                                   middle_context, *options)
        return grad_q, grad_landmarks.contiguous(), grad_v, grad_middle.contiguous()

    def forward_fake(q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, *options) -> tuple[Tensor, ...]:
        return torch.empty_like(v), _context_like(landmarks, v), _context_like(landmarks, v)

    def backward_fake(grad_out: Tensor, q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, context: Tensor,
                      middle_context: Tensor, *options) -> tuple[Tensor, ...]:
        return (torch.empty_like(q), landmarks.new_empty(landmarks.shape), torch.empty_like(v),
                middle.new_empty(middle.shape))

    def save(inputs: tuple, output: tuple[Tensor, Tensor, Tensor]) -> tuple[tuple, tuple]:
        q, landmarks, v, middle, *options = inputs
        return (q, landmarks, v, middle, output[1], output[2]), tuple(options)

    forward_op, backward_op = differentiable_op(
        name, forward_kernel, f'({_TENSORS}, {options_schema}) -> (Tensor, Tensor, Tensor)', forward_fake,
        backward=backward_kernel,
        backward_schema=f'(Tensor grad_out, {_TENSORS}, Tensor context, Tensor middle_context, {options_schema}) '
                        '-> (Tensor, Tensor, Tensor, Tensor)',
        backward_fake=backward_fake, save=save)

    def products(q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, *options) -> Tensor:
        return forward_op(q, landmarks, v, middle, *options)[0]

    products.forward_op, products.backward_op = forward_op, backward_op
    return products
