"""Registry glue: ``type='SOFT'`` from any OpenMMLab scope (mmdet, mmseg, ...) and ``type='soft_mm.SOFT'``.

``SOFT`` is registered in mmengine's root ``MODELS`` registry, which every downstream registry (mmdet's, mmseg's)
falls back to, and in soft_mm's own child registry (scope ``soft_mm``), so neither mmdet nor mmseg is imported here.
"""
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import Registry

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='soft_mm', locations=['soft_mm.models'])


def register_backbones() -> None:
    from .models.backbone import SOFT

    for registry in (MMENGINE_MODELS, MODELS):
        registry.register_module(name='SOFT', module=SOFT, force=True)
