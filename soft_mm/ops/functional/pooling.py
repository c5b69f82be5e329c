"""Adaptive average pooling written as two matmuls: for graphs whose input size stays symbolic (ONNX, torch.export),
and for token-major (NHWC) maps, which it pools without a change of memory layout.

``F.adaptive_avg_pool2d`` has no ONNX operator for a general output size, and its decomposition branches on the input
size (divisible or not), which freezes a traced graph at the trace resolution. Here the pooling bins are built from
``arange`` over the symbolic sizes, so one exported graph pools any input size.
"""
import functools

import torch
from torch import Tensor

from ..route import Route, decided

__all__ = ['adaptive_avg_pool2d_matmul', 'adaptive_avg_pool_tokens']


def _pool_matrix(in_size: int, out_size: int, like: Tensor) -> Tensor:
    """``(out_size, in_size)`` averaging matrix of adaptive pooling: row i averages inputs
    ``floor(i * in / out) .. ceil((i + 1) * in / out) - 1`` (PyTorch's bins)."""
    rows = torch.arange(out_size, device=like.device)
    start = (rows * in_size).div(out_size, rounding_mode='floor')
    end = ((rows + 1) * in_size + out_size - 1).div(out_size, rounding_mode='floor')
    cols = torch.arange(in_size, device=like.device)
    inside = (cols[None, :] >= start[:, None]) & (cols[None, :] < end[:, None])
    return inside.to(like.dtype) / (end - start).to(like.dtype)[:, None]


@functools.lru_cache(maxsize=64)
def _cached_pool_matrix(in_size: int, out_size: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    # an ordinary tensor even when first asked for under inference mode, so training may save it for backward later
    with torch.inference_mode(False), torch.no_grad():
        return _pool_matrix(in_size, out_size, torch.empty(0, device=device, dtype=dtype))


def _eager_pool_matrix(in_size: int, out_size: int, like: Tensor, route: Route | None = None) -> Tensor:
    """:func:`_pool_matrix`, built once per size, device and dtype in eager runs (a dozen small kernels fewer per call
    on a GPU, where eager time goes to launches); traced and compiled graphs, calls under a dispatch mode that traces
    (fake tensors, a tracer) and a CUDA graph's capture build it as they go."""
    if not decided(route, like).plain or (like.is_cuda and torch.cuda.is_current_stream_capturing()):
        return _pool_matrix(in_size, out_size, like)
    return _cached_pool_matrix(int(in_size), int(out_size), like.device, like.dtype)


def adaptive_avg_pool2d_matmul(x: Tensor, output_size: tuple[int, int]) -> Tensor:
    """``x (B, C, H, W) -> (B, C, out_h, out_w)``, equal to ``F.adaptive_avg_pool2d(x, output_size)`` up to rounding.

    Costs ``O(B C (out_h H W + out_h out_w W))``; the sizes may be symbolic (``SymInt``) under tracing.
    """
    out_h, out_w = output_size
    rows = _pool_matrix(x.shape[-2], out_h, x)  # (out_h, H)
    cols = _pool_matrix(x.shape[-1], out_w, x)  # (out_w, W)
    return rows @ x @ cols.transpose(0, 1)


def adaptive_avg_pool_tokens(x: Tensor, output_size: tuple[int, int], route: Route | None = None) -> Tensor:
    """Adaptive average pooling of a token-major map ``x (B, H, W, C) -> (B, out_h, out_w, C)``.

    Equal to ``F.adaptive_avg_pool2d`` of the ``(B, C, H, W)`` map up to rounding, as two matmuls that read and write
    NHWC memory (first over W, then over H), forward and backward. PyTorch's pooling kernels instead convert a large
    channels-last map to NCHW and back in the backward, which costs several times the pooling itself. ``route``: the
    forward's (None: the route of ``x``); eager calls on plain tensors keep the pooling matrices per size.
    """
    out_h, out_w = output_size
    batch, height, width, channels = x.shape
    route = decided(route, x)
    cols = _eager_pool_matrix(width, out_w, x, route)  # (out_w, W)
    rows = _eager_pool_matrix(height, out_h, x, route)  # (out_h, H)
    x = torch.matmul(cols, x)  # (B, H, out_w, C)
    return torch.matmul(rows, x.reshape(batch, height, out_w * channels)).reshape(batch, out_h, out_w, channels)
