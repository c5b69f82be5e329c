"""mmdet dataset class for the synthetic shapes data: a ``CocoDataset`` that writes its data when it is missing."""
from __future__ import annotations

from typing import ClassVar

from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS

from .synthetic_shapes import SHAPE_CLASSES, ensure_shapes_dataset


@DATASETS.register_module()
class SyntheticShapesDataset(CocoDataset):
    """``CocoDataset`` over :func:`~soft_mm.datasets.synthetic_shapes.write_shapes_dataset` output.

    If ``data_root`` does not exist, both splits are generated there first (atomically, so distributed ranks that
    start together are safe). ``generator`` holds the keyword arguments of ``write_shapes_dataset``; the train and
    val datasets of a config must pass the same ones, since whichever is built first writes both splits.
    """

    METAINFO: ClassVar[dict] = dict(classes=SHAPE_CLASSES, palette=[(220, 20, 60), (0, 130, 230), (20, 170, 60)])
    # tools/train.py and tools/test.py skip their missing-path check for datasets that write their own data
    generates_missing_data = True

    def __init__(self, *args, generator: dict | None = None, **kwargs) -> None:
        self.generator = dict(generator or {})  # set first: super().__init__ calls full_init()
        super().__init__(*args, **kwargs)

    def full_init(self) -> None:
        if not self._fully_initialized:
            if not self.data_root:
                raise ValueError('SyntheticShapesDataset needs data_root: the folder to read or generate the data in')
            ensure_shapes_dataset(self.data_root, **self.generator)
        super().full_init()
