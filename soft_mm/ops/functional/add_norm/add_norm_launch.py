"""A post-norm block's ``LayerNorm(residual + branch)``, cast to the stream's dtype, in one kernel on the GPU route;
with the branch's bias, stochastic depth's per-sample scale and a GELU after the norm folded into the same kernel.

On CUDA under autocast, ``x = norm(x + drop_path(proj(out))).to(x.dtype)`` is many launches forward (the projection's
bias, the drop-path mask and its scale, the sum, LayerNorm's input cast to float32, LayerNorm, the cast back) and about
as many backward. :func:`add_layer_norm` runs ``s = residual + scale * (branch + branch_bias)``, the statistics and the
normalisation in float32 in one Triton kernel (``add_norm_fwd_kernel_y``) and writes the result in the stream's dtype;
its backward is one kernel for the gradients of ``s`` and of the branch (``s`` rebuilt from the addends rather than
stored) with per-program partial sums of the gradients of the norm's weight and bias and of the branch's bias, summed
after: two launches. The same kernels without a residual and with a GELU after the norm are the SOFT layers' landmark
sampler's LayerNorm and GELU (:func:`layer_norm_gelu`). Everywhere else (CPU, a graph being traced or compiled, where
the compiler fuses the same passes itself) it is the PyTorch form (:mod:`.add_norm_reference`). The sum in float32 is
at least as accurate as the PyTorch form's, which rounds it to the stream's dtype before normalising.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from ...route import Route, decided
from ...triton_launch import interpreter_block, once_differentiable
from .add_norm_config import BACKWARD_PROGRAMS, MAX_ADD_NORM_WIDTH, add_norm_rows, padded_width
from .add_norm_reference import add_layer_norm_reference

__all__ = ['MAX_ADD_NORM_WIDTH', 'add_layer_norm', 'fuses_add_norm', 'layer_norm_gelu']


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def _kernels(route: Route):
    return route.kernels(f'{__package__}.add_norm_kernels')


def fuses_add_norm(branch: Tensor, residual: Tensor | None, weight: Tensor | None, route: Route | None = None) -> bool:
    """Whether :func:`add_layer_norm` takes its fused kernels for these tensors: an eager call on the GPU route whose
    Triton kernels take their dtypes (``route``, the forward's; None: the route of ``branch``), matching shapes (or no
    residual), an affine LayerNorm at most :data:`MAX_ADD_NORM_WIDTH` wide."""
    if weight is None:
        return False
    route = decided(route, branch)
    dtypes = route.triton_dtypes
    if not (route.gpu and branch.dtype in dtypes and type(branch) in _PLAIN and type(weight) in _PLAIN):
        return False
    return branch.shape[-1] <= MAX_ADD_NORM_WIDTH and (
        residual is None or (branch.shape == residual.shape and residual.dtype in dtypes and type(residual) in _PLAIN))


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype`` (itself where it is already)."""
    return t if t.dtype == dtype else t.to(dtype)


# under triton's interpreter a program's tile holds up to this many elements (_interpreter_rows)
INTERPRETER_TILE_ELEMENTS = 1 << 18


def _interpreter_rows(rows: int, width: int) -> int:
    """Rows a program takes at a time where triton's interpreter runs the kernels: all ``rows``
    (:func:`~soft_mm.ops.triton_launch.interpreter_block`), up to :data:`INTERPRETER_TILE_ELEMENTS` in a tile (the
    tests give the interpreter :func:`.add_norm_rows`' compiled tiles here too); each row is normalised alike, the
    weight's gradient summed in other groupings."""
    return interpreter_block(rows, INTERPRETER_TILE_ELEMENTS // padded_width(width))


@functools.lru_cache(maxsize=256)
def _launch_sizes(rows: int, width: int, interpret: bool) -> tuple[int, int, int, int, int]:
    """``(ROWS, CP, forward programs, backward programs, row blocks per backward program)`` for a ``(rows, width)``
    matrix, compiled or (``interpret``) interpreted (worked out once per size: an eager GPU step waits for this
    Python)."""
    tile_rows = _interpreter_rows(rows, width) if interpret else add_norm_rows(width)
    blocks = _cdiv(rows, tile_rows)
    per_program = _cdiv(blocks, min(blocks, BACKWARD_PROGRAMS))
    return tile_rows, padded_width(width), blocks, _cdiv(blocks, per_program), per_program


@functools.lru_cache(maxsize=1024)
def _meta(tile_rows: int, padded: int, residual: bool, branch_bias: bool, scale: bool, gelu: bool, last: bool,
          ) -> dict:
    """The constexprs of a launch: the tile, which addends there are, the GELU, and ``last`` (the forward's
    ``STORE_SUM``, the backward's ``HAS_DSUM``) under ``'LAST'``, renamed by the caller."""
    return dict(ROWS=tile_rows, CP=padded, HAS_RESIDUAL=residual, HAS_BRANCH_BIAS=branch_bias, HAS_SCALE=scale,
                GELU=gelu, LAST=last)


@functools.lru_cache(maxsize=1024)
def _forward_meta(*key) -> dict:
    meta = dict(_meta(*key))
    meta['STORE_SUM'] = meta.pop('LAST')
    return meta


@functools.lru_cache(maxsize=1024)
def _backward_meta(*key) -> dict:
    meta = dict(_meta(*key))
    meta['HAS_DSUM'] = meta.pop('LAST')
    return meta


class _AddLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, branch: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor,
                branch_bias: Tensor | None, branch_scale: Tensor | None, eps: float, out_dtype: torch.dtype,
                gelu: bool, return_sum: bool, route: Route) -> Tensor | tuple[Tensor, Tensor]:
        # (the tensors in their own shapes: the kernels read and write rows of contiguous memory)
        x = branch.contiguous()
        r = x if residual is None else residual.contiguous()
        width = x.shape[-1]
        rows = x.numel() // width
        tile_rows, padded, blocks, _, _ = _launch_sizes(rows, width, route.interpret)
        per_sample = rows // x.shape[0]
        y = torch.empty(x.shape, dtype=route.store_dtype(out_dtype), device=x.device)
        total = torch.empty_like(r, dtype=route.store_dtype(r.dtype)) if return_sum else y
        stats = torch.empty(2, rows, dtype=torch.float32, device=x.device)
        flags = (residual is not None, branch_bias is not None, branch_scale is not None, gelu)
        bb = x if branch_bias is None else branch_bias
        sc = x if branch_scale is None else branch_scale
        route.launch(_kernels(route).add_norm_fwd_kernel_y, (blocks,),
                     ((x, r, bb, sc), (weight, bias), y, total, stats, (rows, width, per_sample), eps),
                     _forward_meta(tile_rows, padded, *flags, return_sum))
        ctx.save_for_backward(x, r, bb, sc, weight, bias, stats)
        ctx.options = flags, per_sample, rows, route
        ctx.dtypes = (branch.dtype, None if residual is None else residual.dtype,
                      None if branch_bias is None else branch_bias.dtype)
        ctx.set_materialize_grads(False)
        y = _as(y, out_dtype)  # (a float32 store where the interpreter runs the kernels)
        return (_as(total, r.dtype), y) if return_sum else y

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        x, r, bb, sc, weight, bias, stats = ctx.saved_tensors
        grad, grad_total = grads[-1], grads[0] if len(grads) == 2 else None
        flags, per_sample, rows, route = ctx.options
        has_residual, _, has_scale, _ = flags
        branch_dtype, residual_dtype, branch_bias_dtype = ctx.dtypes
        shape, width = x.shape, x.shape[-1]
        if grad is None:  # (the sum used, its norm not: the norm's gradient is zero)
            grad = x.new_zeros(())
        tile_rows, padded, _, programs, per_program = _launch_sizes(rows, width, route.interpret)
        # the gradient of the sum, in the residual's dtype (the branch's without a residual)
        grad_sum = torch.empty(shape, dtype=route.store_dtype(residual_dtype or branch_dtype), device=x.device)
        grad_x = (torch.empty(shape, dtype=route.store_dtype(branch_dtype), device=x.device)
                  if has_scale else grad_sum)
        partials = torch.empty(programs, 3, padded, dtype=torch.float32, device=x.device)
        grad_rows = (grad.expand(shape) if grad.ndim == 0 else grad).contiguous()
        route.launch(_kernels(route).add_norm_bwd_kernel_dx, (programs,),
                     ((grad_rows, x if grad_total is None else grad_total.contiguous()), (grad_sum, grad_x),
                      (x, r, bb, sc), (weight, bias), stats, partials, (rows, width, per_sample), per_program),
                     _backward_meta(tile_rows, padded, *flags, grad_total is not None))
        sums = partials.sum(0)
        grad_weight, grad_bias, grad_branch_bias = (sums if padded == width else sums[:, :width]).unbind(0)
        grad_branch = _as(grad_x, branch_dtype)
        grad_residual = None
        if has_residual:
            grad_residual = _as(grad_sum, residual_dtype)
            if not has_scale and branch_dtype == residual_dtype:
                grad_branch = grad_residual  # one tensor for both addends' equal gradients
        return (grad_branch, grad_residual, _as(grad_weight, weight.dtype), _as(grad_bias, bias.dtype),
                None if branch_bias_dtype is None else _as(grad_branch_bias, branch_bias_dtype), None, None, None, None,
                None, None)


def add_layer_norm(branch: Tensor, residual: Tensor | None, weight: Tensor | None, bias: Tensor | None, eps: float,
                   out_dtype: torch.dtype | None = None, *, branch_bias: Tensor | None = None,
                   branch_scale: Tensor | None = None, gelu: bool = False, return_sum: bool = False,
                   route: Route | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """``F.layer_norm(s, (C,), weight, bias, eps).to(out_dtype)`` of ``s = residual + branch_scale * (branch +
    branch_bias)`` over the last dim ``C`` (a GELU after the norm where ``gelu``), in one Triton kernel forward and two
    launches backward where :func:`fuses_add_norm` says so (see the module docstring), the PyTorch form elsewhere;
    ``(s, norm)`` where ``return_sum`` (a pre-norm block's residual stream after the sum, in the residual's dtype,
    and the next branch's normalised input).

    Args:
        branch: ``(B, ..., C)`` a block branch's output.
        residual: ``(B, ..., C)`` the residual stream (its dtype is the default output dtype), or None.
        weight, bias: ``(C,)`` the LayerNorm's affine parameters.
        eps: the LayerNorm's epsilon.
        out_dtype: the output's dtype (None: the residual's, or the branch's without one).
        branch_bias: ``(C,)`` a bias added to the branch (its last linear layer's, run without it), or None.
        branch_scale: ``(B,)`` a scale of each sample's branch (stochastic depth's ``mask / keep``), or None.
        gelu: apply the exact GELU to the normalised result.
        return_sum: return the sum ``s`` too.
        route: the forward's :class:`~soft_mm.ops.route.Route` (None: the route of ``branch``).
    """
    if out_dtype is None:
        out_dtype = (branch if residual is None else residual).dtype
    if branch_scale is not None and tuple(branch_scale.shape) != (branch.shape[0],):
        raise ValueError(f'add_layer_norm: branch_scale must have one value per sample, shape ({branch.shape[0]},), '
                         f'got {tuple(branch_scale.shape)}')
    route = decided(route, branch)
    if bias is not None and fuses_add_norm(branch, residual, weight, route):
        return _AddLayerNorm.apply(branch, residual, weight, bias, branch_bias, branch_scale, float(eps), out_dtype,
                                   bool(gelu), bool(return_sum), route)
    return add_layer_norm_reference(branch, residual, weight, bias, eps, out_dtype, branch_bias, branch_scale, gelu,
                                    return_sum)


def layer_norm_gelu(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                    out_dtype: torch.dtype | None = None, route: Route | None = None) -> Tensor:
    """``F.gelu(F.layer_norm(x, (C,), weight, bias, eps)).to(out_dtype)``: one kernel forward and two launches
    backward on the GPU route (:func:`add_layer_norm` without a residual), statistics and GELU in float32."""
    return add_layer_norm(x, None, weight, bias, eps, out_dtype, gelu=True, route=route)
