"""``GELU(linear(x))`` as one oneDNN GEMM with the GELU in its epilogue, for CPU inference.

The MLP of every transformer block applies its GELU to the ``4 C``-wide output of its first linear layer, the
largest activation of the block. Written as two ops, the GELU is one more pass over that tensor (read and write);
fused, it runs on the GEMM's float32 accumulator before the result is stored, which costs almost nothing
(docs/benchmarks/layer_kernels.md).

The fused kernel is oneDNN's (``torch.ops.mkldnn._linear_pointwise``, what inductor emits for this pattern on CPU),
GELU's erf form or its tanh approximation. It has no backward and takes float32 and bfloat16 only, so it runs only
in eager CPU inference (no gradient needed, not under ``torch.compile`` or export, which build their own graphs) in
those dtypes; every other call is ``F.gelu(F.linear(x, weight, bias), approximate)`` itself. Fused and unfused agree
to float32 rounding; in bfloat16 the fused result is rounded once (from the float32 accumulator) where the unfused
one is rounded twice, so they may differ by one bfloat16 step.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from ..graph_mode import graph_mode
from ..precision import autocast_dtype

__all__ = ['FUSED_DTYPES', 'fused_dtypes', 'fused_linear_gelu_available', 'linear_gelu']

FUSED_DTYPES = (torch.float32, torch.bfloat16)
GELU_APPROXIMATIONS = ('none', 'tanh')


@functools.cache
def fused_linear_gelu_available() -> bool:
    """Whether this PyTorch build has oneDNN's fused linear (``torch.ops.mkldnn._linear_pointwise``); asked once."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, '_linear_pointwise')


@functools.cache
def fused_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes of :data:`FUSED_DTYPES` in which the fused kernel runs on this CPU and torch (torch 2.1's oneDNN
    refuses bfloat16 where the CPU lacks AMX: "could not create a primitive descriptor"); tried once each."""
    if not fused_linear_gelu_available():
        return ()
    working = []
    for dtype in FUSED_DTYPES:
        x, weight = torch.ones(2, 16, dtype=dtype), torch.ones(16, 16, dtype=dtype)
        try:
            torch.ops.mkldnn._linear_pointwise(x, weight, None, 'gelu', [], 'none')
        except RuntimeError:
            continue
        working.append(dtype)
    return tuple(working)


def _compute_dtype(x: Tensor) -> torch.dtype | None:
    """The dtype the linear runs in (the CPU autocast dtype when it is on), or None if the fused kernel cannot take
    it."""
    dtype = autocast_dtype('cpu')
    if dtype is not None:
        return dtype if dtype == torch.bfloat16 and dtype in fused_dtypes() else None
    return x.dtype if x.dtype in fused_dtypes() else None


def _fusable(x: Tensor, weight: Tensor, bias: Tensor | None) -> torch.dtype | None:
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if x.device.type != 'cpu' or graph_mode() != 'eager' or not fused_linear_gelu_available():
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    return _compute_dtype(x)


def linear_gelu(x: Tensor, weight: Tensor, bias: Tensor | None = None, approximate: str = 'none') -> Tensor:
    """``F.gelu(F.linear(x, weight, bias), approximate=approximate)``, one fused oneDNN GEMM in CPU inference.

    Args:
        x: ``(..., in_features)``.
        weight: ``(out_features, in_features)``.
        bias: ``(out_features,)`` or None.
        approximate: ``'none'`` (erf GELU) or ``'tanh'``, as for :func:`torch.nn.functional.gelu`.
    """
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"linear_gelu: approximate must be one of {GELU_APPROXIMATIONS}, got {approximate!r}")
    dtype = _fusable(x, weight, bias)
    if dtype is None:
        return F.gelu(F.linear(x, weight, bias), approximate=approximate)
    if bias is not None:
        bias = bias.to(dtype)
    return torch.ops.mkldnn._linear_pointwise(x.to(dtype), weight.to(dtype), bias, 'gelu', [], approximate)
