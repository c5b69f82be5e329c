"""Autocast queries and IEEE float32 matmuls, for every op of soft_mm.

"float32" means IEEE float32 whatever the process-wide setting: a training script that sets
``torch.backends.cuda.matmul.allow_tf32 = True`` or ``torch.set_float32_matmul_precision('high')`` would have cuBLAS
round the operands of every float32 GEMM to TF32's 10-bit mantissa (and oneDNN to TF32 or bfloat16 where the CPU
has them). :func:`ieee_float32_matmuls` sets IEEE float32 for an op's own GEMMs and restores the caller's setting;
:func:`ieee_matmul` keeps a product's backward GEMMs in IEEE float32 too.
"""
from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from ..compat import autocast_available, autocast_dtype_of, autocast_enabled, float32_precision_switches, matmul
from ..graph_mode import graph_mode

__all__ = ['autocast_cast', 'autocast_dtype', 'compute_dtype', 'float32_matmul_precision', 'float32_matmul_settings',
           'ieee_float32_matmuls', 'ieee_matmul', 'no_autocast']


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least float32: float16/bfloat16/float32 -> float32, float64 -> float64."""
    return torch.promote_types(dtype, torch.float32)


def no_autocast(device: torch.device) -> AbstractContextManager:
    """Context that disables autocast for ``device``'s type (a no-op where that type has no autocast)."""
    if not autocast_available(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, enabled=False)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype active for ``device_type``, or None when autocast is off there."""
    if not autocast_enabled(device_type):
        return None
    return autocast_dtype_of(device_type)


def autocast_cast(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` cast to the autocast dtype of their device when autocast is on there, as autocast casts a conv's
    or a matmul's operands (unchanged otherwise).

    A ``torch.library`` custom op is not autocast-aware: its fake kernel (what ``torch.compile`` traces) runs with
    autocast off, so a float32 weight meets bfloat16 activations there even though the eager kernel, run under the
    caller's autocast, would have cast it. Casting at the op's entry gives both the same operands.
    """
    dtype = autocast_dtype(tensors[0].device.type)
    if dtype is None:
        return tensors
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)


def float32_matmul_settings() -> dict[str, str]:
    """The current float32 matmul precision of cuBLAS and oneDNN, e.g. ``{'cuda': 'tf32', 'mkldnn': 'none'}``
    (``{'legacy': torch.get_float32_matmul_precision()}`` on torch < 2.9)."""
    switches = float32_precision_switches()
    if not switches:
        return {'legacy': torch.get_float32_matmul_precision()}
    return {label: owner.fp32_precision for label, owner in switches.items()}


class float32_matmul_precision(contextlib.AbstractContextManager):  # a context, named as used
    """Context that sets cuBLAS's and oneDNN's float32 matmul precision to ``value`` (``'ieee'``, or ``'tf32'`` as a
    training script's ``allow_tf32 = True`` does) and restores exactly what was set on exit.

    torch >= 2.9 keeps one switch per backend, which its legacy setters (``allow_tf32``,
    ``set_float32_matmul_precision``) write too; saving and restoring those switches leaves a caller's setting as it
    was, whichever API set it (restoring through the legacy API instead would change oneDNN's switch as well). On
    older torch, ``set_float32_matmul_precision('highest' | 'high')``."""

    VALUES = ('ieee', 'tf32')

    def __init__(self, value: str) -> None:
        if value not in self.VALUES:
            raise ValueError(f'float32_matmul_precision: value must be one of {self.VALUES}, got {value!r}')
        self.value = value

    def __enter__(self) -> None:
        self.switches = list(float32_precision_switches().values())
        if self.switches:
            self.saved = [owner.fp32_precision for owner in self.switches]
            for owner in self.switches:
                owner.fp32_precision = self.value
        else:
            self.saved = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision('highest' if self.value == 'ieee' else 'high')

    def __exit__(self, *exc) -> None:
        if self.switches:
            for owner, value in zip(self.switches, self.saved):
                owner.fp32_precision = value
        else:
            torch.set_float32_matmul_precision(self.saved)


def ieee_float32_matmuls() -> AbstractContextManager:
    """Context in which float32 matmuls run in IEEE float32 (no TF32, no bfloat16 passes), whatever the global
    ``allow_tf32`` / ``float32_matmul_precision`` setting; the caller's setting is restored on exit. Eager only (a
    no-op while a graph is compiled or exported: a traced function cannot set process-wide switches)."""
    if graph_mode() != 'eager':
        return contextlib.nullcontext()
    return float32_matmul_precision('ieee')


class _IEEEMatmul(torch.autograd.Function):
    """``a @ b`` whose forward and backward GEMMs both run in IEEE float32 (see :func:`ieee_matmul`)."""

    @staticmethod
    def forward(a: Tensor, b: Tensor) -> Tensor:
        with float32_matmul_precision('ieee'):
            return a @ b

    @staticmethod
    def setup_context(ctx, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        with float32_matmul_precision('ieee'):  # differentiable ops: a double backward goes through them
            if ctx.needs_input_grad[0]:
                grad_a = (grad @ b.transpose(-2, -1)).sum_to_size(a.shape)
            if ctx.needs_input_grad[1]:
                grad_b = (a.transpose(-2, -1) @ grad).sum_to_size(b.shape)
        return grad_a, grad_b


def ieee_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` (batched, broadcasting) with its forward and backward GEMMs in IEEE float32 whatever the global TF32
    setting, where autograd records it (float32 operands, eager); otherwise the plain product, whose forward the
    caller's :func:`ieee_float32_matmuls` covers. For the products with cancellation or amplification (the kernel's
    exponent, Newton–Schulz), whose gradients autograd computes after the op has returned."""
    if (a.dtype == torch.float32 and b.dtype == torch.float32 and torch.is_grad_enabled()
            and (a.requires_grad or b.requires_grad) and graph_mode() == 'eager'):
        return _IEEEMatmul.apply(a, b)
    return matmul(a, b)
