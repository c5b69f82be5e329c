"""``residual + linear(x)``, the end of every residual branch, with the sum started in the GEMM for CPU inference.

A transformer block ends each branch with a linear layer (the attention's output projection, the MLP's second layer)
whose result is added to the residual stream. Written as two ops, that is three passes over the ``(N, C)`` tokens
besides the GEMM: ``F.linear`` first copies its bias into the output (the BLAS GEMM then accumulates onto it), and the
sum reads both tensors and writes a third. In eager CPU inference :func:`linear_residual` makes one pass instead,
``out = residual + bias``, and lets the GEMM accumulate onto ``out`` in place (``addmm_``, the same beta = 1 GEMM that
``F.linear`` runs onto its bias copy): the same sum, rounded in another order, within float32 rounding of the two-op
form. In bfloat16 (a bfloat16 stream, under CPU autocast or not) the sum is oneDNN's GEMM with the residual added in
its epilogue (``torch.ops.mkldnn._linear_pointwise.binary``, what inductor emits for this pattern): rounded to
bfloat16 once, from the float32 accumulator, where the two-op form rounds the linear's output and then the sum.
Everywhere else (gradients, other devices, other dtypes, ``torch.compile`` and export, which build their own graphs)
it is ``residual + F.linear(x, weight, bias)`` itself.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _module

from ..route import Route, decided
from .gelu import fused_linear_gelu_available

__all__ = ['bfloat16_epilogue_available', 'hooked', 'linear_residual', 'plain_linear']


def hooked(*modules: nn.Module) -> bool:
    """Whether a forward (pre-)hook observes any of ``modules``, its own or a global one: the models then keep each
    branch's output apart from the residual sum, and call the branch's last layer as a module, so hooks see what they
    would see without :func:`linear_residual`."""
    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def plain_linear(*layers: nn.Module) -> bool:
    """Whether ``layers`` are plain ``nn.Linear`` layers (not a subclass, or another module put in their place such as
    a LoRA wrapper) that no forward hook watches: layers whose weights a model may use directly (one GEMM for several,
    a bias left to a fused kernel, the weights cast once per stage); any other layer is called as a module."""
    return all(type(layer) is nn.Linear for layer in layers) and not hooked(*layers)


@functools.cache
def bfloat16_epilogue_available() -> bool:
    """Whether oneDNN's linear with a binary ``add`` epilogue runs bfloat16 on this CPU and torch; tried once."""
    if not fused_linear_gelu_available():  # the same oneDNN linear, its unary form
        return False
    x, weight = torch.ones(2, 16, dtype=torch.bfloat16), torch.ones(16, 16, dtype=torch.bfloat16)
    try:
        torch.ops.mkldnn._linear_pointwise.binary(x, torch.ones(2, 16, dtype=torch.bfloat16), weight, None, 'add')
    except (RuntimeError, AttributeError):
        return False
    return True


def _form(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor, route: Route) -> str:
    """``'addmm'`` (one dtype throughout, no autocast: the sum as the GEMM's start), ``'bfloat16'`` (a bfloat16
    residual and bfloat16 compute: oneDNN's epilogue) or ``'plain'`` (the two ops)."""
    if not route.cpu_inference(x, weight, bias, residual) or tuple(residual.shape) != (*x.shape[:-1],
                                                                                        weight.shape[0]):
        return 'plain'
    autocast = route.autocast
    same_dtype = x.dtype == weight.dtype == residual.dtype and (bias is None or bias.dtype == x.dtype)
    if (residual.dtype == torch.bfloat16 and (autocast == torch.bfloat16 or (autocast is None and same_dtype))
            and bfloat16_epilogue_available()):
        return 'bfloat16'
    return 'addmm' if autocast is None and same_dtype else 'plain'


def linear_residual(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor, route: Route | None = None,
                    ) -> Tensor:
    """``residual + F.linear(x, weight, bias)``, as one pass and one GEMM in CPU inference (see the module's
    docstring).

    Args:
        x: ``(..., in_features)``.
        weight: ``(out_features, in_features)``.
        bias: ``(out_features,)`` or None.
        residual: ``(..., out_features)``, the shape of the linear layer's output (not changed).
        route: the forward's :class:`~soft_mm.ops.route.Route` (None: the route of ``x``).
    """
    form = _form(x, weight, bias, residual, decided(route, x))
    if form == 'plain':
        return residual + F.linear(x, weight, bias)
    if form == 'bfloat16':
        bf16 = torch.bfloat16
        return torch.ops.mkldnn._linear_pointwise.binary(x.to(bf16), residual.contiguous(), weight.to(bf16),
                                                         None if bias is None else bias.to(bf16), 'add')
    out = residual + bias if bias is not None else residual.clone()
    if not out.is_contiguous():
        out = out.contiguous()
    out.view(-1, weight.shape[0]).addmm_(x.reshape(-1, weight.shape[1]), weight.t())
    return out
