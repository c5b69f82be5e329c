"""Many tensors cast to one dtype in a few launches, differentiably: the weights of a backbone cast once per forward
under autocast, instead of autocast casting each weight at each layer call (one launch forward and one backward per
weight, hundreds per training step).

:func:`flat_cast` concatenates the tensors into one flat buffer, scales segments of it in place where asked (a scale
folded into a weight, as SOFT's query scale), casts the buffer once and hands back views of it; the backward does the
reverse (one concatenation of the gradients, one cast, the segments scaled). The values are those of casting each
scaled tensor by itself (``(t * scale).to(dtype)``: the product in the tensors' dtype, then one rounding), forward and
backward, so a model that takes them computes what autocast's per-call casts give it.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ['flat_cast']


def _scale_segments(flat: Tensor, segments: Sequence[tuple[int, int, float]]) -> None:
    for start, end, scale in segments:
        flat[start:end].mul_(scale)


class _FlatCast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dtype: torch.dtype, segments: tuple[tuple[int, int, float], ...], *tensors: Tensor,
                ) -> tuple[Tensor, ...]:
        ctx.set_materialize_grads(False)
        ctx.segments = segments
        ctx.metas = [(t.shape, t.dtype, t.device) for t in tensors]
        flat = torch.cat([t.reshape(-1) for t in tensors])
        _scale_segments(flat, segments)
        low = flat.to(dtype)
        outputs, start = [], 0
        for t in tensors:
            outputs.append(low[start:start + t.numel()].view(t.shape))
            start += t.numel()
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        present = [g for g in grads if g is not None]
        if not present:
            return (None, None, *([None] * len(grads)))
        low = present[0].dtype
        parts = [g.reshape(-1) if g is not None else torch.zeros(shape.numel(), dtype=low, device=device)
                 for g, (shape, _, device) in zip(grads, ctx.metas)]
        flat = torch.cat(parts).to(ctx.metas[0][1])
        _scale_segments(flat, ctx.segments)
        out, start = [], 0
        for g, (shape, _, _) in zip(grads, ctx.metas):
            out.append(None if g is None else flat[start:start + shape.numel()].view(shape))
            start += shape.numel()
        return (None, None, *out)


def flat_cast(tensors: Sequence[Tensor], dtype: torch.dtype, scales: Sequence[float] | None = None,
              ) -> tuple[Tensor, ...]:
    """``tuple((t * s).to(dtype) for t, s in zip(tensors, scales))`` in a few launches, differentiable in each tensor.

    Args:
        tensors: tensors of one dtype and device (a model's weights), any shapes.
        dtype: the dtype to cast to (e.g. the autocast dtype).
        scales: a float per tensor (None: 1 for all); tensors with the same scale next to each other share a launch.

    Returns:
        The cast tensors, of the inputs' shapes (contiguous views of one buffer).

    Raises:
        ValueError: the tensors are empty or differ in dtype or device, or ``scales`` does not match them.
    """
    tensors = list(tensors)
    if not tensors:
        raise ValueError('flat_cast: tensors must hold at least one tensor')
    if len({(t.dtype, t.device) for t in tensors}) != 1:
        raise ValueError('flat_cast: the tensors must share one dtype and device, got '
                         f'{sorted({(str(t.dtype), str(t.device)) for t in tensors})}')
    scales = [1.0] * len(tensors) if scales is None else [float(s) for s in scales]
    if len(scales) != len(tensors):
        raise ValueError(f'flat_cast: scales must have one float per tensor ({len(tensors)}), got {len(scales)}')
    segments, start = [], 0
    for t, scale in zip(tensors, scales):
        end = start + t.numel()
        if scale != 1.0:
            if segments and segments[-1][1] == start and segments[-1][2] == scale:
                segments[-1] = (segments[-1][0], end, scale)
            else:
                segments.append((start, end, scale))
        start = end
    return _FlatCast.apply(dtype, tuple(segments), *tensors)
