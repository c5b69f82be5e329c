"""nn.Modules of soft_mm: attention layers, blocks, the pyramid, the mm backbone and the timm classifier."""
from .arch import ARCH_SETTINGS, PUBLISHED, resolve_arch, variant_name
from .attention import SoftAttention, SoftmaxAttention
from .backbone import SOFT
from .blocks import Block
from .classifier import SoftVisionTransformer
from .pyramid import SoftPyramid, SoftStage
from .settings import AUTHORS_SETTINGS, AttentionSettings

__all__ = ['ARCH_SETTINGS', 'AUTHORS_SETTINGS', 'PUBLISHED', 'SOFT', 'AttentionSettings', 'Block', 'SoftAttention',
           'SoftPyramid', 'SoftStage', 'SoftVisionTransformer', 'SoftmaxAttention', 'resolve_arch', 'variant_name']
