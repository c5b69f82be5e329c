"""Helpers shared by the tests (tests/ is on sys.path: pyproject's pythonpath): the published figures of the zoo, read
from the metafiles (their one home), the variant record of the ten timm classifiers built from them, and the drop-in
tests' config and gradient checks."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import yaml

from helpers.repo import ROOT
from soft_mm.models.arch import resolve_arch


def metafile_models() -> dict[str, dict[str, Any]]:
    """Every model entry of the metafiles that model-index.yml imports, by name (its config's file name), in the
    metafiles' order."""
    models = {}
    for metafile in yaml.safe_load((ROOT / 'model-index.yml').read_text())['Import']:
        for model in yaml.safe_load((ROOT / metafile).read_text())['Models']:
            models[model['Name']] = model
    return models


def published_params_m(name: str) -> int:
    """The published parameters (millions) of the metafile entry ``name`` (e.g. ``'retinanet_soft_tiny_coco'``)."""
    return metafile_models()[name]['Metadata']['Parameters (millions)']


@dataclasses.dataclass(frozen=True)
class Variant:
    """One published timm classifier (``soft_<arch>`` or ``soft_norm_<arch>``) as its ImageNet metafile entry states
    it: ``num_params`` is the exact parameter count of its 1000-class classifier, ``params_m``, ``gflops`` and
    ``top1`` the published figures (ImageNet-1k, 224x224), ``out_channels`` the channels of its four stage maps (a
    neck's ``in_channels``, from the arch zoo)."""

    name: str
    arch: str
    soft_norm: bool
    num_params: int
    params_m: int
    gflops: float
    top1: float
    out_channels: tuple[int, ...]

    @property
    def title(self) -> str:
        """``'SOFT-Tiny'``, ``'SOFT-Norm-Tiny'``, ..."""
        return f"SOFT-{'Norm-' if self.soft_norm else ''}{self.arch.capitalize()}"


def _variants() -> dict[str, Variant]:
    variants = {}
    for model in metafile_models().values():
        meta = model['Metadata']
        if not model['Config'].startswith('configs/soft_') or meta.get('Demo'):
            continue  # the detectors, segmentors and the demo classifier
        [result] = model['Results']
        variants[meta['Backbone Model']] = Variant(
            name=meta['Backbone Model'], arch=meta['Backbone Arch'], soft_norm=meta['SOFT-Norm'],
            num_params=meta['Parameters'], params_m=meta['Parameters (millions)'], gflops=meta['FLOPs (billions)'],
            top1=result['Metrics']['Top 1 Accuracy'], out_channels=resolve_arch(meta['Backbone Arch'])['embed_dims'])
    return variants


# The ten timm classifiers, in the metafile's order (plain ones first).
VARIANTS: dict[str, Variant] = _variants()


def get_variant(name: str) -> Variant:
    """The :class:`Variant` of a timm model name (``'soft_norm_small'``)."""
    if name not in VARIANTS:
        raise ValueError(f"name={name!r} is not a SOFT variant; valid names: {', '.join(VARIANTS)}")
    return VARIANTS[name]


def out_channels(arch: str | dict[str, Any]) -> list[int]:
    """Channels of the four stage maps of ``arch`` (a zoo name or a dict): what a neck's ``in_channels`` takes."""
    return list(resolve_arch(arch)['embed_dims'])


def without_scope(node: Any) -> Any:
    """A config tree without the ``_scope_`` keys that inheriting through ``mmdet::`` / ``mmseg::`` adds."""
    if isinstance(node, dict):
        return {k: without_scope(v) for k, v in node.items() if k != '_scope_'}
    if isinstance(node, (list, tuple)):
        return [without_scope(v) for v in node]
    return node


def record_gradients(module: torch.nn.Module) -> dict[str, list[tuple[bool, float]]]:
    """``{name: [(finite, max |grad|) of each backward pass]}`` for every trainable parameter of ``module``."""
    records = {}
    for name, param in module.named_parameters():
        if param.requires_grad:
            steps = records[name] = []
            param.register_hook(lambda grad, steps=steps: steps.append((bool(grad.isfinite().all()),
                                                                        float(grad.abs().max()))))
    return records


def train_two_steps_reaching_the_backbone(runner, losses_name: str) -> None:
    """Run ``runner``'s training (two iterations) and assert that the task's loss (``losses_name``, for the message)
    reached every backbone tensor with a finite non-zero gradient in both steps (not only the weight decay changing
    them) and that both losses are finite."""
    gradients = record_gradients(runner.model.backbone)
    runner.train()
    assert runner.iter == 2
    assert len(gradients) == len(list(runner.model.backbone.parameters())), losses_name
    flat = [name for name, steps in gradients.items() if len(steps) != 2 or not all(
        finite and largest > 0 for finite, largest in steps)]
    assert not flat, f'{len(flat)} parameters without a finite non-zero gradient from the {losses_name}: {flat[:8]}'
    losses = runner.message_hub.get_scalar('train/loss').data[0]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
