"""The dense variant of the synthetic shapes data (configs/retinanet_soft_tiny_dense_demo.py): many small shapes on a
cluttered texture, while the defaults draw the shapes demo's images unchanged (the same pixels for the same seed)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from helpers.repo import ROOT

from soft_mm.datasets.synthetic_shapes import draw_image, write_shapes_dataset

DENSE_DEMO = ROOT / 'configs/retinanet_soft_tiny_dense_demo.py'


def test_defaults_draw_the_shapes_demo_unchanged():
    # sha256 of 5 images and their objects drawn with seed 7 by the generator before the dense options existed
    rng = np.random.default_rng(7)
    digest = hashlib.sha256()
    for _ in range(5):
        image, objects = draw_image(rng, 128, 4, (10.0, 30.0))
        digest.update(image.tobytes())
        digest.update(json.dumps(objects).encode())
    assert digest.hexdigest() == 'dd66d753b1ffe253c2386903209598e6e5f6f689cbaadeb81bec613aa4d314ac'


def test_dense_images_hold_many_small_objects_on_texture(tmp_path):
    from mmengine.config import Config

    generator = Config.fromfile(str(DENSE_DEMO)).generator  # 8-16 shapes of circumradius 4-9 px
    assert (generator.min_objects, generator.max_objects, tuple(generator.radius_range)) == (8, 16, (4.0, 9.0))
    write_shapes_dataset(tmp_path, **dict(generator, num_train=20, num_val=4))
    coco = json.loads((tmp_path / 'annotations/instances_train.json').read_text())
    per_image = np.bincount([a['image_id'] for a in coco['annotations']], minlength=21)[1:]
    assert per_image.min() >= 4 and per_image.mean() >= 8  # rejection sampling may not fit all of 8-16
    sides = np.array([max(a['bbox'][2:]) for a in coco['annotations']])
    assert sides.min() >= 4 and sides.max() <= 2 * 9 + 1
    image = cv2.imread(str(tmp_path / 'train/000001.png')).astype(np.float64)
    smooth = cv2.GaussianBlur(image, (0, 0), 3)
    # clutter at every scale: the texture varies a lot even after smoothing out the per-pixel noise
    assert smooth.std(axis=(0, 1)).mean() > 20


@pytest.mark.parametrize(('kwargs', 'message'), [
    ({'background': 'stripes'}, r"background must be one of \('gradient', 'texture'\)"),
    ({'min_objects': 5, 'max_objects': 4}, r'min_objects must be in \[1, max_objects=4\]'),
])
def test_bad_generator_settings_name_themselves(tmp_path: Path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        write_shapes_dataset(tmp_path, num_train=1, num_val=1, **kwargs)
