"""nn.Modules of soft_mm: attention layers, blocks, the pyramid, the mm backbone and the timm classifier.

Everything here needs torch and timm; the mm backbone :class:`SOFT` (an mmengine ``BaseModule``) also needs mmengine
and is imported on first access, so the pyramid and the classifier import where mmengine is not installed.
"""
from .arch import ARCH_SETTINGS, resolve_arch, variant_name
from .attention import SoftAttention, SoftmaxAttention
from .blocks import Block
from .classifier import SoftVisionTransformer
from .pyramid import SoftPyramid, SoftStage
from .settings import AUTHORS_SETTINGS, AttentionSettings

__all__ = ['ARCH_SETTINGS', 'AUTHORS_SETTINGS', 'SOFT', 'AttentionSettings', 'Block', 'SoftAttention', 'SoftPyramid',
           'SoftStage', 'SoftVisionTransformer', 'SoftmaxAttention', 'resolve_arch', 'variant_name']


def __getattr__(name: str):
    if name == 'SOFT':  # the mm backbone: importing it imports mmengine
        from .backbone import SOFT
        return SOFT
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
