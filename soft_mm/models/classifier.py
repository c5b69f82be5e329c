"""``SoftVisionTransformer``: the ImageNet classifier, with the ten timm entrypoints ``soft_{tiny..huge}`` and
``soft_norm_{tiny..huge}`` (one per arch of :data:`~soft_mm.models.arch.ARCH_SETTINGS` and plain or Norm attention;
their published figures are in ``configs/metafiles/soft_imagenet.yml``).

Pretrained weights the timm way: no weights are hosted, so ``pretrained=True`` needs a file, either
``pretrained_cfg_overlay=dict(file=path)`` or ``checkpoint_path=path`` (timm's ``create_model``). The file may be
the authors' release (fudan-zvg/SOFT layout; converted on load by the pretrained filter,
:func:`~soft_mm.models.official.layout.checkpoint_filter_fn`) or a soft_mm checkpoint (a converted file or a saved
state dict; older layouts are migrated by ``SoftPyramid._load_from_state_dict``). timm reads a file's
``state_dict_ema`` when it has one, and with ``pretrained=True`` adapts the head to ``num_classes`` and the stem to
``in_chans``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from timm.models import PretrainedCfg, build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices  # (where timm's own models import it from)
from torch import nn

from ..ops.compat import HAS_SAFE_GLOBALS
from ..utils.checkpoint import read_checkpoint, state_dict_of
from .arch import ARCH_SETTINGS, variant_name
from .official.layout import checkpoint_filter_fn
from .pyramid import SoftPyramid
from .settings import model_attention_settings

GLOBAL_POOLS = ('token', 'avg')


def _check_global_pool(global_pool: str) -> None:
    if global_pool not in GLOBAL_POOLS:
        raise ValueError(f'global_pool={global_pool!r} is not one of {GLOBAL_POOLS}')


class SoftVisionTransformer(SoftPyramid):
    """SOFT classifier: the pyramid of :class:`~soft_mm.models.SOFT` plus a cls token in stage 4 and a linear head.

    ``forward_features (B, 3, H, W) -> (B, 1 + H/32 * W/32, C4)`` (cls token first, after the final norm);
    ``forward_head -> (B, num_classes)`` from the cls token. Any input size works (position embeddings are resized).

    Args:
        arch, soft_norm, drop_path_rate, with_cp, soft_block_norm, qk_init_std, **attention: as in
            :class:`~soft_mm.models.SOFT`.
        in_chans: input image channels (timm's name).
        num_classes: classes of the head (0: no head, ``forward`` returns the pooled features).
        global_pool: ``'token'`` (cls token, as published) or ``'avg'`` (mean of the spatial tokens).
        drop_rate: dropout before the head.
    """

    def __init__(self, arch: str | dict[str, Any] = 'tiny', soft_norm: bool = False, in_chans: int = 3,
                 num_classes: int = 1000, global_pool: str = 'token', drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1, with_cp: bool = False, soft_block_norm: str = 'post',
                 qk_init_std: float = 0.02, **attention: Any) -> None:
        _check_global_pool(global_pool)
        super().__init__(arch, soft_norm=soft_norm, in_channels=in_chans, drop_path_rate=drop_path_rate,
                         with_cp=with_cp, attention=model_attention_settings(type(self), attention),
                         soft_block_norm=soft_block_norm, qk_init_std=qk_init_std)
        dim = self.embed_dims[-1]
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = dim
        self.num_prefix_tokens = 1
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.cls_pos_embed = nn.Parameter(torch.zeros(1, 1, dim))
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()
        self.feature_info = [dict(num_chs=c, reduction=4 * 2 ** i, module=f'stages.{i}')
                             for i, c in enumerate(self.embed_dims)]
        self.init_pyramid_weights()
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.cls_pos_embed, std=0.02)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {'cls_token', 'cls_pos_embed'} | {f'stages.{i}.pos_embed' for i in range(len(self.stages))}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's parameter groups (layer-wise learning-rate decay, ``timm.optim.create_optimizer_v2(...,
        layer_decay=...)``): the stem (stage 1's conv downsampling, its position embedding, the cls token and its
        position embedding) first; then per stage (``coarse``: the final norm with the head) or per block (each stage's
        downsampling with its first block, the final norm with the last block); the head last."""
        stem = r'^cls_token|^cls_pos_embed|^stages\.0\.(?:downsample|pos_embed)'
        if coarse:
            return dict(stem=stem, blocks=r'^stages\.(\d+)')
        return dict(stem=stem, blocks=[(r'^stages\.(\d+)\.(?:downsample|pos_embed)', (0,)),
                                       (r'^stages\.(\d+)\.blocks\.(\d+)', None), (r'^norm', (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.with_cp = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool is not None:
            _check_global_pool(global_pool)
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def _prefix(self) -> torch.Tensor:
        return self.cls_token + self.cls_pos_embed

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        maps, cls = self.forward_pyramid(x, prefix_tokens=self._prefix())
        tokens = maps[-1].flatten(2).transpose(1, 2)
        return tokens if cls is None else torch.cat([cls, tokens], dim=1)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x[:, 0] if self.global_pool == 'token' else x[:, self.num_prefix_tokens:].mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(self, x: torch.Tensor, indices: int | list[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = 'NCHW', intermediates_only: bool = False,
                              ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's feature API: the NCHW stage maps selected by ``indices`` (and the final features).

        The stage-4 map always includes the final norm, as in the SOFT backbone, so ``norm`` has nothing to add;
        it is accepted for timm's ``FeatureGetterNet``.
        """
        if output_fmt != 'NCHW':
            raise ValueError(f"output_fmt={output_fmt!r}: SOFT features are 'NCHW' only")
        take, max_index = feature_take_indices(len(self.stages), indices)
        last = max_index if (stop_early or intermediates_only) else len(self.stages) - 1
        maps, cls = self.forward_pyramid(x, prefix_tokens=self._prefix(), last_stage=last)
        intermediates = [maps[i] for i in take]
        if intermediates_only:
            return intermediates
        final = maps[-1].flatten(2).transpose(1, 2)
        return (final if cls is None else torch.cat([cls, final], dim=1)), intermediates

    def prune_intermediate_layers(self, indices: int | list[int] = 4, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Drop the stages after the last of ``indices`` (and the head). The final norm is part of the stage-4
        map (as in the SOFT backbone), so it is kept whatever ``prune_norm`` says."""
        take, max_index = feature_take_indices(len(self.stages), indices)
        self.stages = self.stages[:max_index + 1]
        if prune_head:
            self.reset_classifier(0)
        return take


def _cfg(**kwargs: Any) -> dict[str, Any]:
    return dict(url='', num_classes=1000, input_size=(3, 224, 224), pool_size=(7, 7), crop_pct=0.9,
                interpolation='bicubic', mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                first_conv='stages.0.downsample.0.conv', classifier='head', license='mit', **kwargs)


# timm model name -> (arch, soft_norm): soft_tiny ... soft_huge, then soft_norm_tiny ... soft_norm_huge
TIMM_MODELS: dict[str, tuple[str, bool]] = {variant_name(arch, soft_norm): (arch, soft_norm)
                                            for soft_norm in (False, True) for arch in ARCH_SETTINGS}

default_cfgs = generate_default_cfgs({f'{name}.in1k': _cfg() for name in TIMM_MODELS})


def _weight_source_given(kwargs: dict[str, Any]) -> bool:
    """Whether ``pretrained_cfg`` / ``pretrained_cfg_overlay`` name weights (no SOFT weights are hosted)."""
    for cfg in (kwargs.get('pretrained_cfg'), kwargs.get('pretrained_cfg_overlay')):
        cfg = cfg.to_dict() if isinstance(cfg, PretrainedCfg) else cfg
        if isinstance(cfg, Mapping) and any(cfg.get(k) for k in ('file', 'state_dict', 'url', 'hf_hub_id')):
            return True
    return False


def _check_weight_files(kwargs: dict[str, Any]) -> None:
    """A ``file`` named by ``pretrained_cfg`` / ``pretrained_cfg_overlay`` that is not there: a FileNotFoundError that
    says so in one sentence (timm raises one with no message)."""
    for name in ('pretrained_cfg_overlay', 'pretrained_cfg'):
        cfg = kwargs.get(name)
        cfg = cfg.to_dict() if isinstance(cfg, PretrainedCfg) else cfg
        path = cfg.get('file') if isinstance(cfg, Mapping) else None
        if path and not os.path.isfile(path):
            problem = 'is a folder, not a checkpoint file' if os.path.isdir(path) else 'not found'
            raise FileNotFoundError(f"{os.fspath(path)} {problem} (the file of {name}): pass the path of an existing "
                                    "checkpoint file (the authors' release or a soft_mm checkpoint).")


def _overlay_file_read_by_soft_mm(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the file of ``pretrained_cfg_overlay`` replaced by its state dict where timm cannot read it.

    torch < 2.4 has no allow-list for ``torch.load(weights_only=True)``, so timm's reader refuses timm's own training
    checkpoints there (the authors' release among them: its ``args`` is an ``argparse.Namespace``). On such a torch
    soft_mm's safe reader, which allow-lists it, reads the file, and timm gets the weights as timm's file loader picks
    them (the EMA weights first); timm's filter, head and stem adaptation run on them as on any file."""
    overlay = kwargs.get('pretrained_cfg_overlay')
    if HAS_SAFE_GLOBALS or not isinstance(overlay, Mapping) or not overlay.get('file'):
        return kwargs
    path = overlay['file']
    checkpoint = read_checkpoint(path)
    for key in ('state_dict_ema', 'model_ema'):
        if isinstance(checkpoint, Mapping) and isinstance(checkpoint.get(key), Mapping):
            checkpoint = checkpoint[key]
            break
    overlay = {k: v for k, v in overlay.items() if k != 'file'}
    return {**kwargs, 'pretrained_cfg_overlay': {**overlay, 'state_dict': state_dict_of(checkpoint, path)}}


def _create_soft(name: str, pretrained: bool, **kwargs: Any) -> SoftVisionTransformer:
    """Build the timm model ``name`` (a key of :data:`TIMM_MODELS`) with timm's pretrained-weight handling."""
    arch, soft_norm = TIMM_MODELS[name]
    if pretrained and not _weight_source_given(kwargs):
        raise ValueError(f"pretrained=True: no {name} weights are hosted; pass the file, the authors' release "
                         "or a soft_mm checkpoint, as pretrained_cfg_overlay=dict(file=path) (or use pretrained=False "
                         'with checkpoint_path=path)')
    if pretrained:
        _check_weight_files(kwargs)
        kwargs = _overlay_file_read_by_soft_mm(kwargs)
    out_indices = kwargs.pop('out_indices', 4)
    return build_model_with_cfg(SoftVisionTransformer, name, pretrained, arch=arch, soft_norm=soft_norm,
                                pretrained_filter_fn=checkpoint_filter_fn,
                                feature_cfg=dict(feature_cls='getter', out_indices=out_indices), **kwargs)


# The ten timm entrypoints: one arch of ARCH_SETTINGS each, plain SOFT attention or SOFT-Norm. Adding an arch adds two.
@register_model
def soft_tiny(pretrained: bool = False, **kwargs: Any) -> SoftVisionTransformer:
    """SOFT-Tiny ImageNet classifier (plain SOFT attention, arch 'tiny')."""
    return _create_soft('soft_tiny', pretrained, **kwargs)


@register_model
def soft_small(pretrained: bool = False, **kwargs: Any) -> SoftVisionTransformer:
    """SOFT-Small ImageNet classifier (plain SOFT attention, arch 'small')."""
    return _create_soft('soft_small', pretrained, **kwargs)


@register_model
def soft_medium(pretrained: bool = False, **kwargs: Any) -> SoftVisionTransformer:
    """SOFT-Medium ImageNet classifier (plain SOFT attention, arch 'medium')."""
    return _create_soft('soft_medium', pretrained, **kwargs)


@register_model
def soft_large(pretrained: bool = False, **kwargs: Any) -> SoftVisionTransformer:
    """SOFT-Large ImageNet classifier (plain SOFT attention, arch 'large')."""
    return _create_soft('soft_large', pretrained, **kwargs)


@register_model
def soft_huge(pretrained: bool = False, **kwargs: Any) -> SoftVisionTransformer:
    """SOFT-Huge ImageNet classifier (plain SOFT attention, arch 'huge')."""
    return _create_soft('soft_huge', pretrained, **kwargs)


@register_model
def soft_norm_tiny(pretrained: bool = False, **kwargs: Any) -> SoftVisionTransformer:
    """SOFT-Norm-Tiny ImageNet classifier (SOFT-Norm attention, arch 'tiny')."""
    return _create_soft('soft_norm_tiny', pretrained, **kwargs)


@register_model
def soft_norm_small(pretrained: bool = False, **kwargs: Any) -> SoftVisionTransformer:
    """SOFT-Norm-Small ImageNet classifier (SOFT-Norm attention, arch 'small')."""
    return _create_soft('soft_norm_small', pretrained, **kwargs)


@register_model
def soft_norm_medium(pretrained: bool = False, **kwargs: Any) -> SoftVisionTransformer:
    """SOFT-Norm-Medium ImageNet classifier (SOFT-Norm attention, arch 'medium')."""
    return _create_soft('soft_norm_medium', pretrained, **kwargs)


@register_model
def soft_norm_large(pretrained: bool = False, **kwargs: Any) -> SoftVisionTransformer:
    """SOFT-Norm-Large ImageNet classifier (SOFT-Norm attention, arch 'large')."""
    return _create_soft('soft_norm_large', pretrained, **kwargs)


@register_model
def soft_norm_huge(pretrained: bool = False, **kwargs: Any) -> SoftVisionTransformer:
    """SOFT-Norm-Huge ImageNet classifier (SOFT-Norm attention, arch 'huge')."""
    return _create_soft('soft_norm_huge', pretrained, **kwargs)
