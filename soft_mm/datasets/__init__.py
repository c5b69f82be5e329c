"""Datasets: the synthetic shapes and classes generators (numpy/OpenCV only) and, when mmdet / mmseg / mmpretrain are
installed, their dataset classes."""
import importlib.util

from .synthetic_classes import CLASS_NAMES, ensure_classes_dataset, write_classes_dataset
from .synthetic_shapes import (
    SHAPE_CLASSES,
    ensure_semantic_labels,
    ensure_shapes_dataset,
    write_semantic_labels,
    write_shapes_dataset,
)

__all__ = ['CLASS_NAMES', 'SHAPE_CLASSES', 'ensure_classes_dataset', 'ensure_semantic_labels', 'ensure_shapes_dataset',
           'write_classes_dataset', 'write_semantic_labels', 'write_shapes_dataset']

if importlib.util.find_spec('mmdet') is not None:
    from .shapes_dataset import SyntheticShapesDataset  # noqa: F401  (registers it in mmdet's DATASETS)

    __all__.append('SyntheticShapesDataset')

if importlib.util.find_spec('mmseg') is not None:
    from .shapes_seg_dataset import SyntheticShapesSegDataset  # noqa: F401  (registers it in mmseg's DATASETS)

    __all__.append('SyntheticShapesSegDataset')

if importlib.util.find_spec('mmpretrain') is not None:
    from .classes_dataset import SyntheticClassesDataset  # noqa: F401  (registers it in mmpretrain's DATASETS)

    __all__.append('SyntheticClassesDataset')
