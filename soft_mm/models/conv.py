"""The pyramid's convolutions: conv + norm (BatchNorm by default) + ReLU with a BatchNorm folded into the conv in eval
mode, the stride-4 stem built of three of them, and conv weights in the input's memory layout."""
from __future__ import annotations

from collections.abc import Callable

import torch
from timm.layers import register_notrace_function
from torch import nn

from ..ops.graph_mode import exporting

__all__ = ['STEM_CHANNELS', 'ConvBNAct', 'NormLayer', 'conv_stem', 'like_input']

STEM_CHANNELS = 32
# what builds a conv's norm: ``norm_layer(channels) -> module`` normalising (B, C, H, W) maps over C (torch's
# BatchNorm2d, SyncBatchNorm, a GroupNorm with its groups bound, or the mm backbone's builder of its norm_cfg)
NormLayer = Callable[[int], nn.Module]


class ConvBNAct(nn.Sequential):
    """``conv(k, stride, bias) -> norm -> ReLU``, the norm built by ``norm_layer(out_channels)`` (BatchNorm by
    default) and kept as ``bn`` whatever its kind, so the state-dict keys stay ``...bn.*``.

    While a BatchNorm (any ``_BatchNorm``: SyncBatchNorm and mmengine's reverted ``_BatchNormXd`` too) normalises with
    its running statistics (eval mode, e.g. inference or ``norm_eval=True`` training) it is an affine map per channel,
    and the forward folds it into the conv's weight and bias (``W * s``, ``(b - mean) * s + beta`` with
    ``s = gamma / sqrt(var + eps)``): one pass over the output map instead of two. The same function of the same
    parameters, so gradients reach the conv and the BatchNorm's affine parameters as unfolded. In training mode, for
    other norms (GroupNorm, InstanceNorm), or once something replaced ``bn`` (e.g. mmcv's ``fuse_conv_bn``), the three
    modules run one after the other.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, kernel_size: int = 3,
                 norm_layer: NormLayer = nn.BatchNorm2d) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, kernel_size // 2)
        self.bn = norm_layer(out_channels)
        self.act = nn.ReLU(inplace=True)

    def folds(self) -> bool:
        """Whether the forward folds the norm into the conv: a BatchNorm normalising with its running statistics
        after a plain conv."""
        bn = self.bn
        return (isinstance(bn, nn.modules.batchnorm._BatchNorm) and not bn.training and bn.running_var is not None
                and type(self.conv) is nn.Conv2d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv, bn = self.conv, self.bn
        if not self.folds():
            if type(conv) is nn.Conv2d:
                return self.act(bn(conv._conv_forward(x, like_input(conv.weight, x), conv.bias)))
            return self.act(bn(conv(x)))
        scale = torch.rsqrt(bn.running_var + bn.eps)
        if bn.weight is not None:
            scale = scale * bn.weight
        bias = -bn.running_mean if conv.bias is None else conv.bias - bn.running_mean
        bias = bias * scale
        if bn.bias is not None:
            bias = bias + bn.bias
        return self.act(conv._conv_forward(x, like_input(conv.weight * scale.reshape(-1, 1, 1, 1), x), bias))


@torch.fx.wrap
@register_notrace_function  # reason: branches on the input's memory layout
def like_input(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A conv ``weight`` in channels-last memory where the input ``x`` is channels-last (and not also
    NCHW-contiguous, as a 1-channel or 1x1 map is), else as it is; as it is while a graph is exported (whose maps are
    NCHW). A conv takes the channels-last kernels when input or weight has that layout, but a batch of one is
    ambiguous to it (the stride of a size-1 batch dim is arbitrary, e.g. a stage's map viewed from its tokens), and
    with an NCHW weight it copies such an input to NCHW first and writes NCHW; the weight (a few thousand elements) is
    the cheap one to convert."""
    if exporting() or x.dim() != 4 or x.is_contiguous() or not x.is_contiguous(memory_format=torch.channels_last):
        return weight
    return weight.contiguous(memory_format=torch.channels_last)


def conv_stem(in_channels: int, out_channels: int, norm_layer: NormLayer = nn.BatchNorm2d) -> nn.Sequential:
    """Stride-4 stem: conv3x3 s2 (-> 32), conv3x3 s1 (32), conv3x3 s2 (-> out), each with its norm (``norm_layer``,
    BatchNorm by default) + ReLU."""
    return nn.Sequential(ConvBNAct(in_channels, STEM_CHANNELS, 2, norm_layer=norm_layer),
                         ConvBNAct(STEM_CHANNELS, STEM_CHANNELS, 1, norm_layer=norm_layer),
                         ConvBNAct(STEM_CHANNELS, out_channels, 2, norm_layer=norm_layer))
