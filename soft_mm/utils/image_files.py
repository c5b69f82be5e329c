"""Unreadable images inside a data set: one sentence that names the file, or a warning and a skip where the config
opts in.

An image that OpenCV cannot decode (a zero-byte file, a PNG cut short by an interrupted copy) otherwise ends a run
with mmcv's ``AssertionError: failed to load image`` or, from a DataLoader worker, ``cv2.error: ... !buf.empty()``
(which names no file), possibly hours in. soft_mm's tools load the images of every data set with
:class:`~soft_mm.datasets.image_loading.CheckedLoadImageFromFile`, which names the file; ``unreadable_images = 'skip'``
in a config makes the training set skip such images with a warning naming each (validation and test sets always
stop: a score over fewer images is not the set's score).
"""
from __future__ import annotations

import os.path as osp

UNREADABLE_IMAGES_KEY = 'unreadable_images'
UNREADABLE_IMAGES_CHOICES = ('stop', 'skip')
UNREADABLE_IMAGE_FIX = 'remove it (and its annotation) or copy it again'


class UnreadableImageError(ValueError):
    """An image of a data set that cannot be loaded; ``str(error)`` is one sentence: the file, what is wrong, the fix.

    A DataLoader worker's exception reaches the main process as ``type(error)(text of its traceback)``; the sentence,
    the last line of that text, is kept.
    """

    def __init__(self, message: str) -> None:
        last_line = message.rstrip().rsplit('\n', 1)[-1]
        marker = f'{type(self).__name__}: '
        super().__init__(last_line.split(marker, 1)[1] if marker in last_line else message)


def unreadable_image_problem(path: str) -> str:
    """What is wrong with an image file that could not be loaded, as a predicate: ``'is empty (0 bytes)'``, ..."""
    if osp.isdir(path):
        return 'is a folder, not an image'
    if not osp.exists(path):
        return 'is missing'
    size = osp.getsize(path)
    if size == 0:
        return 'is empty (0 bytes)'
    return f'cannot be decoded as an image ({size} bytes: truncated, corrupt or not an image format)'
