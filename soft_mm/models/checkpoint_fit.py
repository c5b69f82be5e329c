"""Whether a checkpoint's backbone tensors fit a built SOFT pyramid, and the sentence that says why not.

mmengine's ``Pretrained`` init loads non-strictly: a checkpoint of another SOFT variant (SOFT-Norm-Medium's weights
into a Tiny backbone) would load the tensors whose names and shapes happen to match, log the rest, and train on. The
mm backbone checks the file instead (:meth:`~soft_mm.models.SOFT.init_weights`, and the tools before they run, with
the same :func:`check_backbone_checkpoint`). The rule:

- the backbone's tensors are the file's keys under the pyramid's own top-level names (``stages.``, ``norm.``); other
  keys (an ImageNet classifier's ``cls_token``, ``cls_pos_embed`` and ``head.*``, a detector's neck) are not the
  backbone's and are left alone;
- they fit when every one of them is a tensor of the built backbone with the same shape and none of the built
  backbone's is missing (BatchNorm's ``num_batches_tracked`` aside): the file is the built variant;
- the authors' layout (:mod:`soft_mm.models.official`) is read as the backbone reads it, converted first;
- a file with no SOFT tensors at all is another model (:func:`~soft_mm.utils.checkpoint.check_state_dict_fits`).

An intended partial load (another ``in_channels``, other landmark strides or the parameter-free ``landmark_mode='avg'``,
fine-tuning from another variant) says so with ``partial_pretrained=True`` on the backbone: then the tensors whose
name and shape match are loaded, every other one keeps the default initialisation, and :func:`describe_partial_load`
says how many of each.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping

import torch

from ..utils.checkpoint import CheckpointFileError, check_state_dict_fits
from .arch import ARCH_SETTINGS, NUM_STAGES
from .official.layout import convert_official_state_dict, is_official_layout

__all__ = ['PARTIAL_ARGUMENT', 'BackboneMismatch', 'check_backbone_checkpoint', 'describe_backbone',
           'describe_partial_load']

# the backbone's argument that allows a partial load (docs/user_guides/checkpoints.md)
PARTIAL_ARGUMENT = 'partial_pretrained'
_GUIDE = 'docs/user_guides/checkpoints.md'
_BLOCK = re.compile(r'stages\.(\d+)\.blocks\.(\d+)\.')
_UNCOUNTED = 'num_batches_tracked'  # older checkpoints lack BatchNorm's counter; it holds no weights


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


def _table_name(state_dict: Mapping[str, torch.Tensor]) -> tuple[str | None, tuple, tuple]:
    """``(name in the arch table or None, embed_dims, depths)`` read off a state dict in soft_mm's layout (a stage
    without its position embedding has the dim None)."""
    dims = tuple(_shape(state_dict[f'stages.{i}.pos_embed'])[-1] if f'stages.{i}.pos_embed' in state_dict else None
                 for i in range(NUM_STAGES))
    blocks: list[set[int]] = [set() for _ in range(NUM_STAGES)]
    for key in state_dict:
        match = _BLOCK.match(key)
        if match and int(match[1]) < NUM_STAGES:
            blocks[int(match[1])].add(int(match[2]))
    depths = tuple(len(found) for found in blocks)
    # what the SOFT stages' first layers tell where the file has them: landmark strides and value-conv kernels
    kernels = {setting: tuple(_shape(state_dict[key])[-1] for key in (
        f'stages.{i}.blocks.0.attn.{layer}.weight' for i in range(NUM_STAGES)) if key in state_dict)
        for setting, layer in (('landmark_strides', 'landmark_conv'), ('v_conv_kernels', 'v_conv'))}
    name = next((arch for arch, settings in ARCH_SETTINGS.items()
                 if settings['embed_dims'] == dims and settings['depths'] == depths
                 and all(not found or settings[setting] == found for setting, found in kernels.items())), None)
    return name, dims, depths


def describe_backbone(state_dict: Mapping[str, torch.Tensor]) -> str:
    """What a state dict in soft_mm's layout holds, read off its tensors: ``SOFT arch 'medium' (embed_dims (64, 128,
    288, 512), depths (1, 3, 29, 5))``; a custom arch by its dims and depths alone; input channels other than 3
    named."""
    name, dims, depths = _table_name(state_dict)
    details = [f'embed_dims {dims}', f'depths {depths}']
    stem = state_dict.get('stages.0.downsample.0.conv.weight')
    if stem is not None and stem.ndim == 4 and stem.shape[1] != 3:
        details.append(f'{stem.shape[1]} input channels')
    soft_layers = [key for key in state_dict if key.endswith('.attn.v_conv.weight')]
    if soft_layers and not any('.attn.landmark_conv.' in key for key in state_dict):
        details.append("landmark_mode 'avg'")  # no landmark sampler's weights: parameter-free pooling
    return f"{f'SOFT arch {name!r}' if name else 'a custom SOFT arch'} ({', '.join(details)})"


class BackboneMismatch:
    """How a file's backbone tensors differ from a built backbone's: ``reshaped`` (same name, another shape),
    ``extra`` (no such tensor in the built backbone) and ``missing`` (the built backbone's, not in the file), each a
    sorted list of keys; ``loaded`` the number of the built backbone's tensors that the file gives."""

    def __init__(self, expected: Mapping[str, torch.Tensor], found: Mapping[str, torch.Tensor]) -> None:
        namespace = {key.split('.')[0] for key in expected}
        found = {k: v for k, v in found.items() if k.split('.')[0] in namespace and not k.endswith(_UNCOUNTED)}
        expected = {k: v for k, v in expected.items() if not k.endswith(_UNCOUNTED)}
        self.reshaped = sorted(k for k in found if k in expected and _shape(found[k]) != _shape(expected[k]))
        self.extra = sorted(k for k in found if k not in expected)
        self.missing = sorted(k for k in expected if k not in found)
        self.loaded = len(expected) - len(self.reshaped) - len(self.missing)
        self.total = len(expected)
        self.found = len(found)
        self._shapes = {k: (_shape(found[k]), _shape(expected[k])) for k in self.reshaped}

    def __bool__(self) -> bool:
        return bool(self.reshaped or self.extra or self.missing)

    def summary(self) -> str:
        """``12 of another shape (e.g. stages.2.pos_embed (1, 196, 288) in the file, (1, 196, 320) built), 140 with
        no place in the backbone, 3 missing from the file`` (the nonzero parts)."""
        parts = []
        if self.reshaped:
            key = self.reshaped[0]
            in_file, built = self._shapes[key]
            parts.append(f'{len(self.reshaped)} of another shape (e.g. {key} {in_file} in the file, {built} built)')
        if self.extra:
            parts.append(f'{len(self.extra)} with no place in the backbone (e.g. {self.extra[0]})')
        if self.missing:
            parts.append(f'{len(self.missing)} missing from the file (e.g. {self.missing[0]})')
        return ', '.join(parts)


def _soft_layout(state_dict: Mapping[str, torch.Tensor], path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict in soft_mm's layout: the authors' converted with the arch their tensors tell (a copy), soft_mm's
    as it is."""
    if not is_official_layout(state_dict):
        return dict(state_dict)
    try:
        converted, _, _ = convert_official_state_dict(state_dict)
    except ValueError as error:
        raise CheckpointFileError(path, f"has keys of the SOFT authors' layout but cannot be read as their checkpoint "
                                  f'({error})', "pass one of the SOFT authors' ImageNet checkpoints or a soft_mm "
                                  'checkpoint') from error
    return converted


def check_backbone_checkpoint(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor],
                              path: str | os.PathLike, partial: bool = False,
                              where: str = 'the SOFT backbone') -> BackboneMismatch:
    """Raise :class:`~soft_mm.utils.checkpoint.CheckpointFileError` unless the backbone tensors of ``state_dict`` (the
    checkpoint's, its ``prefix`` already removed) are exactly those of the built SOFT pyramid ``model`` (the rule of
    the module docstring): one sentence naming the file, what it holds, what was built, what differs and the ways out.
    With ``partial`` only a file without any SOFT tensor is refused (``where`` names the backbone then, e.g. the
    config's ``model.backbone``). Returns how the file differs (nothing where it fits), for
    :func:`describe_partial_load`.
    """
    state_dict = _soft_layout(state_dict, path)
    expected = model.state_dict()
    mismatch = BackboneMismatch(expected, state_dict)
    if not mismatch or (partial and mismatch.found):
        return mismatch
    advice = (f"or set {PARTIAL_ARGUMENT}=True on the backbone to load only the tensors that fit and keep the default "
              f'initialisation for the rest ({_GUIDE})')
    if mismatch.found == 0:  # no SOFT tensor at all: another model, or a detector's file without its prefix
        check_state_dict_fits(model, state_dict, path, where,
                              'pass a SOFT checkpoint (an ImageNet one converted with '
                              f'tools/model_converters/convert_official_checkpoint.py), {advice}')
    held, built = describe_backbone(state_dict), describe_backbone(expected)
    held_name, built_name = _table_name(state_dict)[0], _table_name(expected)[0]
    build = f"build arch='{held_name}' to use it, " if held_name and held_name != built_name else ''
    raise CheckpointFileError(path, f'holds the backbone of {held}, which does not fit the one built here, {built}: '
                              f'of its {mismatch.found} backbone tensors {mismatch.summary()}',
                              f'{build}pass a checkpoint of the built backbone, {advice}')


def describe_partial_load(mismatch: BackboneMismatch, path: str | os.PathLike) -> str:
    """The line a partial load warns with: how many of the backbone's tensors the file gave, how many kept the
    default initialisation and what the file had that was not taken."""
    kept = len(mismatch.reshaped) + len(mismatch.missing)
    return (f'{os.fspath(path)}: {PARTIAL_ARGUMENT}=True loaded {mismatch.loaded} of the backbone\'s {mismatch.total} '
            f'tensors and kept the default initialisation for {kept}'
            + (f'; of the file\'s {mismatch.found} backbone tensors {mismatch.summary()}' if mismatch else ''))
