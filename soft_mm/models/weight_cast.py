"""The pyramid's GEMM weights cast once per forward under autocast on the GPU route, instead of once per layer call.

Autocast casts a float32 weight to the autocast dtype at every linear and conv call it meets, and the backward casts its
gradient back: two launches per weight and step, about 370 for SOFT-Norm-Small, the largest item of an eager GPU step
whose time goes to launches. On the GPU route (:func:`~soft_mm.ops.triton_route.gpu_route`) under autocast, in eager
runs, :func:`weights_cast_once` casts the weights and biases of every linear layer, of the SOFT layers' landmark and
value convs and, in training mode, of the stem's and the downsamplings' convs in one
:func:`~soft_mm.ops.functional.flat_cast.flat_cast` (a few launches, forward and backward) and hands each layer its cast
tensors for the forward: the same values autocast would have given it, so the outputs and gradients are the same. The
shared query/key projection gets its weight with SOFT's ``d^-1/4`` scale folded in (the product rounded once, as
:meth:`~soft_mm.models.attention.SoftAttention.queries` does it).

Left to autocast: the stem's and the downsamplings' convs in eval mode (their BatchNorm folds into the weight there),
the value convs (autocast casts each head's filter after repeating it over the head's channels, so the filter's
gradient sums those channels in float32; cast before the repeat, the sum would run in the low dtype), any layer under
gradient checkpointing (its recomputation must see the same operations), compiled and exported graphs
(where the compiler fuses the casts) and CPU runs (not launch-bound; the copy would cost more than it saves).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from ..ops.functional.flat_cast import flat_cast
from ..ops.graph_mode import eager_tensors
from ..ops.precision import autocast_dtype
from ..ops.triton_route import gpu_route
from .attention import SoftAttention
from .conv import ConvBNAct

__all__ = ['cast_once_applies', 'weights_cast_once']


def cast_once_applies(model: nn.Module, x: torch.Tensor) -> bool:
    """Whether :func:`weights_cast_once` casts ``model``'s weights for input ``x``: an eager call on the GPU route
    under a low-precision autocast, no gradient checkpointing."""
    dtype = autocast_dtype(x.device.type)
    return (dtype in (torch.bfloat16, torch.float16) and gpu_route(x) and eager_tensors(x)
            and not getattr(model, 'with_cp', False))


def _weights(model: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor, float]]:
    """``(owner, name, tensor, scale)`` of every weight cast once, found in one walk of the modules: the query/key
    projections first (their scale; the owner of a query weight is its SOFT layer, ``name`` ``'query_weight'`` or
    ``'query_bias'``), then the SOFT layers' landmark convs, the convs of :class:`ConvBNAct` in training mode and the
    linear layers, in the modules' order."""
    queries, others, linears, projections = [], [], [], set()
    for module in model.modules():
        if isinstance(module, SoftAttention):
            scale = module.head_dim ** -0.25
            queries.append((module, 'query_weight', module.qk.weight, scale))
            if module.qk.bias is not None:
                queries.append((module, 'query_bias', module.qk.bias, scale))
            projections.add(module.qk)
            conv = getattr(module, 'landmark_conv', None)
            if conv is not None:
                others.append((conv, 'weight', conv.weight, 1.0))
        elif isinstance(module, ConvBNAct) and module.bn.training:  # (in eval mode its BatchNorm folds into it)
            others += [(module.conv, name, p, 1.0) for name, p in module.conv.named_parameters(recurse=False)]
        elif isinstance(module, nn.Linear):
            linears.append(module)  # a query projection is known only once its SOFT layer is reached
    others += [(module, name, p, 1.0) for module in linears if module not in projections
               for name, p in module.named_parameters(recurse=False)]
    return [entry for entry in queries + others if entry[2].dtype == torch.float32]


@contextlib.contextmanager
def weights_cast_once(model: nn.Module, x: torch.Tensor) -> Iterator[None]:
    """Inside, ``model``'s layers compute with their weights cast once to the autocast dtype (see the module
    docstring), where :func:`cast_once_applies`; elsewhere nothing changes."""
    if not cast_once_applies(model, x):
        yield
        return
    entries = _weights(model)
    if not entries:
        yield
        return
    cast = flat_cast([tensor for _, _, tensor, _ in entries], autocast_dtype(x.device.type),
                     [scale for _, _, _, scale in entries])
    swapped = []
    for (owner, name, _, _), low in zip(entries, cast):
        if isinstance(owner, SoftAttention):
            owner.cast_queries[name] = low
        else:
            swapped.append((owner, name, owner._parameters[name]))
            owner._parameters[name] = low
    try:
        yield
    finally:
        for owner, name, parameter in swapped:
            owner._parameters[name] = parameter
        for owner, _, _, _ in entries:
            if isinstance(owner, SoftAttention):
                owner.cast_queries.clear()
