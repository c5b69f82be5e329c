"""``CheckedLoadImageFromFile``: mmcv's image loading that names an image it cannot load, or skips it on request.

Registered in mmengine's root ``TRANSFORMS`` by ``import soft_mm`` (lazily: this module imports mmcv), so mmdet, mmseg
and mmpretrain pipelines name it without a scope. soft_mm's ``tools/train.py`` and ``tools/test.py`` put it in place
of every ``LoadImageFromFile`` of a config (:func:`soft_mm.cli.config_loading.use_checked_image_loading`).
"""
from __future__ import annotations

import logging

from mmcv.transforms import LoadImageFromFile
from mmengine.logging import print_log

from ..utils.image_files import (
    UNREADABLE_IMAGE_FIX,
    UNREADABLE_IMAGES_CHOICES,
    UnreadableImageError,
    unreadable_image_problem,
)


class CheckedLoadImageFromFile(LoadImageFromFile):
    """mmcv's ``LoadImageFromFile`` (same arguments) for data sets that may hold an unreadable image.

    An image that cannot be loaded (missing, empty, truncated, not an image) raises :class:`UnreadableImageError`,
    one sentence that names the file and the fix, instead of mmcv's assertion or OpenCV's error (which names no file);
    with ``on_unreadable='skip'`` a warning names the file and the transform returns None, which a training data set
    answers by loading another image in its place (mmengine's ``BaseDataset`` refetch), so the epoch goes on. A test
    data set (``test_mode``) refuses None: there, keep ``'stop'``.

    Args:
        on_unreadable: ``'stop'`` or ``'skip'``.
        **kwargs: the arguments of mmcv's ``LoadImageFromFile`` (``ignore_empty=True`` still skips a missing file
            silently, as there).
    """

    def __init__(self, on_unreadable: str = 'stop', **kwargs) -> None:
        if on_unreadable not in UNREADABLE_IMAGES_CHOICES:
            raise ValueError(f'on_unreadable={on_unreadable!r} is not one of {UNREADABLE_IMAGES_CHOICES}')
        super().__init__(**kwargs)
        self.on_unreadable = on_unreadable

    def transform(self, results: dict) -> dict | None:
        try:
            return super().transform(results)
        except Exception as error:  # cv2.error (empty file), AssertionError (undecodable), OSError, ...
            path = str(results.get('img_path'))
            problem = unreadable_image_problem(path)
            if self.on_unreadable == 'stop':
                raise UnreadableImageError(f'{path} {problem}: {UNREADABLE_IMAGE_FIX}.') from error
            print_log(f'skipping {path}, which {problem}: another image of the data set takes its place; '
                      f'{UNREADABLE_IMAGE_FIX}', logger='current', level=logging.WARNING)
            return None

    def __repr__(self) -> str:
        return f'{super().__repr__()[:-1]}, on_unreadable={self.on_unreadable!r})'
