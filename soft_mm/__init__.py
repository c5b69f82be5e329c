"""soft_mm: SOFT (softmax-free transformers with linear complexity) for OpenMMLab detection and segmentation.

``import soft_mm`` (or ``custom_imports=dict(imports=['soft_mm'], allow_failed_imports=False)`` in a config) only
registers: the ``SOFT`` backbone for mmdet/mmseg configs, the demo datasets, the ``soft_*`` / ``soft_norm_*`` models in
timm, and the objects mmengine stores in its checkpoints for ``torch.load(weights_only=True)`` (see
:mod:`soft_mm.registry`).
"""
from . import engine, models  # noqa: F401  (engine registers the checkpoint and invalid-loss hooks)
from .models import SOFT, SoftVisionTransformer
from .registry import register_all
from .version import __version__

register_all()

__all__ = ['SOFT', 'SoftVisionTransformer', '__version__', 'models']
