"""nn.Modules of soft_mm: attention layers, blocks, the pyramid, the mm backbone and the timm classifier."""
from .arch import ARCH_SETTINGS, PUBLISHED, resolve_arch
from .attention import SoftAttention, SoftmaxAttention
from .backbone import SOFT
from .blocks import Block, Mlp
from .classifier import SoftVisionTransformer

__all__ = ['ARCH_SETTINGS', 'PUBLISHED', 'SOFT', 'Block', 'Mlp', 'SoftAttention', 'SoftVisionTransformer',
           'SoftmaxAttention', 'resolve_arch']
