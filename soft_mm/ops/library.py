"""The SOFT op's hand-written kernels as ``torch.library`` custom ops, so that ``torch.compile`` sees one node each.

A custom op is opaque to dynamo and AOTAutograd: its fake kernel gives the output shapes, dtypes and memory layouts
(symbolic sizes included), and its real kernel runs whatever it likes (a Python loop over tiles, Triton launches),
the same in eager and compiled runs. Its backward is a second custom op, registered through
``torch.library.register_autograd``; it is first order only (a double backward raises). On torch < 2.4 the same
kernels run behind an ``autograd.Function`` (:func:`soft_mm.ops.compat.custom_op`).

:func:`products_op` defines the pair for a backend of the N×m products ``K1 @ middle @ (K1^T @ v)``:

* forward ``(q, landmarks, v, middle, *options) -> (out, context, mixed)``: the output (v's dtype and memory layout),
  ``context = K1^T v`` and ``mixed = middle @ context`` (m×d_v, the work dtype of the landmarks), which the backward
  needs;
* backward ``(grad_out, q, landmarks, v, middle, context, mixed, *options) -> (grad_q, grad_landmarks, grad_v,
  grad_middle)``: grad q and grad v in the layouts of q and v.

The wrapper makes the real kernels' layouts those of the fake ones (the m-sized tensors contiguous), which
``torch.library.opcheck`` verifies in the tests, and runs both kernels' float32 GEMMs in IEEE float32 whatever the
global TF32 setting (:func:`~soft_mm.ops.precision.ieee_float32_matmuls`).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .compat import custom_op
from .precision import ieee_float32_matmuls

__all__ = ['products_op']

NAMESPACE = 'soft_mm'
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

    def forward_impl(q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, *options) -> tuple[Tensor, ...]:
        with ieee_float32_matmuls():
            out, context, mixed = forward(q, landmarks, v, middle, *options)
        return out, context.contiguous(), mixed.contiguous()

    def backward_impl(grad_out: Tensor, q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, context: Tensor,
                      mixed: Tensor, *options) -> tuple[Tensor, ...]:
        with ieee_float32_matmuls():
            grad_q, grad_landmarks, grad_v, grad_middle = backward(grad_out, q, landmarks, v, middle, context, mixed,
                                                                   *options)
        return grad_q, grad_landmarks.contiguous(), grad_v, grad_middle.contiguous()

    def forward_fake(q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, *options) -> tuple[Tensor, ...]:
        return torch.empty_like(v), _context_like(landmarks, v), _context_like(landmarks, v)

    def backward_fake(grad_out: Tensor, q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, context: Tensor,
                      mixed: Tensor, *options) -> tuple[Tensor, ...]:
        return (torch.empty_like(q), landmarks.new_empty(landmarks.shape), torch.empty_like(v),
                middle.new_empty(middle.shape))

    backward_op = custom_op(
        f'{NAMESPACE}::{name}_backward', backward_impl,
        f'(Tensor grad_out, {_TENSORS}, Tensor context, Tensor mixed, {options_schema}) '
        '-> (Tensor, Tensor, Tensor, Tensor)', backward_fake)

    def setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor, Tensor]) -> None:
        q, landmarks, v, middle, *options = inputs
        ctx.save_for_backward(q, landmarks, v, middle, output[1], output[2])
        ctx.options = options

    def backward_fn(ctx, grad_out: Tensor, grad_context: Tensor | None, grad_mixed: Tensor | None) -> tuple:
        # context and mixed are returned for the backward only: nothing downstream reads them, their gradients are 0
        grads = backward_op(grad_out, *ctx.saved_tensors, *ctx.options)
        return (*grads, *([None] * len(ctx.options)))

    forward_op = custom_op(f'{NAMESPACE}::{name}', forward_impl,
                           f'({_TENSORS}, {options_schema}) -> (Tensor, Tensor, Tensor)', forward_fake,
                           backward_fn, setup_context)

    def products(q: Tensor, landmarks: Tensor, v: Tensor, middle: Tensor, *options) -> Tensor:
        return forward_op(q, landmarks, v, middle, *options)[0]

    products.forward_op, products.backward_op = forward_op, backward_op
    return products
