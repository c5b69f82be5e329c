"""The value conv of SOFT: one k×k filter per head, shared by the head's channels, as a depthwise conv with a fast
weight gradient.

Forward, and the gradient of the input, are depthwise convs of the channels-last map (fast in oneDNN). The gradient
of the filters is what PyTorch's depthwise conv backward computes slowly on CPU, because it reduces over the whole map
per filter tap. Here it is one more depthwise conv, of the input map with the output gradient as the filter
(``grad_w[c, i, j] = sum_yx x[c, y + i - p, x + j - p] g[c, y, x]``, a k×k output), then summed over each head's
channels: the same sums in another order. That pays from k = 5 (``benchmarks/head_conv.py``,
docs/benchmarks/layer_kernels.md), so 3×3 filters take PyTorch's own backward.

On a CUDA device a channels-last depthwise conv goes to cuDNN, whose kernel for large filters is slower than
PyTorch's own depthwise kernel on contiguous NCHW maps even with the copies in and out, while for small filters
cuDNN's channels-last kernel is the faster (``benchmarks/eager_launches.py``; its runs: docs/benchmarks/README.md).
So from k = :data:`CUDA_NCHW_MIN_KERNEL` (between the measured sizes) the map is copied to NCHW for the conv on CUDA,
and the result handed back channels-last.

On the GPU route a SOFT layer takes :func:`conv_add` instead, where :func:`fuses_conv_add` says so: the attention's
output plus the value conv in one Triton kernel that reads the head-split values in place (no filter cast, no filter
repeated over the head's channels, no layout copy, no separate sum), written token-major for the output projection;
its backward is one launch of the same kernel (the filters turned) for the values' gradient and one for the
filters' partial sums (:mod:`.head_conv_kernels`).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from ..compat import eager_without_custom_ops
from ..custom_ops import differentiable_op
from ..precision.autocast import autocast_cast
from ..route import Route, decided
from ..triton_launch import interpreter_block, once_differentiable
from .head_conv_config import KERNELS as CONV_ADD_KERNELS
from .head_conv_config import MAX_FUSED_HEAD_DIM, MAX_FUSED_KERNEL, NUM_WARPS, block_tokens, padded_head_dim

__all__ = ['CONV_ADD_KERNELS', 'CUDA_NCHW_MIN_KERNEL', 'CUSTOM_BACKWARD_MIN_KERNEL', 'MAX_FUSED_HEAD_DIM',
           'MAX_FUSED_KERNEL', 'conv_add', 'fuses_conv_add', 'head_depthwise_conv', 'nchw_conv', 'uses_custom_backward',
           'uses_nchw_route']

CUSTOM_BACKWARD_MIN_KERNEL = 5
CUDA_NCHW_MIN_KERNEL = 7


def _expand(weight: Tensor, head_dim: int) -> Tensor:
    return weight.repeat_interleave(head_dim, dim=0)  # (h, 1, k, k) -> (h*d, 1, k, k)


def _conv(x: Tensor, weight: Tensor, head_dim: int) -> Tensor:
    """The per-head conv itself (autograd's backward when called outside the custom op)."""
    return F.conv2d(x, _expand(weight, head_dim), padding=weight.shape[-1] // 2, groups=x.shape[1])


def _conv_backward(grad_out: Tensor, x: Tensor, weight: Tensor, head_dim: int) -> tuple[Tensor, Tensor]:
    """``(grad_x, grad_weight)``: the transposed conv for x, and the taps as one more depthwise conv for the filters."""
    kernel = weight.shape[-1]
    batch, channels, height, width = x.shape
    # one common dtype (the op's entry already cast both to the autocast dtype, as autocast casts a conv's operands,
    # so under autocast this backward runs in bfloat16 as autocast's own conv backward does)
    dtype = torch.promote_types(x.dtype, weight.dtype)
    grad_out = grad_out.to(dtype)
    # the transposed conv of stride 1: the flipped filter, same padding
    grad_x = _conv(grad_out, weight.to(dtype).flip(-2, -1), head_dim).to(x.dtype)
    # every (sample, channel) map correlated with its own output gradient: batch folded into the channels
    maps = x.to(dtype).contiguous().reshape(1, batch * channels, height, width)
    filters = grad_out.contiguous().reshape(batch * channels, 1, height, width)
    taps = F.conv2d(maps, filters, padding=kernel // 2, groups=batch * channels)  # (1, B*C, k, k)
    grad_weight = taps.reshape(batch, -1, head_dim, kernel, kernel).sum((0, 2)).unsqueeze(1).to(weight.dtype)
    return grad_x, grad_weight


# Custom ops (soft_mm::head_depthwise_conv and its backward), so that torch.compile records one node each and runs
# these kernels; their fake kernels are the same functions run on fake tensors, which gives the real layouts.
_head_conv_op, _ = differentiable_op(
    'head_depthwise_conv', _conv, '(Tensor x, Tensor weight, int head_dim) -> Tensor', _conv,
    backward=_conv_backward,
    backward_schema='(Tensor grad_out, Tensor x, Tensor weight, int head_dim) -> (Tensor, Tensor)',
    backward_fake=_conv_backward, save=lambda inputs, output: ((inputs[0], inputs[1]), (inputs[2],)))


def nchw_conv(x: Tensor, weight: Tensor, head_dim: int) -> Tensor:
    """The per-head conv through a contiguous NCHW copy of ``x`` (PyTorch's own depthwise kernel on CUDA), the result
    handed back channels-last unless ``x`` was NCHW."""
    out = _conv(x.contiguous(), weight, head_dim)
    return out if x.is_contiguous() else out.contiguous(memory_format=torch.channels_last)


def uses_nchw_route(device_type: str, kernel: int) -> bool:
    """Whether :func:`head_depthwise_conv` takes :func:`nchw_conv`: on CUDA from k = :data:`CUDA_NCHW_MIN_KERNEL`."""
    return device_type == 'cuda' and kernel >= CUDA_NCHW_MIN_KERNEL


def uses_custom_backward(device_type: str, kernel: int) -> bool:
    """Whether :func:`head_depthwise_conv` takes this module's backward: on CPU from k =
    :data:`CUSTOM_BACKWARD_MIN_KERNEL` (where it was measured to pay); elsewhere PyTorch's own (unmeasured there)."""
    return device_type == 'cpu' and kernel >= CUSTOM_BACKWARD_MIN_KERNEL


@eager_without_custom_ops
def head_depthwise_conv(x: Tensor, weight: Tensor, head_dim: int, route: Route | None = None) -> Tensor:
    """Depthwise conv of ``x (B, h*d, H, W)`` with one filter per head, ``weight (h, 1, k, k)`` (odd k, zero padding
    k // 2), channel ``head * d + j`` filtered by ``weight[head]``: ``F.conv2d(x, weight.repeat_interleave(d, 0),
    padding=k // 2, groups=h*d)``. Where :func:`uses_custom_backward` says so (CPU, k >= 5) it is the custom op
    ``soft_mm::head_depthwise_conv`` with the faster backward of this module (first order only), its operands cast
    as autocast casts a conv's (:func:`~soft_mm.ops.precision.autocast_cast`); otherwise plain autograd, through
    :func:`nchw_conv` where :func:`uses_nchw_route` says so (CUDA, k >= :data:`CUDA_NCHW_MIN_KERNEL`). ``route``: the
    forward's (None: the route of ``x``; CPU tensors counting a GPU's launches take CUDA's)."""
    if weight.ndim != 4 or weight.shape[1] != 1 or weight.shape[-1] != weight.shape[-2] or weight.shape[-1] % 2 == 0:
        raise ValueError(f'head_depthwise_conv: weight must be (heads, 1, k, k) with odd k, got {tuple(weight.shape)}')
    if x.ndim != 4 or x.shape[1] != weight.shape[0] * head_dim:
        raise ValueError(f'head_depthwise_conv: x must be (B, heads * head_dim, H, W) = (B, {weight.shape[0]} * '
                         f'{head_dim}, H, W), got {tuple(x.shape)}')
    route = decided(route, x)
    device_type = route.device_type
    if uses_nchw_route(device_type, weight.shape[-1]):
        return nchw_conv(x, weight, head_dim)
    # under torch.compile the custom op for every filter size: inductor's lowering of this depthwise conv on a
    # channels-last map with symbolic sizes fails (torch 2.14, dynamic=True: "cannot determine truth value of
    # Relational"); as one opaque node it runs the eager kernels
    if not uses_custom_backward(device_type, weight.shape[-1]) and route.mode != 'compile':
        return _conv(x, weight, head_dim)
    return _head_conv_op(*autocast_cast(x, weight), head_dim)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def fuses_conv_add(route: Route, conv: torch.nn.Module, v: Tensor, out: Tensor) -> bool:
    """Whether :func:`conv_add` takes ``out + conv(v)`` on this route: an eager call on the GPU route whose Triton
    kernels take the tensors' dtypes (``route.fused``), plain tensors, ``conv`` a plain ``nn.Conv2d`` of one odd
    k x k filter per head (bias-free, stride 1, same padding, no dilation) with k <= :data:`MAX_FUSED_KERNEL`, heads
    at most :data:`MAX_FUSED_HEAD_DIM` wide."""
    if type(conv) is not torch.nn.Conv2d or not route.gpu:
        return False
    weight, (_, heads, _, head_dim) = conv.weight, v.shape
    kernel = weight.shape[-1]
    return (route.fused(v, out) and type(v) in _PLAIN and type(out) in _PLAIN and type(weight) in _PLAIN
            and conv.bias is None and tuple(weight.shape) == (heads, 1, kernel, kernel) and kernel % 2 == 1
            and kernel <= MAX_FUSED_KERNEL and head_dim <= MAX_FUSED_HEAD_DIM and conv.stride == (1, 1)
            and conv.dilation == (1, 1) and conv.padding == (kernel // 2, kernel // 2) and conv.groups == heads
            and conv.padding_mode == 'zeros')


def _strided(t: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    return t, t.stride()


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    return t if t.dtype == dtype else t.to(dtype)


def _head_major(tokens: Tensor, heads: int) -> Tensor:
    """``(B, N, h*d) -> (B, h, N, d)``, a view where ``tokens`` is contiguous."""
    b, n, c = tokens.shape
    return tokens.reshape(b, n, heads, c // heads).transpose(1, 2)


class _ConvAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v: Tensor, out: Tensor, weight: Tensor, hw_shape: tuple[int, int], route: Route) -> Tensor:
        batch, heads, n, head_dim = v.shape
        kernel = weight.shape[-1]
        dtype = torch.promote_types(out.dtype, v.dtype)
        y = torch.empty(batch, n, heads * head_dim, dtype=route.store_dtype(dtype), device=v.device)
        weight = weight.contiguous()
        sizes = (*hw_shape, heads, head_dim)
        padded = padded_head_dim(head_dim)
        block = interpreter_block(n) if route.interpret else block_tokens(padded)
        grid = (-(-n // block), batch * heads)
        meta = _forward_meta(padded, kernel, block, False, True)
        route.launch(_kernels(route).head_conv_fwd_kernel_y, grid,
                     (_strided(v), _strided(out), weight, _strided(_head_major(y, heads)), sizes), meta)
        ctx.save_for_backward(v, weight)
        ctx.options = sizes, grid, block, padded, route, out.dtype
        ctx.set_materialize_grads(False)
        return _as(y, dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor | None) -> tuple[Tensor | None, ...]:
        if grad is None:
            return None, None, None, None, None
        v, weight = ctx.saved_tensors
        sizes, grid, block, padded, route, out_dtype = ctx.options
        heads, head_dim = sizes[2], sizes[3]
        kernel = weight.shape[-1]
        kernels = _kernels(route)
        grad_heads = _head_major(grad.contiguous(), heads)
        grad_v = grad_weight = None
        if ctx.needs_input_grad[0]:
            batch, _, n, _ = v.shape
            grad_tokens = torch.empty(batch, n, heads * head_dim, dtype=route.store_dtype(v.dtype), device=v.device)
            # (the transposed conv: the filters turned, nothing added; the second tensor is a placeholder)
            route.launch(kernels.head_conv_fwd_kernel_y, grid,
                         (_strided(grad_heads), _strided(grad_heads), weight, _strided(_head_major(grad_tokens, heads)),
                          sizes), _forward_meta(padded, kernel, block, True, False))
            grad_v = _as(_head_major(grad_tokens, heads), v.dtype)
        if ctx.needs_input_grad[2]:
            partials = torch.empty(grid[0] * v.shape[0], heads, kernel * kernel, dtype=torch.float32,
                                   device=v.device)
            route.launch(kernels.head_conv_bwd_kernel_dw, grid, (_strided(v), _strided(grad_heads), partials, sizes),
                         _dw_meta(padded, kernel, block))
            grad_weight = partials.sum(0).reshape(weight.shape).to(weight.dtype)
        grad_out = _as(grad_heads, out_dtype) if ctx.needs_input_grad[1] else None
        return grad_v, grad_out, grad_weight, None, None


@functools.lru_cache(maxsize=64)
def _forward_meta(padded: int, kernel: int, block: int, flip: bool, add: bool) -> dict:
    return dict(BLOCK=block, DP=padded, K=kernel, FLIP=flip, HAS_ADD=add, num_warps=NUM_WARPS)


@functools.lru_cache(maxsize=64)
def _dw_meta(padded: int, kernel: int, block: int) -> dict:
    return dict(BLOCK=block, DP=padded, K=kernel, num_warps=NUM_WARPS)


def _kernels(route: Route):
    return route.kernels(f'{__package__}.head_conv_kernels')


def conv_add(v: Tensor, out: Tensor, weight: Tensor, hw_shape: tuple[int, int], route: Route) -> Tensor:
    """``out + `` the per-head depthwise conv of ``v`` (:func:`head_depthwise_conv`'s filters ``weight (h, 1, k, k)``,
    zero padding k // 2), token-major: ``v`` and ``out`` ``(B, h, N, d)`` (any strides: head-split views read in
    place) with ``N = H * W`` tokens of the ``hw_shape`` map in row-major order; returns ``(B, N, h*d)``, contiguous,
    in the dtype ``out`` and ``v`` promote to. One Triton kernel forward, two launches and a sum backward; the sums in
    float32 from the filters as they are (not cast to the autocast dtype first). For the route's fused kernels
    (:func:`fuses_conv_add`).

    Raises:
        ValueError: ``v`` and ``out`` not of one ``(B, h, H * W, d)`` shape, or ``weight`` not ``(h, 1, k, k)`` with odd
            k.
    """
    hw_shape = tuple(hw_shape)
    if v.ndim != 4 or out.shape != v.shape or len(hw_shape) != 2 or hw_shape[0] * hw_shape[1] != v.shape[2]:
        raise ValueError(f'conv_add: v and out must be (B, h, H * W, d) with hw_shape (H, W), got {tuple(v.shape)}, '
                         f'{tuple(out.shape)} and hw_shape {hw_shape}')
    kernel = weight.shape[-1]
    if tuple(weight.shape) != (v.shape[1], 1, kernel, kernel) or kernel % 2 == 0:
        raise ValueError(f'conv_add: weight must be (heads, 1, k, k) with odd k and heads = {v.shape[1]}, got '
                         f'{tuple(weight.shape)}')
    return _ConvAdd.apply(v, out, weight, hw_shape, route)
