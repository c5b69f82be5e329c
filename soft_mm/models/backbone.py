"""``SOFT``: the multi-scale backbone for mmdet and mmseg."""
from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch
from mmengine.model import BaseModule
from torch import nn

from .checkpoint_fit import check_backbone_checkpoint, describe_partial_load
from .conv import NormLayer
from .pyramid import SoftPyramid
from .settings import model_attention_settings

__all__ = ['DEFAULT_NORM_CFG', 'SOFT', 'conv_norm_layer']

# the norm of the conv stem and the downsampling convs, as mmdet's backbones write it (SyncBN for distributed training)
DEFAULT_NORM_CFG = MappingProxyType({'type': 'BN', 'requires_grad': True})
# what torch builds itself where mmcv (whose build_norm_layer knows every registered norm) is not installed
_TORCH_NORMS = {'BN': nn.BatchNorm2d, 'SyncBN': nn.SyncBatchNorm}


def _build_norm(norm_cfg: dict[str, Any], num_features: int) -> nn.Module:
    """The norm layer of ``norm_cfg`` for ``num_features`` channels: mmcv's ``build_norm_layer`` (the registered
    types in the current scope, ``requires_grad`` applied), or without mmcv torch's BatchNorm2d / SyncBatchNorm."""
    layer_type = norm_cfg['type']
    try:
        from mmcv.cnn import build_norm_layer
    except ModuleNotFoundError as err:
        if (err.name or '').partition('.')[0] != 'mmcv':  # a dependency of an installed mmcv: its own error
            raise
        if isinstance(layer_type, str) and layer_type not in _TORCH_NORMS:
            raise ImportError(f'norm_cfg type {layer_type!r} needs mmcv (bash tools/install.sh); without it '
                              f'{" and ".join(map(repr, _TORCH_NORMS))} only, or a class') from err
        build = _TORCH_NORMS[layer_type] if isinstance(layer_type, str) else layer_type
        options = {key: value for key, value in norm_cfg.items() if key not in ('type', 'requires_grad')}
        return build(num_features, **options).requires_grad_(norm_cfg.get('requires_grad', True))
    try:
        _, layer = build_norm_layer(norm_cfg, num_features)
    except KeyError as err:
        raise ValueError(f'norm_cfg: type {layer_type!r} is no norm layer mmcv knows (e.g. \'BN\', \'SyncBN\', '
                         f'\'GN\' with num_groups, \'IN\')') from err
    if isinstance(layer, nn.LayerNorm):
        raise ValueError(f'norm_cfg: type {layer_type!r} normalises the last dim, but the convs\' maps are '
                         '(B, C, H, W): use a norm over channels (\'BN\', \'SyncBN\', \'GN\', \'IN\')')
    return layer


def pretrained_checkpoint(init_cfg: dict | list[dict] | None) -> str | None:
    """The checkpoint of the ``Pretrained`` entry of an ``init_cfg`` (a dict or a list of them), if it has one."""
    for entry in init_cfg if isinstance(init_cfg, (list, tuple)) else [init_cfg]:
        if isinstance(entry, Mapping) and getattr(entry.get('type'), '__name__', entry.get('type')) in (
                'Pretrained', 'PretrainedInit'):
            return entry.get('checkpoint')
    return None


def conv_norm_layer(norm_cfg: Mapping[str, Any]) -> NormLayer:
    """``norm_cfg`` (mmcv's norm config: ``type``, a registered name or a class, the layer's own keywords and
    ``requires_grad``) as the pyramid's ``conv_norm_layer``: ``channels -> module``, built by mmcv's
    ``build_norm_layer`` where mmcv is installed."""
    if not isinstance(norm_cfg, Mapping) or not isinstance(norm_cfg.get('type'), (str, type)):
        raise ValueError(f"norm_cfg must be a dict with a 'type' (a registered name or a class), e.g. "
                         f"dict(type='SyncBN', requires_grad=True), got {norm_cfg!r}")
    return functools.partial(_build_norm, dict(norm_cfg))


class SOFT(SoftPyramid, BaseModule):
    """SOFT pyramid backbone: ``(B, C_in, H, W) ->`` tuple of NCHW maps at strides 4/8/16/32 for ``out_indices``.

    SOFT attention (linear in the tokens) in stages 1-3, softmax attention in stage 4, no cls token. Built with its
    default initialisation; ``init_cfg`` goes through :meth:`init_weights`, which mmengine's runner calls before
    training. Every argument with its default: docs/user_guides/detection_segmentation.md.

    Args:
        arch: ``'tiny'``, ``'small'``, ``'medium'``, ``'large'``, ``'huge'`` or a dict (see ``resolve_arch``).
        soft_norm: SOFT-Norm attention (the published detection/segmentation backbones).
        in_channels: input image channels.
        out_indices: stages whose maps are returned (0-3; channels ``arch['embed_dims']``).
        frozen_stages: -1 freezes nothing; 0 the conv stem and the stage-1 position embedding; k >= 1 also stages
            1..k (4: and the final norm). Frozen parts stay in eval mode.
        norm_eval: keep every BatchNorm in eval mode during training.
        with_cp: gradient checkpointing of every block.
        drop_path_rate: stochastic depth, rising linearly from 0 to this value over all blocks.
        soft_block_norm: ``'post'`` (the authors') or ``'pre'`` norm blocks in the SOFT stages.
        qk_init_std: initial std of the SOFT layers' q/k projection (the authors' 0.02).
        compile_stages: None (eager), True (``dict(dynamic=True)``) or a dict of ``torch.compile`` keywords: each
            stage compiled as its own graph (:mod:`soft_mm.models.compiled`).
        norm_cfg: mmcv's config of the conv stem's and the downsampling convs' norm (``dict(type='SyncBN',
            requires_grad=True)`` for distributed training).
        init_cfg: e.g. ``dict(type='Pretrained', checkpoint=..., prefix='backbone.')``; its backbone tensors must be
            this backbone's (:mod:`soft_mm.models.checkpoint_fit`).
        partial_pretrained: load only the tensors of a ``Pretrained`` checkpoint whose name and shape match; the rest
            keep the default initialisation, and a warning counts both.
        **attention: the SOFT attention settings (:class:`~soft_mm.models.settings.AttentionSettings`; the defaults
            are the authors').
    """

    def __init__(self, arch: str | dict[str, Any] = 'tiny', soft_norm: bool = False, in_channels: int = 3,
                 out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1, norm_eval: bool = False,
                 with_cp: bool = False, drop_path_rate: float = 0.1, soft_block_norm: str = 'post',
                 qk_init_std: float = 0.02, compile_stages: bool | dict | None = None,
                 norm_cfg: Mapping[str, Any] = DEFAULT_NORM_CFG, init_cfg: dict | list[dict] | None = None,
                 partial_pretrained: bool = False, **attention: Any) -> None:
        if isinstance(out_indices, int):
            out_indices = (out_indices,)
        out_indices = tuple(out_indices)
        if not out_indices or any(not isinstance(i, int) or not 0 <= i <= 3 for i in out_indices):
            raise ValueError(f'out_indices must be a non-empty sequence of stage indices in 0..3, got {out_indices}')
        if not (isinstance(frozen_stages, int) and -1 <= frozen_stages <= 4):
            raise ValueError(f'frozen_stages must be an int in -1..4, got {frozen_stages!r}')
        if not isinstance(partial_pretrained, bool):
            raise TypeError(f'partial_pretrained must be True or False, got {partial_pretrained!r}')
        super().__init__(arch, soft_norm=soft_norm, in_channels=in_channels, drop_path_rate=drop_path_rate,
                         with_cp=with_cp, attention=model_attention_settings(type(self), attention),
                         soft_block_norm=soft_block_norm, qk_init_std=qk_init_std, compile_stages=compile_stages,
                         conv_norm_layer=conv_norm_layer(norm_cfg), init_cfg=init_cfg)
        self.norm_cfg = dict(norm_cfg)
        self.out_indices = out_indices
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.partial_pretrained = partial_pretrained
        self._loading_pretrained: str | None = None  # the Pretrained file init_weights is loading
        self.init_pyramid_weights()
        self._freeze_stages()

    def init_weights(self) -> None:
        """mmengine's ``BaseModule.init_weights``: ``init_cfg`` applied over the default initialisation the model
        was built with (:meth:`~soft_mm.models.pyramid.SoftPyramid.init_pyramid_weights`: timm's truncated-normal
        linears and position embeddings, Kaiming convs): a ``Pretrained`` checkpoint whose backbone tensors are this
        backbone's (else a :class:`~soft_mm.utils.checkpoint.CheckpointFileError` names what the file holds and what
        was built; ``partial_pretrained=True``: what fits, the rest keeping the default); other initialisers after the
        default; without ``init_cfg`` the weights stay as built. Once: a second call only warns, as mmengine's does,
        and leaves the weights as they are."""
        self._loading_pretrained = None if getattr(self, 'is_init', False) else pretrained_checkpoint(self.init_cfg)
        try:
            super().init_weights()
        finally:
            self._loading_pretrained = None

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any],
                              strict: bool, missing_keys: list[str], unexpected_keys: list[str],
                              error_msgs: list[str]) -> None:
        """While :meth:`init_weights` loads its ``Pretrained`` file: check that its backbone tensors fit first (or,
        with ``partial_pretrained``, warn what fits); then the pyramid's load (which reads the authors' layout)."""
        if self._loading_pretrained is not None:
            self.check_pretrained(state_dict, self._loading_pretrained, prefix, warn=True)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def check_pretrained(self, state_dict: Mapping[str, torch.Tensor], path: str, prefix: str | None = None,
                         warn: bool = False, where: str = 'the SOFT backbone') -> None:
        """Check that the backbone tensors of a ``Pretrained`` checkpoint's ``state_dict`` (under ``prefix``) are this
        backbone's (:func:`~soft_mm.models.checkpoint_fit.check_backbone_checkpoint`), as :meth:`init_weights` does
        and the tools do before they run (``where``: the config's name of the backbone); with ``partial_pretrained``
        only a file of another model is refused, and ``warn`` says what a partial load takes."""
        own = {key[len(prefix or ''):]: value for key, value in state_dict.items() if key.startswith(prefix or '')}
        mismatch = check_backbone_checkpoint(self, own, path, partial=self.partial_pretrained, where=where)
        if warn and self.partial_pretrained:
            warnings.warn(describe_partial_load(mismatch, path), stacklevel=3)

    @property
    def out_channels(self) -> list[int]:
        """Channels of the returned maps, in ``out_indices`` order (what a neck's ``in_channels`` needs)."""
        return [self.embed_dims[i] for i in self.out_indices]

    def _frozen_modules(self) -> list[nn.Module]:
        if self.frozen_stages < 0:
            return []
        modules = [self.stages[0].downsample]
        modules += list(self.stages[:self.frozen_stages])
        if self.frozen_stages == 4:
            modules.append(self.norm)
        return modules

    def _freeze_stages(self) -> None:
        if self.frozen_stages >= 0:
            self.stages[0].pos_embed.requires_grad_(False)
        for module in self._frozen_modules():
            module.eval()
            for param in module.parameters():
                param.requires_grad_(False)

    def train(self, mode: bool = True) -> SOFT:
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        maps, _ = self.forward_pyramid(x, last_stage=max(self.out_indices))
        return tuple(maps[i] for i in self.out_indices)
