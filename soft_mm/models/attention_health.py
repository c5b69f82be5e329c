"""Attention health of a model: per SOFT layer, how well its landmark kernel is conditioned and inverted.

    from soft_mm.models.attention_health import attention_health, format_health_table
    with torch.no_grad():
        report = attention_health(model, lambda: model(images))   # any callable that runs the model
    print(format_health_table(report))

Forward hooks on every :class:`~soft_mm.models.attention.SoftAttention`'s ``landmark_probe`` (an ``nn.Identity``)
copy the landmarks that the forward actually used; the figures are then computed from those landmarks in float64
(:func:`landmark_kernel_health`) with the layer's own ``newton_iters`` and
``newton_ridge``. The hooks only read, so the model's outputs are bit-identical with and without them.

SOFT's attention ``K1 A^+ K1^T v`` is only as good as its m×m landmark kernel ``A = K(landmarks, landmarks)``:

* when the landmarks nearly coincide under the kernel's bandwidth, ``A`` tends to the all-ones matrix (rank one,
  eigenvalues m, 0, ..., 0) and the whole Nyström term to a rank-one map: every token gets the same mixture of values;
  ``cond(A + ridge I)`` then sits at its ceiling ``(m + ridge) / ridge``;
* ``num_iters`` Newton–Schulz iterations invert ``A + ridge I`` only up to a condition number of about
  ``2^((num_iters - 6) / 2)`` (:func:`~soft_mm.ops.soft.newton.newton_inverse`): beyond it the residual
  ``||(A + ridge I) X - I||_F / sqrt(m)`` stays O(1), the forward uses a truncated inverse and the implicit backward
  differentiates an inverse the forward did not compute.

:func:`~soft_mm.ops.soft.kernel_health.landmark_kernel_health` measures both for a batch of landmark sets (torch
only, any caller's landmarks; re-exported here); :func:`attention_health` for every SOFT layer of a model.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from typing_extensions import Self

from ..ops.soft.kernel_health import (
    DEFAULT_MAX_ITERS,
    DEFAULT_TARGET_RESIDUAL,
    KernelHealth,
    landmark_kernel_health,
    newton_residuals,
)
from .attention import SoftAttention

__all__ = ['DEFAULT_MAX_ITERS', 'DEFAULT_TARGET_RESIDUAL', 'KernelHealth', 'LandmarkRecorder', 'LayerHealth',
           'attention_health', 'format_health_table', 'health_scalars', 'landmark_kernel_health', 'newton_residuals',
           'short_layer_name']

_STAGE_BLOCK = re.compile(r'stages\.(\d+)\.blocks\.(\d+)\.attn$')


def short_layer_name(name: str) -> str:
    """``'backbone.stages.0.blocks.1.attn'`` -> ``'s1.b1'`` (stage counted from 1, block from 0); other names as
    they are."""
    match = _STAGE_BLOCK.search(name)
    return f's{int(match[1]) + 1}.b{match[2]}' if match else name


@dataclasses.dataclass
class LayerHealth:
    """One SOFT layer's figures over every (sample, head) landmark set recorded in it.

    Attributes:
        name: the layer's module name (``backbone.stages.0.blocks.0.attn``).
        tokens: N, the largest token count the layer saw.
        num_landmarks: m, the largest landmark count.
        num_sets: how many (sample, head) landmark kernels the figures cover.
        newton_iters, ridge: the layer's settings the figures use.
        condition_max, condition_median: ``cond(A + ridge I)``; its ceiling is ``(m + ridge) / ridge``, where every
            landmark coincides.
        effective_rank_min, effective_rank_median: eigenvalues of ``A`` above the ridge.
        residual_max, residual_median: ``||(A + ridge I) X - I||_F / sqrt(m)`` after ``newton_iters`` iterations.
        iters_to_target: the iterations every set needs to reach ``target_residual`` (None: not within ``max_iters``).
        target_residual: the residual ``iters_to_target`` asks for.
        branch_ratio: mean token norm of the layer's output (Nyström term + local term, projected) over that of its
            input: how much the attention adds to the residual stream.
        uniformity: mean cosine similarity of each token's output to the mean output over the tokens: near 1, the
            layer adds the same vector to every token (what a collapsed, rank-one Nyström term does).
    """

    name: str
    tokens: int
    num_landmarks: int
    num_sets: int
    newton_iters: int
    ridge: float
    condition_max: float
    condition_median: float
    effective_rank_min: int
    effective_rank_median: float
    residual_max: float
    residual_median: float
    iters_to_target: int | None
    target_residual: float
    branch_ratio: float
    uniformity: float

    @property
    def short_name(self) -> str:
        return short_layer_name(self.name)


class LandmarkRecorder:
    """Records the landmarks of every SOFT layer of ``model`` while attached (:meth:`attach` / :meth:`detach`, or
    ``with recorder:``). Each forward of a layer appends one detached copy ``(B, h, m, d)`` of its landmarks to
    :attr:`landmarks` and ``(tokens, branch_ratio, uniformity)`` of its input and output to :attr:`outputs`."""

    def __init__(self, model: nn.Module) -> None:
        self.layers: dict[str, SoftAttention] = {
            name: module for name, module in model.named_modules() if isinstance(module, SoftAttention)}
        self.landmarks: dict[str, list[torch.Tensor]] = {}
        self.outputs: dict[str, list[tuple[int, float, float]]] = {}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def attach(self) -> Self:
        if self._handles:
            return self
        self.clear()
        for name, layer in self.layers.items():
            self._handles.append(layer.register_forward_hook(self._output_hook(name)))
            self._handles.append(layer.landmark_probe.register_forward_hook(self._landmark_hook(name)))
        return self

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def clear(self) -> None:
        """Drop what was recorded."""
        self.landmarks = {name: [] for name in self.layers}
        self.outputs = {name: [] for name in self.layers}

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> Self:
        return self.attach()

    def __exit__(self, *exc_info: object) -> None:
        self.detach()

    def _output_hook(self, name: str) -> Callable[..., None]:
        @torch.no_grad()
        def hook(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
            x, out = args[0].detach().to(torch.float64), output.detach().to(torch.float64)  # (B, N, C)
            ratio = out.norm(dim=-1).mean() / x.norm(dim=-1).mean().clamp_min(torch.finfo(torch.float64).tiny)
            uniformity = F.cosine_similarity(out, out.mean(1, keepdim=True), dim=-1).mean()
            self.outputs[name].append((int(x.shape[1]), float(ratio), float(uniformity)))
        return hook

    def _landmark_hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
            self.landmarks[name].append(output.detach().clone())
        return hook

    def health(self, target_residual: float = DEFAULT_TARGET_RESIDUAL,
               max_iters: int = DEFAULT_MAX_ITERS) -> list[LayerHealth]:
        """The figures of every layer that recorded landmarks, in module order."""
        report = []
        for name, layer in self.layers.items():
            captures = self.landmarks.get(name) or []
            if not captures:
                continue
            figures = [landmark_kernel_health(lm, layer.newton_iters, layer.newton_ridge, target_residual, max_iters)
                       for lm in captures]
            condition = torch.cat([f.condition.flatten() for f in figures])
            rank = torch.cat([f.effective_rank.flatten() for f in figures]).to(torch.float64)
            residual = torch.cat([f.residual.flatten() for f in figures])
            iters = torch.cat([f.iters_to_target.flatten() for f in figures])
            outputs = self.outputs.get(name) or [(0, math.nan, math.nan)]
            report.append(LayerHealth(
                name=name, tokens=max(o[0] for o in outputs), num_landmarks=max(f.num_landmarks for f in figures),
                num_sets=condition.numel(), newton_iters=layer.newton_iters, ridge=layer.newton_ridge,
                condition_max=float(condition.max()), condition_median=float(condition.median()),
                effective_rank_min=int(rank.min()), effective_rank_median=float(rank.median()),
                residual_max=float(residual.max()), residual_median=float(residual.median()),
                iters_to_target=None if bool((iters < 0).any()) else int(iters.max()),
                target_residual=float(target_residual),
                branch_ratio=sum(o[1] for o in outputs) / len(outputs),
                uniformity=sum(o[2] for o in outputs) / len(outputs)))
        return report


@contextlib.contextmanager
def _recording(model: nn.Module) -> Iterator[LandmarkRecorder]:
    recorder = LandmarkRecorder(model)
    if not recorder.layers:
        raise ValueError(f'attention_health: {type(model).__name__} has no SOFT attention layer (SoftAttention) '
                         'to measure: pass a model with a SOFT backbone')
    with recorder:
        yield recorder


def attention_health(model: nn.Module, run: Callable[[], Any] | torch.Tensor,
                     target_residual: float = DEFAULT_TARGET_RESIDUAL,
                     max_iters: int = DEFAULT_MAX_ITERS) -> list[LayerHealth]:
    """Per SOFT layer of ``model``, the health of its landmark kernel on one batch.

    Args:
        model: any module holding SOFT attention layers (a backbone, a classifier, an mmdet / mmseg / mmpretrain
            model).
        run: a callable that runs the model on the batch (``lambda: detector.test_step(batch)``), or an input tensor
            for ``model(run)`` (run under ``torch.no_grad``). The model's mode (train / eval) is left as it is.
        target_residual: the residual ``iters_to_target`` asks for.
        max_iters: the most Newton–Schulz iterations tried for it.

    Returns:
        One :class:`LayerHealth` per SOFT layer that ran, in module order.
    """
    with _recording(model) as recorder:
        if isinstance(run, torch.Tensor):
            with torch.no_grad():
                model(run)
        elif callable(run):
            run()
        else:
            raise TypeError(f'attention_health: run must be a callable or an input tensor, got {type(run).__name__}')
    report = recorder.health(target_residual, max_iters)
    if not report:
        raise ValueError('attention_health: no SOFT attention layer ran during run(): does it call the model?')
    return report


def format_health_table(report: list[LayerHealth]) -> str:
    """A fixed-width table, one row per layer: tokens, landmarks, cond (max, and its coincident-landmark ceiling),
    effective rank (min / median), Newton residual (max / median) after the layer's iterations, iterations to the
    target residual, branch ratio and uniformity of the layer's output."""
    if not report:
        return '(no SOFT layer)'
    target = report[0].target_residual
    header = (f'{"layer":<8} {"tokens":>7} {"m":>3} {"cond max":>9} {"ceiling":>8} {"rank min/med":>12} '
              f'{"iters":>5} {"resid max":>9} {"resid med":>9} {f"iters to {target:g}":>13} {"branch":>6} '
              f'{"unif":>5}')
    lines = [header, '-' * len(header)]
    for layer in report:
        ceiling = (layer.num_landmarks + layer.ridge) / layer.ridge if layer.ridge > 0 else math.inf
        needed = '>max' if layer.iters_to_target is None else str(layer.iters_to_target)
        lines.append(f'{layer.short_name:<8} {layer.tokens:>7} {layer.num_landmarks:>3} {layer.condition_max:>9.3g} '
                     f'{ceiling:>8.3g} {f"{layer.effective_rank_min}/{layer.effective_rank_median:g}":>12} '
                     f'{layer.newton_iters:>5} {layer.residual_max:>9.2e} {layer.residual_median:>9.2e} '
                     f'{needed:>13} {layer.branch_ratio:>6.3f} {layer.uniformity:>5.3f}')
    return '\n'.join(lines)


def health_scalars(report: list[LayerHealth], prefix: str = 'attn_health') -> dict[str, float]:
    """Flat scalars for a logger: ``<prefix>/<layer>/{condition,effective_rank,residual,iters_to_target,
    branch_ratio,uniformity}`` (worst case over the layer's sets; ``iters_to_target`` only when reached) and the
    model-wide ``<prefix>/max_condition``, ``max_residual`` and ``min_effective_rank``."""
    scalars: dict[str, float] = {}
    for layer in report:
        key = f'{prefix}/{layer.short_name}'
        scalars[f'{key}/condition'] = layer.condition_max
        scalars[f'{key}/effective_rank'] = float(layer.effective_rank_min)
        scalars[f'{key}/residual'] = layer.residual_max
        scalars[f'{key}/branch_ratio'] = layer.branch_ratio
        scalars[f'{key}/uniformity'] = layer.uniformity
        if layer.iters_to_target is not None:
            scalars[f'{key}/iters_to_target'] = float(layer.iters_to_target)
    if report:
        scalars[f'{prefix}/max_condition'] = max(layer.condition_max for layer in report)
        scalars[f'{prefix}/max_residual'] = max(layer.residual_max for layer in report)
        scalars[f'{prefix}/min_effective_rank'] = float(min(layer.effective_rank_min for layer in report))
    return scalars
