"""Datasets: the synthetic shapes generator (numpy/OpenCV only) and, when mmdet is installed, its mmdet class."""
import importlib.util

from .synthetic_shapes import SHAPE_CLASSES, ensure_shapes_dataset, write_shapes_dataset

__all__ = ['SHAPE_CLASSES', 'ensure_shapes_dataset', 'write_shapes_dataset']

if importlib.util.find_spec('mmdet') is not None:
    from .shapes_dataset import SyntheticShapesDataset  # noqa: F401  (registers it in mmdet's DATASETS)

    __all__.append('SyntheticShapesDataset')
