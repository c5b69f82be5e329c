"""A post-norm block's ``LayerNorm(residual + branch)``, cast to the stream's dtype, in one kernel on the GPU route.

On CUDA under autocast, ``x = norm(x + branch).to(x.dtype)`` is four launches forward (the sum, LayerNorm's input
cast to float32, LayerNorm, the cast back) and about as many backward (the casts' gradients, LayerNorm's backward of
two or three kernels). :func:`add_layer_norm` runs the sum, the statistics and the normalisation in float32 in one
Triton kernel (``add_norm_fwd_kernel_y``) and writes the result in the stream's dtype; its backward is one kernel for
the sum's gradient (the same for both addends, the sum rebuilt from them rather than stored) with per-program partial
sums of the weight's and bias's gradients, summed after: two launches. Everywhere else (CPU, a graph being traced or
compiled, where the compiler fuses the same passes itself) it is the PyTorch form. The sum in float32 is at least as
accurate as the PyTorch form's, which rounds it to the stream's dtype before normalising.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import triton_route
from ..graph_mode import eager_tensors
from .add_norm_config import BACKWARD_PROGRAMS, MAX_ADD_NORM_WIDTH, add_norm_rows, padded_width

__all__ = ['MAX_ADD_NORM_WIDTH', 'add_layer_norm', 'fuses_add_norm']


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))




def _kernels():
    return triton_route.load_kernels('soft_mm.ops.functional.add_norm_kernels')


def fuses_add_norm(branch: Tensor, residual: Tensor, weight: Tensor | None) -> bool:
    """Whether :func:`add_layer_norm` takes its fused kernels for these tensors: an eager call on the GPU route with
    a usable triton, matching floating point shapes, an affine LayerNorm at most :data:`MAX_ADD_NORM_WIDTH` wide."""
    # eager plain tensors first: under torch.fx's symbolic trace they are proxies, whose device cannot be asked
    return (weight is not None and eager_tensors(branch, residual, weight)
            and triton_route.takes_triton(branch, residual)
            and branch.shape == residual.shape and residual.shape[-1] <= MAX_ADD_NORM_WIDTH
            and branch.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and residual.dtype in (torch.float32, torch.bfloat16, torch.float16))


def _rows(t: Tensor) -> Tensor:
    return t.reshape(-1, t.shape[-1]) if t.is_contiguous() else t.contiguous().reshape(-1, t.shape[-1])


class _AddLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, branch: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, eps: float,
                out_dtype: torch.dtype) -> Tensor:
        x, r = _rows(branch), _rows(residual)
        rows, width = r.shape
        y = torch.empty(rows, width, dtype=triton_route.store_dtype(out_dtype), device=r.device)
        mean = torch.empty(rows, dtype=torch.float32, device=r.device)
        rstd = torch.empty_like(mean)
        tile_rows = add_norm_rows(width)
        _kernels().add_norm_fwd_kernel_y[(_cdiv(rows, tile_rows),)](
            x, r, weight, bias, y, mean, rstd, rows, width, eps, ROWS=tile_rows, CP=padded_width(width))
        ctx.save_for_backward(x, r, weight, mean, rstd)
        ctx.shape, ctx.dtypes = residual.shape, (branch.dtype, residual.dtype, bias.dtype)
        return y.to(out_dtype).reshape(residual.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, r, weight, mean, rstd = ctx.saved_tensors
        rows, width = r.shape
        tile_rows = add_norm_rows(width)
        blocks = _cdiv(rows, tile_rows)
        programs = min(blocks, BACKWARD_PROGRAMS)
        per_program = _cdiv(blocks, programs)
        programs = _cdiv(blocks, per_program)
        grad_sum = torch.empty(rows, width, dtype=triton_route.store_dtype(ctx.dtypes[1]), device=r.device)
        partials = torch.empty(programs, 2, padded_width(width), dtype=torch.float32, device=r.device)
        _kernels().add_norm_bwd_kernel_dx[(programs,)](
            _rows(grad), x, r, weight, mean, rstd, grad_sum, partials, rows, width, per_program, ROWS=tile_rows,
            CP=padded_width(width), INTERPRET=triton_route.interpreting(),
            INTERPRETED_BLOCKS=triton_route.interpreted_bound(per_program))
        grad_weight, grad_bias = partials.sum(0)[:, :width]
        grad_sum = grad_sum.to(ctx.dtypes[1]).reshape(ctx.shape)
        grad_branch = grad_sum if ctx.dtypes[0] == ctx.dtypes[1] else grad_sum.to(ctx.dtypes[0])
        return (grad_branch, grad_sum, grad_weight.to(weight.dtype), grad_bias.to(ctx.dtypes[2]), None, None)


def add_layer_norm(branch: Tensor, residual: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                   out_dtype: torch.dtype | None = None) -> Tensor:
    """``F.layer_norm(residual + branch, (C,), weight, bias, eps).to(out_dtype)`` over the last dim ``C``, in one
    Triton kernel forward and two launches backward where :func:`fuses_add_norm` says so (see the module
    docstring), the PyTorch form elsewhere.

    Args:
        branch: ``(..., C)`` a block branch's output.
        residual: ``(..., C)`` the residual stream (its dtype is the default output dtype).
        weight, bias: ``(C,)`` the LayerNorm's affine parameters.
        eps: the LayerNorm's epsilon.
        out_dtype: the output's dtype (None: the residual's).
    """
    out_dtype = residual.dtype if out_dtype is None else out_dtype
    if bias is not None and fuses_add_norm(branch, residual, weight):
        return _AddLayerNorm.apply(branch, residual, weight, bias, float(eps), out_dtype)
    return F.layer_norm(residual + branch, residual.shape[-1:], weight, bias, eps).to(out_dtype)
