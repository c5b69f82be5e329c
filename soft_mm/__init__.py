"""soft_mm: SOFT (softmax-free transformers with linear complexity) for OpenMMLab detection and segmentation.

``import soft_mm`` (or ``custom_imports=dict(imports=['soft_mm'])`` in a config) registers the ``SOFT`` backbone
for mmdet and mmseg configs and the ``soft_*`` / ``soft_norm_*`` models in timm, and allow-lists the objects mmengine
stores in its checkpoints for ``torch.load(weights_only=True)`` (torch >= 2.6), so ``--resume``, ``load_from`` and
testing a checkpoint work with any OpenMMLab tool.
"""
from . import engine, models, utils  # engine: registers the checkpoint and invalid-loss hooks
from .models import SOFT, SoftVisionTransformer
from .registry import register_backbones
from .version import __version__

register_backbones()

__all__ = ['SOFT', 'SoftVisionTransformer', '__version__', 'models', 'utils']
