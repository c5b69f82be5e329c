"""Registry glue, run once by ``import soft_mm`` (and so by ``custom_imports=dict(imports=['soft_mm'])``).

* ``type='SOFT'`` from any OpenMMLab scope (mmdet, mmseg, mmpretrain, ...) and ``type='soft_mm.SOFT'``: the backbone
  is registered in mmengine's root ``MODELS``, which every downstream registry falls back to, and in soft_mm's own
  child registry (scope ``soft_mm``); where another package already registered a different ``SOFT`` there, ``import
  soft_mm`` stops with a one-sentence :class:`RegistryConflictError` instead of replacing it.
* The demo datasets (``SyntheticShapesDataset`` for mmdet, ``SyntheticShapesSegDataset`` for mmseg,
  ``SyntheticClassesDataset`` for mmpretrain: the list is :data:`soft_mm.datasets.DATASET_CLASSES`) and mmpretrain's
  ``SoftTimmClassifier`` are registered in mmengine's root registries as small factories that import their module on
  first use, so ``import soft_mm`` does not import mmdet, mmseg or mmpretrain; importing the module registers the
  class itself in its package's registry as well. This is the only place they are registered from.
* soft_mm's image loading (``CheckedLoadImageFromFile``, which names an image it cannot load) is registered in
  mmengine's root ``TRANSFORMS`` the same lazy way (its module imports mmcv).
* The objects mmengine stores in its checkpoints are allow-listed for ``torch.load(weights_only=True)`` (torch >= 2.6),
  so ``--resume``, ``load_from`` and testing a checkpoint work with any OpenMMLab tool
  (:func:`soft_mm.utils.checkpoint.allow_mmengine_checkpoint_globals`).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import TRANSFORMS as MMENGINE_TRANSFORMS
from mmengine.registry import Registry

from .datasets import DATASET_CLASSES

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='soft_mm', locations=['soft_mm.models'])

# name -> module defining the class (imported on first build): classes that subclass mmdet's, mmseg's or
# mmpretrain's own, so defining them imports that package
LAZY_DATASETS = DATASET_CLASSES  # the datasets package's list
LAZY_MODELS = {'SoftTimmClassifier': 'soft_mm.models.mmpretrain_classifier'}
LAZY_TRANSFORMS = {'CheckedLoadImageFromFile': 'soft_mm.datasets.image_loading'}


def lazy_class(name: str) -> type:
    """One of soft_mm's lazily registered classes (:data:`LAZY_DATASETS`, :data:`LAZY_MODELS`,
    :data:`LAZY_TRANSFORMS`), importing its module."""
    return getattr(importlib.import_module({**LAZY_DATASETS, **LAZY_MODELS, **LAZY_TRANSFORMS}[name]), name)


def _lazy(name: str, **attributes: Any) -> Callable[..., Any]:
    def build(*args: Any, **kwargs: Any) -> Any:
        return lazy_class(name)(*args, **kwargs)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = f'Builds soft_mm\'s ``{name}`` (its module is imported on first use).'
    for key, value in attributes.items():
        setattr(build, key, value)
    return build


class RegistryConflictError(RuntimeError):
    """Another package registered a different class under a name soft_mm registers."""


def register_backbone(registry: Registry, name: str, cls: type) -> None:
    """Register ``cls`` under ``name`` in ``registry``: again (a re-import of soft_mm's own module replaces its
    earlier class), never over another package's class of that name.

    Raises:
        RegistryConflictError: ``registry`` holds another package's ``name``.
    """
    held = registry.module_dict.get(name)
    if held is not None and (held.__module__, held.__qualname__) != (cls.__module__, cls.__qualname__):
        raise RegistryConflictError(
            f'soft_mm: {registry.name} registry {registry.scope!r} already holds {name!r} from '
            f'{held.__module__}.{held.__qualname__}; soft_mm does not replace it: import soft_mm before that '
            f'package, or give one of the two another name')
    registry.register_module(name=name, module=cls, force=held is not None)


def register_all(models: bool = True) -> None:
    """Register soft_mm's backbone, datasets and image loading and allow-list mmengine's checkpoint globals
    (idempotent); ``models=False`` (timm is not installed) leaves out the backbone and the mmpretrain classifier."""
    from .utils.checkpoint import allow_mmengine_checkpoint_globals

    if models:
        from .models.backbone import SOFT

        for registry in (MMENGINE_MODELS, MODELS):
            register_backbone(registry, 'SOFT', SOFT)
    for name in LAZY_DATASETS:  # every soft_mm dataset writes its data when it is missing
        if MMENGINE_DATASETS.get(name) is None:
            MMENGINE_DATASETS.register_module(name=name, module=_lazy(name, generates_missing_data=True))
    for registry, names in ((MMENGINE_MODELS, LAZY_MODELS if models else {}), (MMENGINE_TRANSFORMS, LAZY_TRANSFORMS)):
        for name in names:
            if registry.get(name) is None:
                registry.register_module(name=name, module=_lazy(name))
    allow_mmengine_checkpoint_globals()
