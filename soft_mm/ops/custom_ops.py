"""Custom ops of soft_mm, in one home: an op registered as a ``torch.library`` custom op with its fake kernel and
backward, and the same kernels behind an ``autograd.Function`` where torch has no custom ops (< 2.4).

A custom op is opaque to dynamo and AOTAutograd: its fake kernel gives the output shapes, dtypes and memory layouts
(symbolic sizes included), and its real kernel runs whatever it likes (a Python loop over tiles, Triton launches),
the same in eager and compiled runs, so ``torch.compile`` records one node and a compiled model takes the kernels of
the eager one. Its backward is a second custom op, ``<name>_backward``, wired in by
``torch.library.register_autograd``: first order only (a double backward raises).

* :func:`differentiable_op` — an op and its backward op, what the op layer registers;
* :func:`custom_op` — one op of the ``soft_mm`` namespace with its fake and its backward: a ``torch.library`` custom
  op where torch has them (>= 2.4: one opaque node under ``torch.compile``), otherwise the same kernels behind an
  ``autograd.Function`` (same forward, same first-order backward; ``torch.compile`` traces into it instead), called
  through a :class:`FunctionOp`;
* :func:`recorded_calls` — the arguments of every call of such an op (a dispatch mode, or the op's own hook).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .compat import HAS_CUSTOM_OP
from .graph_mode import eager_tensors

__all__ = ['NAMESPACE', 'FunctionOp', 'custom_op', 'differentiable_op', 'plain_eager_call', 'recorded_calls']

NAMESPACE = 'soft_mm'


def plain_eager_call(args: tuple) -> bool:
    """An eager call (no compile, export or trace; no dispatch mode that records or replaces operators) whose tensors
    are plain: where an op's kernels run without the custom op's dispatch (:class:`FunctionOp`)."""
    return eager_tensors(*(a for a in args if isinstance(a, torch.Tensor)))


class FunctionOp:
    """A custom op of soft_mm as called: in an eager call on plain tensors, its real kernel run directly, under an
    ``autograd.Function`` when a backward is registered (no ``torch.library`` dispatch: tens of microseconds a call
    fewer where an eager GPU step waits for Python); wherever a graph is traced, compiled or exported, or tensors are
    fake, the ``torch.library`` custom op ``library_op`` (torch >= 2.4: one node, its fake kernel). On torch < 2.4
    there is no ``library_op``: the kernel runs eagerly everywhere and ``torch.compile`` breaks its graph there.
    ``name`` is the op's qualified name; ``eager_call(args)`` tells an eager call on plain tensors
    (:func:`plain_eager_call`; None: every call takes ``library_op`` where there is one)."""

    def __init__(self, name: str, forward: Callable, backward: Callable | None,
                 setup_context: Callable | None, library_op: Callable | None = None,
                 eager_call: Callable[[tuple], bool] | None = None) -> None:
        self.name = name
        self.forward = forward
        self.library_op = library_op
        self.eager_call = eager_call
        self.function = None if backward is None else _autograd_function(name, forward, backward, setup_context)
        self.recorders: list[list[tuple]] = []  # :func:`recorded_calls`
        if library_op is None:  # dynamo < 2.4 cannot trace these kernels: a graph break, the op run eagerly
            self._run = torch._dynamo.disable(self._run)

    def __call__(self, *args):
        for calls in self.recorders:
            calls.append(args)
        if self.library_op is not None and not (self.eager_call is not None and self.eager_call(args)):
            return self.library_op(*args)
        return self._run(*args)

    def _run(self, *args):
        if self.function is None:
            with torch.no_grad():
                return self.forward(*args)
        return self.function.apply(*args)

    def __repr__(self) -> str:
        return f'FunctionOp({self.name!r})'


def _autograd_function(name: str, forward: Callable, backward: Callable, setup_context: Callable) -> type:
    def forward_fn(ctx, *args):
        output = forward(*args)
        setup_context(ctx, args, output)
        return output

    @torch.autograd.function.once_differentiable  # first order only, as the custom op's backward
    def backward_fn(ctx, *grads):
        return backward(ctx, *grads)

    return type(name.replace('::', '_'), (torch.autograd.Function,),
                {'forward': staticmethod(forward_fn), 'backward': staticmethod(backward_fn)})


class _RecordCalls(TorchDispatchMode):
    def __init__(self, overload, calls: list[tuple]) -> None:
        super().__init__()
        self.overload, self.calls = overload, calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is self.overload:
            self.calls.append(args)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def recorded_calls(op) -> Iterator[list[tuple]]:
    """The arguments of every call of the op ``op`` (what :func:`custom_op` returned) made inside the block, in
    order: seen by the op itself (a :class:`FunctionOp`), or by a dispatch mode on a bare custom op."""
    calls: list[tuple] = []
    if isinstance(op, FunctionOp):
        op.recorders.append(calls)
        try:
            yield calls
        finally:
            op.recorders.remove(calls)
    else:
        with _RecordCalls(op._opoverload, calls):
            yield calls




def custom_op(name: str, forward: Callable, schema: str, fake: Callable, backward: Callable | None = None,
              setup_context: Callable | None = None, eager_call: Callable[[tuple], bool] | None = None):
    """Register ``forward`` as the op ``name`` (``'soft_mm::...'``) with the schema ``schema``, its fake (shape-only)
    kernel ``fake`` and, optionally, its first-order backward: ``setup_context(ctx, inputs, output)`` saves what
    ``backward(ctx, *grads) -> grads of the inputs`` needs (``torch.library.register_autograd``'s contract). The
    fake gives the real kernel's output layouts.

    Returns the callable op, a :class:`FunctionOp`: calls that ``eager_call(args)`` calls eager run the kernels
    directly; on torch >= 2.4 its ``library_op`` is the ``torch.library`` custom op (one node under
    ``torch.compile``, checked by ``torch.library.opcheck``) that the other calls (traced, compiled, exported) take.
    :func:`recorded_calls` sees every call.
    """
    if not HAS_CUSTOM_OP:
        return FunctionOp(name, forward, backward, setup_context)
    op = torch.library.custom_op(name, forward, mutates_args=(), schema=schema)
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return FunctionOp(name, forward, backward, setup_context, library_op=op, eager_call=eager_call)


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
