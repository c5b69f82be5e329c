"""Softmax attention (SOFT's stage 4) through ``F.scaled_dot_product_attention``, its bfloat16 operands computed in
float32 in CPU inference.

PyTorch's CPU flash-attention kernel gains nothing from bfloat16 at SOFT's head dim (32): its bfloat16 GEMMs over
32-wide heads are no faster than its float32 ones, and its softmax works in float32 either way. Run on the float32
copies of bfloat16 ``q``, ``k`` and ``v`` (three ``(N, C)`` casts, a small fraction of the N×N work) it is faster at
stage 4's token counts of detection inputs (``benchmarks/softmax_attention.py``), and the attention itself is then
float32 math: the result differs from float64 by the final bfloat16 rounding only, where the bfloat16 kernel also
rounds the N×N probabilities and its sums. Training (a gradient recorded), graphs (``torch.compile``, export) and other
devices keep the call as written.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..precision.autocast import no_autocast
from ..route import Route, decided

__all__ = ['softmax_attention']


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, route: Route | None = None) -> Tensor:
    """``F.scaled_dot_product_attention(q, k, v)`` (default scale, no mask) of ``(B, h, N, d)`` operands; bfloat16
    operands in eager CPU inference (``route``, the forward's; None: the route of ``q``) are attended in float32 and
    the result cast back to bfloat16 (the module docstring gives the reason)."""
    if q.dtype == torch.bfloat16 and decided(route, q).cpu_inference(q, k, v):
        with no_autocast(q.device):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float()).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v)
