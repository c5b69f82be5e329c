"""``residual + linear(x)``, the end of every residual branch, with the sum started in the GEMM for CPU inference.

A transformer block ends each branch with a linear layer (the attention's output projection, the MLP's second layer)
whose result is added to the residual stream. Written as two ops, that is three passes over the ``(N, C)`` tokens
besides the GEMM: ``F.linear`` first copies its bias into the output (the BLAS GEMM then accumulates onto it), and the
sum reads both tensors and writes a third. In eager CPU inference :func:`linear_residual` makes one pass instead,
``out = residual + bias``, and lets the GEMM accumulate onto ``out`` in place (``addmm_``, the same beta = 1 GEMM that
``F.linear`` runs onto its bias copy). The same sum, rounded in another order: within float32 rounding of the
two-op form. Everywhere else (gradients, other devices, autocast, ``torch.compile`` and export, which build their own
graphs) it is ``residual + F.linear(x, weight, bias)`` itself.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _module

from ..graph_mode import eager_cpu_inference
from ..precision import autocast_dtype

__all__ = ['hooked', 'linear_residual']


def hooked(*modules: nn.Module) -> bool:
    """Whether a forward (pre-)hook observes any of ``modules``, its own or a global one: the models then keep each
    branch's output apart from the residual sum, and call the branch's last layer as a module, so hooks see what they
    would see without :func:`linear_residual`."""
    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def _in_place(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor) -> bool:
    """Whether the call takes the in-place form: eager CPU inference without autocast, one dtype throughout, and a
    residual of the output's shape."""
    if not eager_cpu_inference(x, weight, bias, residual) or autocast_dtype('cpu') is not None:
        return False
    same_dtype = x.dtype == weight.dtype == residual.dtype and (bias is None or bias.dtype == x.dtype)
    return same_dtype and tuple(residual.shape) == (*x.shape[:-1], weight.shape[0])


def linear_residual(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor) -> Tensor:
    """``residual + F.linear(x, weight, bias)``, as one pass and one GEMM in CPU inference (see the module's
    docstring).

    Args:
        x: ``(..., in_features)``.
        weight: ``(out_features, in_features)``.
        bias: ``(out_features,)`` or None.
        residual: ``(..., out_features)``, the shape of the linear layer's output (not changed).
    """
    if not _in_place(x, weight, bias, residual):
        return residual + F.linear(x, weight, bias)
    out = residual + bias if bias is not None else residual.clone()
    if not out.is_contiguous():
        out = out.contiguous()
    out.view(-1, weight.shape[0]).addmm_(x.reshape(-1, weight.shape[1]), weight.t())
    return out
