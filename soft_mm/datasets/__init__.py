"""Datasets: the synthetic shapes and classes generators (numpy/OpenCV only) and their dataset classes for mmdet, mmseg
and mmpretrain.

:data:`DATASET_CLASSES` names each dataset class and its module: ``import soft_mm`` registers them from it
(:func:`soft_mm.registry.register_all`, lazily, in mmengine's root ``DATASETS``), and ``from soft_mm.datasets import
SyntheticShapesDataset`` imports the module on first access. Importing a class's module imports its framework and
registers the class in that framework's ``DATASETS`` too.
"""
import importlib
from typing import Any

from .synthetic_classes import CLASS_NAMES, ensure_classes_dataset, write_classes_dataset
from .synthetic_shapes import (
    SHAPE_CLASSES,
    ensure_semantic_labels,
    ensure_shapes_dataset,
    write_semantic_labels,
    write_shapes_dataset,
)

# class name -> the module defining it, which subclasses mmdet's, mmseg's or mmpretrain's own dataset (so importing it
# imports that framework)
DATASET_CLASSES = {
    'SyntheticShapesDataset': 'soft_mm.datasets.shapes_dataset',  # mmdet
    'SyntheticShapesSegDataset': 'soft_mm.datasets.shapes_seg_dataset',  # mmseg
    'SyntheticClassesDataset': 'soft_mm.datasets.classes_dataset',  # mmpretrain
}

__all__ = ['CLASS_NAMES', 'DATASET_CLASSES', 'SHAPE_CLASSES', 'ensure_classes_dataset', 'ensure_semantic_labels',
           'ensure_shapes_dataset', 'write_classes_dataset', 'write_semantic_labels', 'write_shapes_dataset']


def __getattr__(name: str) -> Any:
    if name in DATASET_CLASSES:  # imports its framework: on first access only
        return getattr(importlib.import_module(DATASET_CLASSES[name]), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
