"""mmseg dataset class for the synthetic shapes data: semantic label maps rendered from the COCO polygons."""
from __future__ import annotations

from typing import ClassVar

from mmseg.datasets import BaseSegDataset
from mmseg.registry import DATASETS

from .synthetic_shapes import SHAPE_CLASSES, ensure_semantic_labels


@DATASETS.register_module()
class SyntheticShapesSegDataset(BaseSegDataset):
    """``BaseSegDataset`` over the synthetic shapes images and their label maps (``root/semantic/{split}``).

    Label 0 is background and 1-3 are circle, square and triangle. If ``data_root`` does not exist the whole dataset
    is generated there first; if it exists without label maps (e.g. written by the detection demo) only the maps are
    rendered from its COCO json. Both steps are atomic, so distributed ranks that start together are safe.
    ``generator`` holds the keyword arguments of :func:`~soft_mm.datasets.synthetic_shapes.write_shapes_dataset`;
    the train and val datasets of a config must pass the same ones, since whichever is built first writes both splits.
    """

    METAINFO: ClassVar[dict] = {
        'classes': ('background', *SHAPE_CLASSES),
        'palette': [(0, 0, 0), (220, 20, 60), (0, 130, 230), (20, 170, 60)]}
    # tools/train.py and tools/test.py skip their missing-path check for datasets that write their own data
    generates_missing_data = True

    def __init__(self, *args, generator: dict | None = None, img_suffix: str = '.png', seg_map_suffix: str = '.png',
                 reduce_zero_label: bool = False, **kwargs) -> None:
        self.generator = dict(generator or {})  # set first: super().__init__ calls full_init()
        super().__init__(*args, img_suffix=img_suffix, seg_map_suffix=seg_map_suffix,
                         reduce_zero_label=reduce_zero_label, **kwargs)

    def full_init(self) -> None:
        if not self._fully_initialized:
            if not self.data_root:
                raise ValueError('SyntheticShapesSegDataset needs data_root: the folder to read or generate the data '
                                 'in')
            ensure_semantic_labels(self.data_root, **self.generator)
        super().full_init()
