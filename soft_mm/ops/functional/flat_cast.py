"""Many tensors cast to one dtype in a few launches, differentiably: the weights of a backbone cast once per forward
under autocast, instead of autocast casting each weight at each layer call (one launch forward and one backward per
weight, hundreds per training step).

:func:`flat_cast` concatenates the tensors into one flat buffer, scales segments of it in place where asked (a scale
folded into a weight, as SOFT's query scale; one multi-tensor launch for all segments), casts the buffer once and hands
back views of it, one per tensor or per group of tensors concatenated along their rows (projections that read the same
input, run as one GEMM); the backward does the reverse (one concatenation of the gradients, one cast, the segments
scaled). The values are those of casting each scaled tensor by itself (``(t * scale).to(dtype)``: the product in the
tensors' dtype, then one rounding), forward and backward, so a model that takes them computes what autocast's per-call
casts give it.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ['FlatCastPlan', 'flat_cast']


def _scale_segments(flat: Tensor, segments: Sequence[tuple[int, int, float]]) -> None:
    """Each segment of ``flat`` times its scale, in place: one multi-tensor launch for all of them."""
    if segments:
        torch._foreach_mul_([flat[start:end] for start, end, _ in segments], [scale for _, _, scale in segments])


class _FlatCast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dtype: torch.dtype, plan: FlatCastPlan, *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.set_materialize_grads(False)
        ctx.plan, ctx.source = plan, (tensors[0].dtype, tensors[0].device)
        flat = _flatten(tensors)
        _scale_segments(flat, plan.segments)
        return tuple(_unflatten(flat.to(dtype), plan.group_templates))

    @staticmethod
    def backward(ctx, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        plan = ctx.plan
        present = [g for g in grads if g is not None]
        if not present:
            return (None, None, *([None] * len(plan.tensor_templates)))
        low = present[0].dtype
        dtype, device = ctx.source
        parts = [g if g is not None else torch.zeros(template.shape, dtype=low, device=device)
                 for g, template in zip(grads, plan.group_templates)]
        flat = _flatten(parts).to(dtype)
        _scale_segments(flat, plan.segments)
        out = _unflatten(flat, plan.tensor_templates)
        # each tensor of a group gets its share of the group's gradient (none where the group got none)
        return (None, None, *(None if grads[group] is None else g for g, group in zip(out, plan.tensor_groups)))


def _flatten(tensors: Sequence[Tensor]) -> Tensor:
    """The tensors' elements in one flat buffer (one launch), in C++ (a Python loop over a stage's 60 weights costs
    what a launch does)."""
    return torch._C._nn.flatten_dense_tensors(list(tensors))


def _unflatten(flat: Tensor, templates: Sequence[Tensor]) -> list[Tensor]:
    """Views of ``flat`` shaped as ``templates`` (meta tensors), one after the other, made in C++."""
    return torch._C._nn.unflatten_dense_tensors(flat, list(templates))


def _group_shapes(tensors: list[Tensor], groups: Sequence[int]) -> tuple[tuple[int, torch.Size], ...]:
    """``(numel, shape)`` of each group's output: its tensors concatenated along their first dim."""
    if (any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in groups)
            or sum(groups) != len(tensors)):
        raise ValueError(f'flat_cast: groups must be ints >= 1 summing to the number of tensors ({len(tensors)}), '
                         f'got {list(groups)}')
    shapes, start = [], 0
    for count in groups:
        members = tensors[start:start + count]
        start += count
        if any(t.ndim == 0 or t.shape[1:] != members[0].shape[1:] for t in members):
            raise ValueError('flat_cast: the tensors of a group must have at least one dim and share all but the '
                             f'first, got shapes {[tuple(t.shape) for t in members]}')
        shape = torch.Size((sum(t.shape[0] for t in members), *members[0].shape[1:]))
        shapes.append((shape.numel(), shape))
    return tuple(shapes)


class FlatCastPlan:
    """What :func:`flat_cast` computes from the tensors' shapes, scales and groups, checked once: ``plan(tensors,
    dtype)`` casts tensors of those shapes (the same parameters, step after step) without redoing it.

    Raises:
        ValueError: as :func:`flat_cast`.
    """

    def __init__(self, tensors: Sequence[Tensor], scales: Sequence[float] | None = None,
                 groups: Sequence[int] | None = None) -> None:
        tensors = list(tensors)
        if not tensors:
            raise ValueError('flat_cast: tensors must hold at least one tensor')
        if len({(t.dtype, t.device) for t in tensors}) != 1:
            raise ValueError('flat_cast: the tensors must share one dtype and device, got '
                             f'{sorted({(str(t.dtype), str(t.device)) for t in tensors})}')
        scales = [1.0] * len(tensors) if scales is None else [float(s) for s in scales]
        if len(scales) != len(tensors):
            raise ValueError(f'flat_cast: scales must have one float per tensor ({len(tensors)}), got {len(scales)}')
        groups = [1] * len(tensors) if groups is None else list(groups)
        shapes = _group_shapes(tensors, groups)
        # shape-only stand-ins of the outputs and of the tensors, for the C++ unflattening
        self.group_templates = tuple(torch.empty(shape, device='meta') for _, shape in shapes)
        self.tensor_templates = tuple(torch.empty(t.shape, device='meta') for t in tensors)
        self.tensor_groups = tuple(i for i, count in enumerate(groups) for _ in range(count))
        segments, start = [], 0
        for t, scale in zip(tensors, scales):
            end = start + t.numel()
            if scale != 1.0:
                if segments and segments[-1][1] == start and segments[-1][2] == scale:
                    segments[-1] = (segments[-1][0], end, scale)
                else:
                    segments.append((start, end, scale))
            start = end
        self.segments = tuple(segments)

    def __call__(self, tensors: Sequence[Tensor], dtype: torch.dtype) -> tuple[Tensor, ...]:
        return _FlatCast.apply(dtype, self, *tensors)


def flat_cast(tensors: Sequence[Tensor], dtype: torch.dtype, scales: Sequence[float] | None = None,
              groups: Sequence[int] | None = None) -> tuple[Tensor, ...]:
    """``tuple((t * s).to(dtype) for t, s in zip(tensors, scales))`` in a few launches, differentiable in each tensor;
    with ``groups``, consecutive tensors concatenated into one output.

    Args:
        tensors: tensors of one dtype and device (a model's weights), any shapes.
        dtype: the dtype to cast to (e.g. the autocast dtype).
        scales: a float per tensor (None: 1 for all); tensors with the same scale next to each other share a launch.
        groups: how many consecutive tensors each output holds, concatenated along their first dim (e.g. ``[2, 1]``:
            the first two tensors as one output, as a fused projection's weight, then the third); None: one each.

    Returns:
        The cast tensors (or groups), contiguous views of one buffer.

    Raises:
        ValueError: the tensors are empty or differ in dtype or device, ``scales`` does not match them, or ``groups``
            does not split them into tensors that can be concatenated.
    """
    return FlatCastPlan(tensors, scales, groups)(tensors, dtype)
