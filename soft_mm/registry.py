"""Registry glue, run once by ``import soft_mm`` (and so by ``custom_imports=dict(imports=['soft_mm'])``).

* ``type='SOFT'`` from any OpenMMLab scope (mmdet, mmseg, mmpretrain, ...) and ``type='soft_mm.SOFT'``: the backbone
  is registered in mmengine's root ``MODELS``, which every downstream registry falls back to, and in soft_mm's own
  child registry (scope ``soft_mm``).
* The demo datasets (``SyntheticShapesDataset`` for mmdet, ``SyntheticShapesSegDataset`` for mmseg) are registered in
  mmengine's root ``DATASETS`` as small factories that import their module on first use, so ``import soft_mm`` does not
  import mmdet or mmseg; importing the module registers the class itself in its package's registry as well.
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
from mmengine.registry import Registry

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='soft_mm', locations=['soft_mm.models'])

# name -> module defining the dataset class (imported on first build)
LAZY_DATASETS = {
    'SyntheticShapesDataset': 'soft_mm.datasets.shapes_dataset',
    'SyntheticShapesSegDataset': 'soft_mm.datasets.shapes_seg_dataset',
}


def dataset_class(name: str) -> type:
    """The class of one of soft_mm's datasets (:data:`LAZY_DATASETS`), importing its module."""
    return getattr(importlib.import_module(LAZY_DATASETS[name]), name)


def _lazy_dataset(name: str) -> Callable[..., Any]:
    def build(*args: Any, **kwargs: Any) -> Any:
        return dataset_class(name)(*args, **kwargs)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = f'Builds ``{LAZY_DATASETS[name]}.{name}`` (imported on first use).'
    build.generates_missing_data = True  # every soft_mm dataset writes its data when it is missing
    return build


def register_all() -> None:
    """Register soft_mm's backbone and datasets and allow-list mmengine's checkpoint globals (idempotent)."""
    from .models.backbone import SOFT
    from .utils.checkpoint import allow_mmengine_checkpoint_globals

    for registry in (MMENGINE_MODELS, MODELS):
        registry.register_module(name='SOFT', module=SOFT, force=True)
    for name in LAZY_DATASETS:
        if MMENGINE_DATASETS.get(name) is None:
            MMENGINE_DATASETS.register_module(name=name, module=_lazy_dataset(name))
    allow_mmengine_checkpoint_globals()
