"""The value conv of SOFT: one k×k filter per head, shared by the head's channels, as a depthwise conv with a fast
weight gradient.

Forward, and the gradient of the input, are depthwise convs of the channels-last map (fast in oneDNN). The gradient
of the filters is what PyTorch's depthwise conv backward computes slowly on CPU (measured at 200×336 tokens, 64
channels, k = 9: 190 ms, ten times its forward), because it reduces over the whole map per filter tap. Here it is one
more depthwise conv, of the input map with the output gradient as the filter (``grad_w[c, i, j] = sum_yx
x[c, y + i - p, x + j - p] g[c, y, x]``, a k×k output), then summed over each head's channels: the same sums in
another order. That pays from k = 7 (measured, forward+backward: k = 9 at 200×336 2.6x faster, k = 7 at 100×168
1.6x; k = 5 no faster, k = 3 slower), so smaller filters take PyTorch's own backward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ['CUSTOM_BACKWARD_MIN_KERNEL', 'head_depthwise_conv']

CUSTOM_BACKWARD_MIN_KERNEL = 7


def _expand(weight: Tensor, head_dim: int) -> Tensor:
    return weight.repeat_interleave(head_dim, dim=0)  # (h, 1, k, k) -> (h*d, 1, k, k)


def _conv(x: Tensor, weight: Tensor, head_dim: int) -> Tensor:
    """The per-head conv itself (autograd's backward when called outside :class:`_HeadDepthwiseConv`)."""
    return F.conv2d(x, _expand(weight, head_dim), padding=weight.shape[-1] // 2, groups=x.shape[1])


class _HeadDepthwiseConv(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, head_dim: int) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.head_dim = head_dim
        return _conv(x, weight, head_dim)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        x, weight = ctx.saved_tensors
        head_dim, kernel = ctx.head_dim, weight.shape[-1]
        batch, channels, height, width = x.shape
        # under autocast the forward ran in low precision while x or the weight stayed float32: one common dtype
        dtype = torch.promote_types(x.dtype, weight.dtype)
        grad_out = grad_out.to(dtype)
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:  # the transposed conv of stride 1: the flipped filter, same padding
            grad_x = _conv(grad_out, weight.to(dtype).flip(-2, -1), head_dim).to(x.dtype)
        if ctx.needs_input_grad[1]:
            # every (sample, channel) map correlated with its own output gradient: batch folded into the channels
            maps = x.to(dtype).contiguous().reshape(1, batch * channels, height, width)
            filters = grad_out.contiguous().reshape(batch * channels, 1, height, width)
            taps = F.conv2d(maps, filters, padding=kernel // 2, groups=batch * channels)  # (1, B*C, k, k)
            grad_weight = taps.reshape(batch, -1, head_dim, kernel, kernel).sum((0, 2)).unsqueeze(1).to(weight.dtype)
        return grad_x, grad_weight, None


def head_depthwise_conv(x: Tensor, weight: Tensor, head_dim: int) -> Tensor:
    """Depthwise conv of ``x (B, h*d, H, W)`` with one filter per head, ``weight (h, 1, k, k)`` (odd k, zero padding
    k // 2), channel ``head * d + j`` filtered by ``weight[head]``: ``F.conv2d(x, weight.repeat_interleave(d, 0),
    padding=k // 2, groups=h*d)``. From k = :data:`CUSTOM_BACKWARD_MIN_KERNEL` its backward is the faster one of this
    module (first order only); smaller filters use autograd's."""
    if weight.ndim != 4 or weight.shape[1] != 1 or weight.shape[-1] != weight.shape[-2] or weight.shape[-1] % 2 == 0:
        raise ValueError(f'head_depthwise_conv: weight must be (heads, 1, k, k) with odd k, got {tuple(weight.shape)}')
    if x.ndim != 4 or x.shape[1] != weight.shape[0] * head_dim:
        raise ValueError(f'head_depthwise_conv: x must be (B, heads * head_dim, H, W) = (B, {weight.shape[0]} * '
                         f'{head_dim}, H, W), got {tuple(x.shape)}')
    if weight.shape[-1] < CUSTOM_BACKWARD_MIN_KERNEL:
        return _conv(x, weight, head_dim)
    return _HeadDepthwiseConv.apply(x, weight, head_dim)
