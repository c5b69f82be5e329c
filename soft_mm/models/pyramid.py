"""The SOFT pyramid shared by the mm backbone and the timm classifier: one stage class built in a loop.

Layout (identical in :class:`~soft_mm.models.SOFT` and :class:`~soft_mm.models.SoftVisionTransformer`, so an
ImageNet checkpoint loads into the backbone with only the classifier's ``cls_token``, ``cls_pos_embed`` and
``head`` left over)::

    stages.{i}.downsample   conv stem (i = 0, stride 4) or conv3x3 s2 + BN + ReLU
    stages.{i}.pos_embed    (1, (56 / 2^i)^2, C_i): learned for 224 input, resized to any H x W
    stages.{i}.blocks.{j}   SOFT post-norm blocks (i < 3), softmax pre-norm blocks (i = 3)
    norm                    LayerNorm on the stage-4 tokens
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .arch import resolve_arch
from .attention import SoftAttention, SoftmaxAttention
from .blocks import Block, TanhGELU

PRETRAIN_IMG_SIZE = 224
STEM_CHANNELS = 32


class ConvBNAct(nn.Sequential):
    """``conv(k, stride, bias) -> BatchNorm -> ReLU``."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, kernel_size: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, kernel_size // 2)
        self.bn = nn.BatchNorm2d(out_channels)
        self.act = nn.ReLU(inplace=True)


def conv_stem(in_channels: int, out_channels: int) -> nn.Sequential:
    """Stride-4 stem: conv3x3 s2 (-> 32), conv3x3 s1 (32), conv3x3 s2 (-> out), each with BN + ReLU."""
    return nn.Sequential(ConvBNAct(in_channels, STEM_CHANNELS, 2), ConvBNAct(STEM_CHANNELS, STEM_CHANNELS, 1),
                         ConvBNAct(STEM_CHANNELS, out_channels, 2))


class SoftStage(nn.Module):
    """Downsampling, position embedding and blocks of one pyramid level."""

    def __init__(self, downsample: nn.Module, dim: int, pos_grid: int, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.downsample = downsample
        self.pos_grid = pos_grid
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_grid * pos_grid, dim))
        self.blocks = nn.ModuleList(blocks)

    def resized_pos_embed(self, hw_shape: tuple[int, int]) -> torch.Tensor:
        """``(1, H*W, C)``: the 224-input embedding bilinearly resized to ``hw_shape``."""
        if tuple(hw_shape) == (self.pos_grid, self.pos_grid):
            return self.pos_embed
        grid = self.pos_embed.reshape(1, self.pos_grid, self.pos_grid, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=tuple(hw_shape), mode='bilinear', align_corners=False)
        return grid.flatten(2).transpose(1, 2)


class SoftPyramidMixin:
    """Builds and runs the four SOFT stages on ``self``; mixed into an ``nn.Module`` (backbone or classifier)."""

    def _build_pyramid(self, arch: str | dict[str, Any] = 'tiny', soft_norm: bool = False, in_channels: int = 3,
                       drop_path_rate: float = 0.1, landmark_mode: str = 'conv', landmark_grid: int = 7,
                       newton_iters: int = 20, newton_ridge: float = 0.01, newton_backward: str = 'implicit',
                       with_cp: bool = False) -> None:
        settings = resolve_arch(arch)
        if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(f'in_channels must be a positive int, got {in_channels!r}')
        if not 0.0 <= drop_path_rate < 1.0:
            raise ValueError(f'drop_path_rate must be in [0, 1), got {drop_path_rate!r}')
        self.arch_settings = settings
        self.soft_norm = soft_norm
        self.embed_dims = settings['embed_dims']
        self.with_cp = with_cp
        depths = settings['depths']
        num_blocks = sum(depths)
        rates = [drop_path_rate * i / max(num_blocks - 1, 1) for i in range(num_blocks)]  # linear 0 -> rate
        stages = []
        for i, (dim, heads, depth) in enumerate(zip(self.embed_dims, settings['num_heads'], depths)):
            downsample = conv_stem(in_channels, dim) if i == 0 else ConvBNAct(self.embed_dims[i - 1], dim, 2)
            block_rates = rates[sum(depths[:i]):sum(depths[:i + 1])]
            if i < 3:
                blocks = [Block(dim, SoftAttention(
                    dim, heads, landmark_mode=landmark_mode, landmark_stride=settings['landmark_strides'][i],
                    landmark_grid=landmark_grid, v_conv_kernel=settings['v_conv_kernels'][i],
                    newton_iters=newton_iters, newton_ridge=newton_ridge, soft_norm=soft_norm,
                    newton_backward=newton_backward), settings['mlp_ratio'], post_norm=True, norm_eps=1e-5,
                    act_layer=TanhGELU, drop_path=rate) for rate in block_rates]
            else:
                blocks = [Block(dim, SoftmaxAttention(dim, heads), settings['mlp_ratio'], post_norm=False,
                                norm_eps=1e-6, act_layer=nn.GELU, drop_path=rate) for rate in block_rates]
            stages.append(SoftStage(downsample, dim, PRETRAIN_IMG_SIZE // 4 // 2 ** i, blocks))
        self.stages = nn.ModuleList(stages)
        self.norm = nn.LayerNorm(self.embed_dims[-1], eps=1e-6)

    def _init_pyramid_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for stage in self.stages:
            nn.init.trunc_normal_(stage.pos_embed, std=0.02)

    def _run_block(self, block: nn.Module, tokens: torch.Tensor, hw_shape: tuple[int, int]) -> torch.Tensor:
        if self.with_cp and torch.is_grad_enabled():
            return checkpoint(block, tokens, hw_shape, use_reentrant=False)
        return block(tokens, hw_shape)

    def _forward_pyramid(self, x: torch.Tensor, prefix_tokens: torch.Tensor | None = None,
                         last_stage: int = 3) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """Run stages ``0..last_stage`` on ``x (B, C_in, H, W)``.

        ``prefix_tokens (B, P, C_4)`` (the classifier's cls token, position embedding included) are prepended to the
        stage-4 tokens. Returns the NCHW map of each stage run (strides 4, 8, 16, 32; the stage-4 map after
        ``norm``) and the prefix tokens after stage 4 (normed), or None.
        """
        if x.ndim != 4:
            raise ValueError(f'input must be (B, C, H, W), got shape {tuple(x.shape)}')
        last_stage = min(last_stage, len(self.stages) - 1)
        if last_stage < 3:
            prefix_tokens = None
        maps = []
        for i, stage in enumerate(self.stages[:last_stage + 1]):
            x = stage.downsample(x)
            b, c, h, w = x.shape
            tokens = x.flatten(2).transpose(1, 2) + stage.resized_pos_embed((h, w))
            num_prefix = 0
            if i == 3 and prefix_tokens is not None:
                num_prefix = prefix_tokens.shape[1]
                tokens = torch.cat([prefix_tokens.expand(b, -1, -1), tokens], dim=1)
            for block in stage.blocks:
                tokens = self._run_block(block, tokens, (h, w))
            if i == 3:
                tokens = self.norm(tokens)
            if num_prefix:
                prefix_tokens, tokens = tokens[:, :num_prefix], tokens[:, num_prefix:]
            # contiguous NCHW: the transposed view is channels-last in memory, which mmcv's RoIAlign (and other
            # C++/CUDA ops that read the raw buffer as NCHW) silently misreads
            x = tokens.transpose(1, 2).reshape(b, c, h, w).contiguous()
            maps.append(x)
        return maps, prefix_tokens
