"""The SOFT pyramid shared by the mm backbone and the timm classifier: one self-running stage class built in a loop.

Layout (identical in :class:`~soft_mm.models.SOFT` and :class:`~soft_mm.models.SoftVisionTransformer`, so an
ImageNet checkpoint loads into the backbone with only the classifier's ``cls_token``, ``cls_pos_embed`` and
``head`` left over)::

    stages.{i}.downsample   conv stem (i = 0, stride 4) or conv3x3 s2 + BN + ReLU
    stages.{i}.pos_embed    (1, (56 / 2^i)^2, C_i): learned for 224 input, resized to any H x W
    stages.{i}.blocks.{j}   SOFT post-norm blocks or softmax pre-norm blocks (arch table ``stage_attention``)
    norm                    LayerNorm on the stage-4 tokens

The layout carries a version (``SoftPyramid._version``, stored by ``state_dict()`` in its metadata, as mmpretrain's
Swin does); ``_load_from_state_dict`` migrates older layouts on load. The layouts so far:

- the authors' (fudan-zvg/SOFT: ``patch_embed{1..4}``, ``block{1..4}``, ``pos_embed4`` with the cls slot): the layout
  the published weights come in, written before soft_mm existed, so without a soft_mm version. Recognised by its key
  names under the module's prefix and renamed by the key map beside the model
  (:func:`~soft_mm.models.official.layout.migrate_official_keys`) with this model's own arch — so ``load_state_dict``,
  timm's ``create_model(..., checkpoint_path=...)`` and mmengine's ``init_cfg=dict(type='Pretrained', ...)`` read
  the authors' files as they are;
- version 1: the layout above (torch's default module version, so every soft_mm checkpoint saved so far says 1;
  a state dict without metadata, e.g. after timm's ``clean_state_dict``, is taken as version 1 too).

A state dict of a newer version than the code is refused with a message that says so.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_function
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.utils.checkpoint import checkpoint

from ..ops.graph_mode import exporting
from ..ops.route import Route, decided, route_of
from .arch import resolve_arch
from .attention import SoftAttention, SoftmaxAttention
from .blocks import Block, TanhGELU, drop_path_scales
from .compiled import BUCKET_KEYWORD, CompiledStages, check_compile_stages, padded_input
from .conv import ConvBNAct, NormLayer, conv_stem
from .official.layout import is_official_layout, migrate_official_keys
from .settings import AUTHORS_SETTINGS, AttentionSettings
from .weight_cast import CastWeights, cast_once_applies, weights_cast_once

PRETRAIN_IMG_SIZE = 224


# torch.fx (timm's ``feature_cls='fx'``, torchvision's ``create_feature_extractor``, FX quantization): the functions
# below branch in Python on sizes, so a symbolic trace keeps each as one node that the traced model runs eagerly,
# registered both ways timm registers its own (``torch.fx.wrap`` for plain ``symbolic_trace``, timm's registry for
# its tracer).
@torch.fx.wrap
@register_notrace_function  # reason: branches on the input's dims
def check_pyramid_input(x: torch.Tensor, in_channels: int) -> torch.Tensor:
    """``x`` itself, once it is a ``(B, in_channels, H, W)`` batch; a ValueError naming the shape otherwise."""
    if x.ndim != 4:
        raise ValueError(f'input must be (B, C, H, W), got shape {tuple(x.shape)}')
    if x.shape[1] != in_channels:
        raise ValueError(f'input must have in_channels={in_channels} channels, got {x.shape[1]} '
                         f'(shape {tuple(x.shape)})')
    return x


@torch.fx.wrap
@register_notrace_function  # reason: skips the resize at the embedding's own size (a branch on the map size)
def resize_pos_embed(pos_embed: torch.Tensor, pos_grid: int, hw_shape: tuple[int, int]) -> torch.Tensor:
    """``pos_embed (1, pos_grid**2, C) -> (1, H*W, C)``, bilinearly resized to ``hw_shape``.

    The resize is skipped at ``pos_grid x pos_grid``, except while a graph is exported (ONNX / torch.export /
    jit trace): there it always runs (an exact identity at that size), so the graph keeps H and W symbolic.
    """
    if not exporting() and tuple(hw_shape) == (pos_grid, pos_grid):
        return pos_embed
    grid = pos_embed.reshape(1, pos_grid, pos_grid, -1).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=tuple(hw_shape), mode='bilinear', align_corners=False)
    return grid.flatten(2).transpose(1, 2)


def _reentrant_ready(stage: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x``, made to require a gradient where a wrapper put on the stage's ``forward`` (one made with
    ``functools.wraps``, as mmengine's ``activation_checkpointing=['backbone.stages.0']`` puts a reentrant checkpoint
    there) would otherwise give its trainable weights none: a reentrant checkpoint's output needs a gradient only where
    an input does, and the first stage's input, the image, needs none. The image's gradient is then computed in the
    backward and dropped."""
    wrapper = vars(stage).get('forward')
    if wrapper is None or not hasattr(wrapper, '__wrapped__') or not torch.is_grad_enabled() or x.requires_grad:
        return x
    if not any(p.requires_grad for p in stage.parameters()):
        return x
    return x.detach().requires_grad_()


class SoftStage(nn.Module):
    """One pyramid level that runs itself: downsample -> tokens + position embedding -> blocks -> NCHW map.

    ``forward(x (B, C_in, H_in, W_in), prefix_tokens (B, P, C) | None, norm) -> (map (B, C, H, W), prefix (B, P, C) |
    None)``. In eager mode the map is a channels-last view of the tokens (no copy): the next stage's downsampling conv
    reads it in that layout and writes channels-last, so its tokens are a view too; the pyramid hands its callers NCHW
    copies. Prefix tokens (the classifier's cls token, position embedding included) join the blocks' sequence in
    front of the map tokens and come back separately; ``norm`` (the pyramid's final norm, which the checkpoint layout
    keeps at the top level) is applied to all tokens after the blocks when given.

    On the GPU route under autocast the stage's weights are cast once per forward
    (:func:`~soft_mm.models.weight_cast.weights_cast_once`), and in training the stochastic-depth masks of all its
    blocks are drawn at once (:func:`~soft_mm.models.blocks.drop_path_scales`), each applied inside the sum it guards.
    """

    def __init__(self, downsample: nn.Module, dim: int, pos_grid: int, blocks: list[nn.Module],
                 with_cp: bool = False) -> None:
        super().__init__()
        self.downsample = downsample
        self.pos_grid = pos_grid
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_grid * pos_grid, dim))
        self.blocks = nn.ModuleList(blocks)
        self.with_cp = with_cp
        # each block's two branches' keep probabilities (1 - drop_prob), (2 * blocks, 1); None without stochastic depth
        keep = [1.0 - getattr(block, 'drop_prob', 0.0) for block in blocks for _ in range(2)]
        self.register_buffer('drop_keep', torch.tensor(keep).reshape(-1, 1) if min(keep, default=1.0) < 1 else None,
                             persistent=False)

    def resized_pos_embed(self, hw_shape: tuple[int, int]) -> torch.Tensor:
        """``(1, H*W, C)``: the 224-input embedding bilinearly resized to ``hw_shape`` (:func:`resize_pos_embed`)."""
        return resize_pos_embed(self.pos_embed, self.pos_grid, hw_shape)

    def _run_block(self, block: nn.Module, tokens: torch.Tensor, hw_shape: tuple[int, int],
                   drop_scales: torch.Tensor | None, route: Route, cast: CastWeights | None) -> torch.Tensor:
        if self.with_cp and torch.is_grad_enabled():
            if cast is not None:  # the recomputation, after the stage's forward, runs on the same cast weights
                return checkpoint(cast.run_block, block, tokens, hw_shape, drop_scales, route, *cast.of_block(block),
                                  use_reentrant=False)
            return checkpoint(block, tokens, hw_shape, drop_scales, route, use_reentrant=False)
        return block(tokens, hw_shape, drop_scales, route)

    def forward(self, x: torch.Tensor, prefix_tokens: torch.Tensor | None = None, norm: nn.Module | None = None,
                route: Route | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``route``: the forward's :class:`~soft_mm.ops.route.Route` (None: the route of ``x``, made here)."""
        route = decided(route, x)
        if not cast_once_applies(self, x, route):  # (no context manager where a graph is traced)
            return self._forward(x, prefix_tokens, norm, route, None)
        with weights_cast_once(self, x, route) as cast:
            return self._forward(x, prefix_tokens, norm, route, cast)

    def _forward(self, x: torch.Tensor, prefix_tokens: torch.Tensor | None, norm: nn.Module | None, route: Route,
                 cast: CastWeights | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not route.exporting:
            x = x.contiguous(memory_format=torch.channels_last)
        x = self.downsample(x)
        b, c, h, w = x.shape
        # (B, N, C), contiguous. The tokens keep the downsampling's dtype: under autocast the residual stream then
        # stays in the low dtype the conv wrote (as for Swin and ConvNeXt), instead of a float32 position embedding
        # promoting it and every linear casting its input back (a copy per linear, and slower mixed-dtype adds)
        tokens = x.flatten(2).transpose(1, 2) + self.resized_pos_embed((h, w)).to(x.dtype)
        # (branches on None only, never on a size: torch.fx traces this method)
        num_prefix = 0 if prefix_tokens is None else prefix_tokens.shape[1]
        if prefix_tokens is not None:
            tokens = torch.cat([prefix_tokens.expand(b, -1, -1).to(tokens.dtype), tokens], dim=1)
        # (B, 2 * blocks) masks of stochastic depth, drawn at once; none in eval mode
        scales = (drop_path_scales(self.drop_keep, b, tokens.dtype) if self.training and self.drop_keep is not None
                  else None)
        for j, block in enumerate(self.blocks):
            tokens = self._run_block(block, tokens, (h, w), None if scales is None else scales[2 * j:2 * j + 2],
                                     route, cast)
        if norm is not None:
            tokens = norm(tokens)
        prefix_out = None if prefix_tokens is None else tokens[:, :num_prefix]
        # the map is the stage's last operation: timm's feature_cls='fx' takes the last node of stages.{i} as its map
        out_map = tokens[:, num_prefix:].transpose(1, 2).reshape(b, c, h, w)
        # (exporting a graph, NCHW: a channels-last input makes torch.export guard on the batch size)
        return (out_map.contiguous() if route.exporting else out_map), prefix_out


# Block recipe of each attention kind (arch table ``stage_attention``): SOFT stages are post-norm blocks with the
# tanh GELU, the softmax stage a pre-norm block.
SOFT_BLOCK_NORMS = ('post', 'pre')
_BLOCK_STYLES = {
    'soft': dict(post_norm=True, norm_eps=1e-5, act_layer=TanhGELU),
    'softmax': dict(post_norm=False, norm_eps=1e-6, act_layer=nn.GELU),
}


class SoftPyramid(nn.Module):
    """The four SOFT stages and the final norm, shared by the mm backbone and the classifier (both subclass it).

    ``forward_pyramid(x, prefix_tokens, last_stage)`` runs the stages up to ``last_stage``; prefix tokens enter the
    last stage of the pyramid (stage 4). Extra keyword arguments go to the next class in the MRO (``init_cfg`` of
    mmengine's ``BaseModule`` for the backbone).

    Args:
        arch: a name of the arch table or a dict (see :func:`~soft_mm.models.arch.resolve_arch`).
        soft_norm: SOFT-Norm attention in the SOFT stages.
        in_channels: input image channels.
        drop_path_rate: stochastic depth, rising linearly from 0 to this value over all blocks.
        with_cp: gradient checkpointing of every block.
        attention: the SOFT attention settings (:class:`~soft_mm.models.settings.AttentionSettings`).
        soft_block_norm: ``'post'`` (the authors' SOFT blocks, ``x = LN(x + f(x))``) or ``'pre'``
            (``x = x + f(LN(x))``, as the softmax stage) in the SOFT stages; same parameters and state-dict keys.
        qk_init_std: std of the truncated-normal initialisation of the SOFT layers' shared q/k projection (the
            authors' 0.02 by default, as every other linear). Only a model trained from scratch sees it: with 0.02
            the queries start small against the Gaussian kernel's bandwidth, so the kernel starts near all-ones.
        conv_norm_layer: ``conv_norm_layer(channels)`` builds the norm of the conv stem's and the downsampling convs'
            (BatchNorm by default; the mm backbone builds it from its ``norm_cfg``, e.g. SyncBN); each stays
            ``...downsample(.k).bn`` in the state dict.
    """

    # The state-dict layout version (see the module docstring); bump it with a migration in _load_from_state_dict.
    _version = 1

    def __init__(self, arch: str | dict[str, Any] = 'tiny', soft_norm: bool = False, in_channels: int = 3,
                 drop_path_rate: float = 0.1, with_cp: bool = False, attention: AttentionSettings = AUTHORS_SETTINGS,
                 soft_block_norm: str = 'post', qk_init_std: float = 0.02, compile_stages: bool | dict | None = None,
                 conv_norm_layer: NormLayer = nn.BatchNorm2d, **base_kwargs: Any) -> None:
        super().__init__(**base_kwargs)
        self.compile_stages = check_compile_stages(compile_stages)
        self._compiled = CompiledStages()
        settings = resolve_arch(arch)
        if soft_block_norm not in SOFT_BLOCK_NORMS:
            raise ValueError(f'soft_block_norm={soft_block_norm!r} is not one of {SOFT_BLOCK_NORMS}')
        if isinstance(qk_init_std, bool) or not isinstance(qk_init_std, (int, float)) or not 0 < qk_init_std < 10:
            raise ValueError(f'qk_init_std must be a number in (0, 10), got {qk_init_std!r}')
        self.soft_block_norm = soft_block_norm
        self.qk_init_std = float(qk_init_std)
        if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(f'in_channels must be a positive int, got {in_channels!r}')
        if not 0.0 <= drop_path_rate < 1.0:
            raise ValueError(f'drop_path_rate must be in [0, 1), got {drop_path_rate!r}')
        self.arch_settings = settings
        self.attention_settings = attention
        self.in_channels = in_channels
        self.soft_norm = soft_norm
        self.embed_dims = settings['embed_dims']
        depths = settings['depths']
        num_blocks = sum(depths)
        rates = [drop_path_rate * i / max(num_blocks - 1, 1) for i in range(num_blocks)]  # linear 0 -> rate
        soft_stage_params = iter(zip(settings['landmark_strides'], settings['v_conv_kernels']))
        stages = []
        for i, (dim, heads, kind) in enumerate(zip(self.embed_dims, settings['num_heads'],
                                                   settings['stage_attention'])):
            downsample = (conv_stem(in_channels, dim, conv_norm_layer) if i == 0
                          else ConvBNAct(self.embed_dims[i - 1], dim, 2, norm_layer=conv_norm_layer))
            if kind == 'soft':
                stride, kernel = next(soft_stage_params)
                make_attn = partial(SoftAttention, dim, heads, landmark_stride=stride, v_conv_kernel=kernel,
                                    soft_norm=soft_norm, settings=attention)
            else:
                make_attn = partial(SoftmaxAttention, dim, heads)
            style = dict(_BLOCK_STYLES[kind], **({'post_norm': soft_block_norm == 'post'} if kind == 'soft' else {}))
            blocks = [Block(dim, make_attn(), settings['mlp_ratio'], drop_path=rate, **style)
                      for rate in rates[sum(depths[:i]):sum(depths[:i + 1])]]
            stages.append(SoftStage(downsample, dim, PRETRAIN_IMG_SIZE // 4 // 2 ** i, blocks, with_cp=with_cp))
        self.stages = nn.ModuleList(stages)
        self.norm = nn.LayerNorm(self.embed_dims[-1], eps=1e-6)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any],
                              strict: bool, missing_keys: list[str], unexpected_keys: list[str],
                              error_msgs: list[str]) -> None:
        """Migrate the keys under ``prefix`` to the current layout (in place, before the children read them)."""
        version = local_metadata.get('version')
        if version is not None and version > self._version:
            raise ValueError(f'the state dict under {prefix or "the top level"!r} has the SOFT layout version '
                             f'{version}, newer than this soft_mm reads ({self._version}): update soft_mm')
        from ..utils.checkpoint import allow_mmengine_checkpoint_globals

        # timm reads checkpoints inside torch.serialization.safe_globals([argparse.Namespace]), whose exit removes
        # Namespace from the allow-list soft_mm registers, so a later mmengine load of an mmengine checkpoint in the
        # same process would fail: register it again (idempotent)
        allow_mmengine_checkpoint_globals()
        if is_official_layout(state_dict, prefix):
            unexpected_keys.extend(migrate_official_keys(state_dict, self.arch_settings, prefix))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    @property
    def with_cp(self) -> bool:
        """Gradient checkpointing of every block (set on all stages)."""
        return all(stage.with_cp for stage in self.stages)

    @with_cp.setter
    def with_cp(self, enable: bool) -> None:
        for stage in self.stages:
            stage.with_cp = bool(enable)

    def init_pyramid_weights(self) -> None:
        """timm-style initialisation: truncated-normal linears (the SOFT q/k projections with ``qk_init_std``) and
        position embeddings, Kaiming convs, norms at unit scale and zero shift. The timm classifier runs it when it is
        built; the mm backbone in ``init_weights()``, as mmdet's backbones initialise."""
        qk_weights = {id(m.qk.weight) for m in self.modules() if isinstance(m, SoftAttention)}
        for m in self.modules():
            if isinstance(m, nn.Linear):
                std = self.qk_init_std if id(m.weight) in qk_weights else 0.02
                nn.init.trunc_normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.LayerNorm, nn.GroupNorm, _BatchNorm, _InstanceNorm)):
                if m.weight is not None:
                    nn.init.ones_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for stage in self.stages:
            nn.init.trunc_normal_(stage.pos_embed, std=0.02)

    def forward_pyramid(self, x: torch.Tensor, prefix_tokens: torch.Tensor | None = None,
                        last_stage: int | None = None) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """Run stages ``0..last_stage`` (default: all) on ``x (B, C_in, H, W)``.

        ``prefix_tokens (B, P, C_4)`` (the classifier's cls token, position embedding included) are prepended to the
        tokens of the pyramid's last stage. Returns the NCHW map of each stage run (strides 4, 8, 16, 32; the last
        stage's map after ``norm``) and the prefix tokens after the last stage (normed), or None when it was not run.
        """
        x = check_pyramid_input(x, self.in_channels)
        final = len(self.embed_dims) - 1  # the arch's last stage (a pruned classifier may hold fewer)
        last_stage = len(self.stages) - 1 if last_stage is None else min(last_stage, len(self.stages) - 1)
        maps, prefix_out = [], None
        divisor = (self.compile_stages or {}).get(BUCKET_KEYWORD, 1)
        crop = None  # (compile_stages' size buckets, for CUDA graphs; a branch on None only where fx traces this)
        if divisor > 1:
            x, crop = padded_input(x, divisor)
        # the route of the forward, decided once and handed to every stage (under compile_stages each stage decides
        # its own, in its graph)
        route = None if self.compile_stages else route_of(x)
        for i, stage in enumerate(self.stages[:last_stage + 1]):
            is_final = i == final
            prefix, final_norm = (prefix_tokens, self.norm) if is_final else (None, None)
            if route is None:
                run = self._compiled.runner(stage, self.compile_stages, f'stage {i + 1}')
                x, prefix_out = run(x, prefix, final_norm)
            else:
                x, prefix_out = stage(_reentrant_ready(stage, x), prefix, final_norm, route)
            # contiguous NCHW: the stage's channels-last view is what mmcv's RoIAlign (and other C++/CUDA ops
            # that read the raw buffer as NCHW) silently misreads
            maps.append((x if crop is None else crop(x, i)).contiguous())
        return maps, prefix_out
