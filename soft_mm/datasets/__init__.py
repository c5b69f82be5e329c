"""Datasets: the synthetic shapes generator (numpy/OpenCV only) and, when mmdet / mmseg are installed, their classes."""
import importlib.util

from .synthetic_shapes import (
    SHAPE_CLASSES,
    ensure_semantic_labels,
    ensure_shapes_dataset,
    write_semantic_labels,
    write_shapes_dataset,
)

__all__ = ['SHAPE_CLASSES', 'ensure_semantic_labels', 'ensure_shapes_dataset', 'write_semantic_labels',
           'write_shapes_dataset']

if importlib.util.find_spec('mmdet') is not None:
    from .shapes_dataset import SyntheticShapesDataset  # noqa: F401  (registers it in mmdet's DATASETS)

    __all__.append('SyntheticShapesDataset')

if importlib.util.find_spec('mmseg') is not None:
    from .shapes_seg_dataset import SyntheticShapesSegDataset  # noqa: F401  (registers it in mmseg's DATASETS)

    __all__.append('SyntheticShapesSegDataset')
