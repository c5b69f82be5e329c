"""Convert the SOFT authors' ImageNet checkpoints (fudan-zvg/SOFT layout) to soft_mm's layout: reading their files,
writing and reading converted files, and the one call the command line runs.

The key map, the arch inference and the migration of the authors' layout live in
:mod:`soft_mm.models.official.layout` (a model loads the authors' layout directly: ``load_state_dict``, timm's
``pretrained=True`` with a file, mmengine's ``init_cfg=dict(type='Pretrained', ...)``).

The converted file, ``{'state_dict': ..., 'meta': {...}}``, holds only tensors and plain Python values, so
``torch.load(weights_only=True)`` (and mmengine's ``init_cfg=dict(type='Pretrained', checkpoint=...)``) read it.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..utils.atomic import atomic_save
from ..utils.checkpoint import CheckpointFileError, read_checkpoint
from .arch import ARCH_KEYS, DEFAULT_STAGE_ATTENTION, resolve_arch
from .classifier import SoftVisionTransformer
from .official.layout import (
    convert_official_state_dict,
)
from .settings import AUTHORS_SETTINGS

__all__ = ['CHECKPOINT_KEYS', 'ConvertedCheckpoint', 'build_classifier_from_checkpoint', 'convert_official_checkpoint',
           'load_converted_checkpoint', 'load_official_checkpoint', 'save_converted_checkpoint']

# Where a state dict may sit in a checkpoint file: timm (state_dict, state_dict_ema), DeiT (model, model_ema).
CHECKPOINT_KEYS = ('state_dict', 'state_dict_ema', 'model', 'model_ema')
_AUTO_ORDER = ('state_dict', 'model', 'state_dict_ema', 'model_ema')  # EMA weights only when nothing else is there
# Parameters of the classifier that the mm backbone (SOFT) does not have.
CLASSIFIER_ONLY_KEYS = ('cls_token', 'cls_pos_embed', 'head.weight', 'head.bias')
# The advice of load_official_checkpoint's and load_converted_checkpoint's errors
OFFICIAL_FILE_HINT = ("pass one of the SOFT authors' ImageNet checkpoints (a timm/DeiT-style dict or a bare state "
                      'dict of their model)')
OFFICIAL_UNSAFE_HINT = ('only if you trust the file, pass allow_pickle=True '
                        '(tools/model_converters/convert_official_checkpoint.py: --allow-unsafe-load); full unpickling '
                        'can run code stored in it')
CONVERTED_HINT = ('convert an official file with tools/model_converters/convert_official_checkpoint.py (or '
                  'soft_mm.models.checkpoint_conversion.convert_official_checkpoint) and pass the file it writes')


# ---------------------------------------------------------------------------------------------------------------------
# Reading the authors' files


def load_official_checkpoint(path: str | os.PathLike, key: str = 'auto',
                             allow_pickle: bool = False) -> tuple[dict[str, torch.Tensor], str]:
    """Read an official checkpoint file: ``(state dict, where it was found)`` (see :func:`select_state_dict`).

    The file is read by :func:`~soft_mm.utils.checkpoint.reader.read_checkpoint`: ``torch.load(weights_only=True)``,
    which runs no pickled code, with ``argparse.Namespace`` allow-listed (timm's train script stores its command-line
    ``args`` next to the weights). An older file with other pickled objects is refused (an
    :class:`~soft_mm.utils.checkpoint.reader.UnsafeCheckpointError`) unless ``allow_pickle=True``, which reads it with
    ``weights_only=False`` — that can execute code stored in the file, so only do it for files you trust — and warns.
    Every other unusable file (missing, a folder, empty, truncated, not a checkpoint, no state dict in it) is a
    :class:`~soft_mm.utils.checkpoint.reader.CheckpointFileError` naming the file, the problem and the fix.
    """
    checkpoint = read_checkpoint(path, allow_pickle=allow_pickle, unsafe_advice=OFFICIAL_UNSAFE_HINT)
    if not isinstance(checkpoint, Mapping):
        raise CheckpointFileError(path, f'holds a {type(checkpoint).__name__}, not a checkpoint dict or a state dict',
                                  OFFICIAL_FILE_HINT)
    try:
        return select_state_dict(checkpoint, key)
    except ValueError as error:
        if key != 'auto' and key not in CHECKPOINT_KEYS:  # the caller's key is wrong, not the file
            raise
        raise CheckpointFileError(path, f'has no usable state dict ({error})', OFFICIAL_FILE_HINT) from error


def select_state_dict(checkpoint: Mapping[str, Any], key: str = 'auto') -> tuple[dict[str, torch.Tensor], str]:
    """Pick the state dict out of a checkpoint dict and strip a DataParallel ``module.`` prefix.

    ``key='auto'`` takes ``state_dict`` or ``model``, then (only if the file has nothing else) ``state_dict_ema`` or
    ``model_ema``, then the dict itself when all its values are tensors (a bare state dict). An explicit ``key``
    (one of :data:`CHECKPOINT_KEYS`) must be present. Returns the state dict and the key used (``''`` for a bare dict).
    """
    if key != 'auto' and key not in CHECKPOINT_KEYS:
        raise ValueError(f"key={key!r} is not one of {('auto', *CHECKPOINT_KEYS)}")
    if key == 'auto':
        found = [k for k in _AUTO_ORDER if isinstance(checkpoint.get(k), Mapping)]
        if found:
            key = found[0]
        elif checkpoint and all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
            key = ''
        else:
            raise ValueError(f'found no state dict in the checkpoint: none of {CHECKPOINT_KEYS} is there and it is '
                             f'not a bare state dict (top-level keys: {sorted(map(str, checkpoint))[:12]})')
        if key.endswith('ema'):
            warnings.warn(f'the checkpoint has only EMA weights; converting {key!r}', stacklevel=2)
    elif not isinstance(checkpoint.get(key), Mapping):
        present = [k for k in CHECKPOINT_KEYS if isinstance(checkpoint.get(k), Mapping)]
        raise ValueError(f'key={key!r} is not in the checkpoint; it has {present or "no known key"}'
                         f"{'' if present else ' (use key=auto for a bare state dict)'}")
    state_dict = checkpoint[key] if key else checkpoint
    not_tensors = sorted(k for k, v in state_dict.items() if not isinstance(v, torch.Tensor))
    if not_tensors:
        raise ValueError(f'the state dict under {key or "the top level"!r} holds non-tensor values: {not_tensors[:8]}')
    return {k.removeprefix('module.'): v for k, v in state_dict.items()}, key



def num_classes_of(state_dict: Mapping[str, torch.Tensor]) -> int:
    """Classes of the head in a (converted or official) state dict; 0 when there is no head."""
    head = state_dict.get('head.weight')
    return int(head.shape[0]) if head is not None else 0


def _classifier_on_meta(**kwargs: Any) -> nn.Module:
    """The classifier with no storage (meta device) when its construction allows it, else on the CPU."""
    try:
        with torch.device('meta'):
            return SoftVisionTransformer(**kwargs)
    except (NotImplementedError, RuntimeError):  # construction reads a tensor's data (not possible on meta)
        return SoftVisionTransformer(**kwargs)


def verify_converted(state_dict: Mapping[str, torch.Tensor], arch: str | Mapping[str, Any]) -> int:
    """Strict-load ``state_dict`` into a classifier of ``arch``; returns its parameter count, raises ValueError."""
    model = _classifier_on_meta(arch=arch if isinstance(arch, str) else dict(arch),
                                num_classes=num_classes_of(state_dict), **AUTHORS_SETTINGS.as_dict())
    try:
        model.load_state_dict(state_dict, strict=True, assign=True)
    except RuntimeError as error:
        raise ValueError(f'the converted state dict does not fit SoftVisionTransformer(arch={arch!r}): '
                         f'{error}') from error
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------------------------------------
# Converted files


def make_meta(arch: str | Mapping[str, Any], soft_norm: bool, source: str = '', source_key: str = '',
              num_classes: int = 1000) -> dict[str, Any]:
    """The ``meta`` of a converted file: everything needed to rebuild the model, as plain Python values."""
    if not isinstance(arch, str):
        settings = resolve_arch(dict(arch))
        # every setting the authors' layout can vary; the stage attention kinds only when they are not the default
        keys = [k for k in ARCH_KEYS if k != 'stage_attention' or settings[k] != DEFAULT_STAGE_ATTENTION]
        arch = {k: list(settings[k]) if isinstance(settings[k], tuple) else settings[k] for k in keys}
    return dict(arch=arch, soft_norm=bool(soft_norm), num_classes=int(num_classes), **AUTHORS_SETTINGS.as_dict(),
                source=str(source), source_key=source_key, converter='soft_mm.models.checkpoint_conversion')


def save_converted_checkpoint(path: str | os.PathLike, state_dict: Mapping[str, torch.Tensor],
                              meta: Mapping[str, Any]) -> None:
    """Write ``{'state_dict': ..., 'meta': ...}`` (readable with ``weights_only=True``) atomically."""
    directory = os.path.dirname(os.fspath(path))
    if directory:
        os.makedirs(directory, exist_ok=True)
    atomic_save({'state_dict': {k: v.detach().cpu() for k, v in state_dict.items()}, 'meta': dict(meta)}, path)


def load_converted_checkpoint(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(state_dict, meta)`` of a file written by :func:`save_converted_checkpoint`, read by
    :func:`~soft_mm.utils.checkpoint.reader.read_checkpoint` (``weights_only=True``, no full unpickling).

    An unreadable file or one without ``state_dict`` and a ``meta`` with an ``arch`` is a
    :class:`~soft_mm.utils.checkpoint.reader.CheckpointFileError` naming the file and the fix.
    """
    checkpoint = read_checkpoint(path, unsafe_advice=CONVERTED_HINT)
    if not (isinstance(checkpoint, Mapping) and isinstance(checkpoint.get('meta'), Mapping)
            and isinstance(checkpoint.get('state_dict'), Mapping) and 'arch' in checkpoint['meta']):
        raise CheckpointFileError(path, 'is not a converted SOFT checkpoint (it needs a state_dict and a meta with an '
                                  'arch)', CONVERTED_HINT)
    return dict(checkpoint['state_dict']), dict(checkpoint['meta'])


def _model_kwargs_from_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Constructor arguments shared by ``SoftVisionTransformer`` and ``SOFT`` for a converted file's ``meta``."""
    arch = meta['arch']
    return dict(arch=arch if isinstance(arch, str) else copy.deepcopy(dict(arch)), soft_norm=bool(meta['soft_norm']),
                **{k: meta.get(k, v) for k, v in AUTHORS_SETTINGS.as_dict().items()})


def build_classifier_from_checkpoint(path: str | os.PathLike, **overrides: Any) -> SoftVisionTransformer:
    """The ``SoftVisionTransformer`` of a converted file, weights loaded strictly (in train mode, like any new model).

    ``overrides`` replace constructor arguments (e.g. ``drop_path_rate=0.0``, ``newton_iters=30``); the arch and the
    number of classes come from the file.
    """
    state_dict, meta = load_converted_checkpoint(path)
    kwargs = {**_model_kwargs_from_meta(meta), 'num_classes': num_classes_of(state_dict), **overrides}
    model = SoftVisionTransformer(**kwargs)
    model.load_state_dict(state_dict, strict=True)
    return model


# ---------------------------------------------------------------------------------------------------------------------
# One call


@dataclasses.dataclass
class ConvertedCheckpoint:
    """The result of :func:`convert_official_checkpoint`; ``state_dict`` and ``meta`` are what the file holds."""

    state_dict: dict[str, torch.Tensor]
    meta: dict[str, Any]
    arch: str | dict[str, Any]
    source_key: str
    num_source_tensors: int
    unmapped: list[str]
    num_params: int | None


def convert_official_checkpoint(src: str | os.PathLike, soft_norm: bool = False, key: str = 'auto',
                                allow_pickle: bool = False, verify: bool = True,
                                arch: str | Mapping[str, Any] | None = None) -> ConvertedCheckpoint:
    """Read an official checkpoint file and convert it: the state dict, its ``meta`` and what was found.

    ``soft_norm`` says whether the weights are SOFT-Norm (the weights cannot tell); ``key`` and ``allow_pickle`` are
    those of :func:`load_official_checkpoint`; ``verify`` strict-loads the result into the classifier
    (:func:`verify_converted`) and reports its parameter count; ``arch`` (optional) is the model the file holds, for
    the head counts of softmax stages (see :func:`infer_arch`). Write the result with
    ``save_converted_checkpoint(dst, converted.state_dict, converted.meta)``.
    """
    official, source_key = load_official_checkpoint(src, key, allow_pickle=allow_pickle)
    state_dict, arch, unmapped = convert_official_state_dict(official, arch)
    num_params = verify_converted(state_dict, arch) if verify else None
    meta = make_meta(arch, soft_norm, source=os.path.basename(os.fspath(src)), source_key=source_key,
                     num_classes=num_classes_of(state_dict))
    return ConvertedCheckpoint(state_dict, meta, arch, source_key, len(official), unmapped, num_params)
