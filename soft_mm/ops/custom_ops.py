"""The one helper that registers an op of soft_mm as a ``torch.library`` custom op, with its fake kernel and backward.

A custom op is opaque to dynamo and AOTAutograd: its fake kernel gives the output shapes, dtypes and memory layouts
(symbolic sizes included), and its real kernel runs whatever it likes (a Python loop over tiles, Triton launches),
the same in eager and compiled runs, so ``torch.compile`` records one node and a compiled model takes the kernels of
the eager one. Its backward is a second custom op, ``<name>_backward``, wired in by
``torch.library.register_autograd``: first order only (a double backward raises). On torch < 2.4 the same kernels run
behind an ``autograd.Function`` (:func:`soft_mm.ops.compat.custom_op`).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .compat import custom_op
from .graph_mode import eager_tensors

__all__ = ['NAMESPACE', 'differentiable_op', 'plain_eager_call']

NAMESPACE = 'soft_mm'


def plain_eager_call(args: tuple) -> bool:
    """An eager call (no compile, export or trace; no dispatch mode that records or replaces operators) whose tensors
    are plain: where an op's kernels run without the custom op's dispatch (:class:`~soft_mm.ops.compat.FunctionOp`)."""
    return eager_tensors(*(a for a in args if isinstance(a, torch.Tensor)))


def differentiable_op(name: str, kernel: Callable, schema: str, fake: Callable, *, backward: Callable,
                      backward_schema: str, backward_fake: Callable,
                      save: Callable[[tuple, object], tuple[tuple, tuple]]) -> tuple[Callable, Callable]:
    """Register ``soft_mm::<name>`` and its backward ``soft_mm::<name>_backward``; return both ops.

    Only the first output is differentiated: further outputs are what the backward needs, returned for it alone
    (nothing downstream reads them, so their gradients are zero and ignored).

    Args:
        name: the op's name in the ``soft_mm`` namespace.
        kernel: the real forward kernel, ``kernel(*inputs) -> output`` (a tensor or a tuple of tensors).
        schema: the forward's schema, e.g. ``'(Tensor mat, int num_iters, float ridge) -> Tensor'``.
        fake: the forward's fake kernel (same signature, the real kernel's output layouts).
        backward: the real backward kernel, ``backward(grad_output, *tensors, *options) -> grads`` of the leading
            tensor inputs (a tensor or a tuple); the remaining inputs get no gradient.
        backward_schema: the backward's schema.
        backward_fake: the backward's fake kernel.
        save: ``save(inputs, output) -> (tensors, options)``, what the backward takes after ``grad_output``:
            tensors saved for backward, and non-tensor options.
    """
    backward_op = custom_op(f'{NAMESPACE}::{name}_backward', backward, backward_schema, backward_fake,
                            eager_call=plain_eager_call)

    def setup_context(ctx, inputs: tuple, output) -> None:
        tensors, ctx.options = save(inputs, output)
        ctx.num_inputs = len(inputs)
        ctx.save_for_backward(*tensors)
        # the outputs kept for the backward get no gradient: autograd hands None for them instead of a zero tensor
        # each (one launch apiece, on every backward)
        ctx.set_materialize_grads(False)

    def backward_fn(ctx, grad_output, *grads_of_saved_outputs) -> tuple:
        if grad_output is None:  # nothing downstream used the result
            return (None,) * ctx.num_inputs
        grads = backward_op(grad_output, *ctx.saved_tensors, *ctx.options)
        grads = tuple(grads) if isinstance(grads, (tuple, list)) else (grads,)
        return (*grads, *([None] * (ctx.num_inputs - len(grads))))

    op = custom_op(f'{NAMESPACE}::{name}', kernel, schema, fake, backward_fn, setup_context,
                   eager_call=plain_eager_call)
    return op, backward_op
