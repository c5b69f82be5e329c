"""mmpretrain dataset class for the synthetic class-folder data: a ``CustomDataset`` that writes its data if missing."""
from __future__ import annotations

from typing import ClassVar

from mmpretrain.datasets import CustomDataset
from mmpretrain.registry import DATASETS

from .synthetic_classes import CLASS_NAMES, SPLITS, ensure_classes_dataset


@DATASETS.register_module()
class SyntheticClassesDataset(CustomDataset):
    """``CustomDataset`` over ``data_root/<split>/<class>/*.png`` written by
    :func:`~soft_mm.datasets.synthetic_classes.write_classes_dataset`.

    If ``data_root`` does not exist, both splits are generated there first (atomically, so distributed ranks that
    start together are safe). ``generator`` holds the keyword arguments of ``write_classes_dataset``; the train and
    val datasets of a config must pass the same ones, since whichever is built first writes both splits.

    Args:
        data_root: the folder to read (or generate) the data in.
        split: ``'train'`` or ``'val'``: the sub-folder read.
        generator: keyword arguments of ``write_classes_dataset``.
        **kwargs: the other arguments of mmpretrain's ``CustomDataset`` (``pipeline``, ``lazy_init``, ...).
    """

    METAINFO: ClassVar[dict] = {'classes': CLASS_NAMES}
    # tools/train.py and tools/test.py skip their missing-path check for datasets that write their own data
    generates_missing_data = True

    def __init__(self, data_root: str = '', split: str = 'train', generator: dict | None = None, **kwargs) -> None:
        if split not in SPLITS:
            raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
        if not data_root:
            raise ValueError('SyntheticClassesDataset needs data_root: the folder to read or generate the data in')
        self.generator = dict(generator or {})  # set first: super().__init__ calls full_init()
        super().__init__(data_root=data_root, data_prefix=split, **kwargs)

    def full_init(self) -> None:
        if not self._fully_initialized:
            ensure_classes_dataset(self.data_root, **self.generator)
        super().full_init()
