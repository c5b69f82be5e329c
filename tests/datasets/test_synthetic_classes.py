"""The synthetic class-folder data of the ImageNet demo: layout, determinism, colour carrying no class information,
atomic writing on first use, and the mmpretrain dataset class."""
from __future__ import annotations

import inspect
from pathlib import Path

import cv2
import numpy as np
import pytest
from helpers.repo import CONFIGS

from soft_mm.datasets.synthetic_classes import (
    CLASS_NAMES,
    draw_class_image,
    ensure_classes_dataset,
    write_classes_dataset,
)


@pytest.fixture(scope='module')
def small_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp('classes') / 'data'
    write_classes_dataset(root, num_train_per_class=30, num_val_per_class=12, image_size=48, seed=5)
    return root


def _read_split(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for label, name in enumerate(CLASS_NAMES):
        for path in sorted((root / split / name).iterdir()):
            images.append(cv2.imread(str(path)))
            labels.append(label)
    return np.stack(images), np.array(labels)


def test_layout(small_dataset):
    assert len(CLASS_NAMES) >= 10 and list(CLASS_NAMES) == sorted(CLASS_NAMES)
    for split, per_class in (('train', 30), ('val', 12)):
        assert sorted(p.name for p in (small_dataset / split).iterdir()) == list(CLASS_NAMES)
        for name in CLASS_NAMES:
            files = sorted((small_dataset / split / name).iterdir())
            assert len(files) == per_class
            assert cv2.imread(str(files[0])).shape == (48, 48, 3)


def test_same_seed_same_images_and_splits_differ(tmp_path, small_dataset):
    write_classes_dataset(tmp_path, num_train_per_class=30, num_val_per_class=12, image_size=48, seed=5)
    for name in ('disk', 'hstripes'):
        a = cv2.imread(str(small_dataset / 'train' / name / '00003.png'))
        assert np.array_equal(a, cv2.imread(str(tmp_path / 'train' / name / '00003.png')))
        assert not np.array_equal(a, cv2.imread(str(small_dataset / 'val' / name / '00003.png')))


def test_colour_does_not_tell_the_class_but_structure_does(small_dataset):
    """A nearest-centroid classifier on the mean colour and colour spread is near chance (0.1), while one on a
    crude structure feature (the shares of pixels on a strong horizontal / vertical edge) is well above it."""
    train_x, train_y = _read_split(small_dataset, 'train')
    val_x, val_y = _read_split(small_dataset, 'val')

    def accuracy(feature) -> float:
        f_train, f_val = feature(train_x), feature(val_x)
        mean, std = f_train.mean(0), f_train.std(0) + 1e-9
        f_train, f_val = (f_train - mean) / std, (f_val - mean) / std
        centroids = np.stack([f_train[train_y == c].mean(0) for c in range(len(CLASS_NAMES))])
        predicted = np.argmin(((f_val[:, None] - centroids[None]) ** 2).sum(-1), axis=1)
        return float((predicted == val_y).mean())

    def colour(x: np.ndarray) -> np.ndarray:
        x = x.reshape(len(x), -1, 3).astype(np.float64)
        return np.concatenate([x.mean(1), x.std(1)], axis=1)

    def edges(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        return np.stack([(np.abs(np.diff(x, axis=2)).sum(-1) > 60).mean((1, 2)),
                         (np.abs(np.diff(x, axis=1)).sum(-1) > 60).mean((1, 2))], axis=1)

    assert accuracy(colour) < 0.2  # measured 0.125
    assert accuracy(edges) > 0.35  # measured 0.525


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match='class_name'):
        draw_class_image(np.random.default_rng(0), 'hexagon')
    with pytest.raises(ValueError, match='image_size'):
        write_classes_dataset(tmp_path, image_size=16)
    with pytest.raises(ValueError, match='num_val_per_class'):
        write_classes_dataset(tmp_path, num_val_per_class=0)


def test_ensure_writes_once(tmp_path, capsys):
    root = tmp_path / 'classes'
    assert ensure_classes_dataset(root, num_train_per_class=1, num_val_per_class=1, image_size=32)
    said = capsys.readouterr().err.splitlines()
    assert said[0] == (f'writing the synthetic classes data set (10 classes of 1 train and 1 val images) to {root} '
                       '(once: later runs read it) ...') and said[1].startswith(f'wrote {root} in ') and len(said) == 2
    assert not ensure_classes_dataset(root, num_train_per_class=5)
    assert capsys.readouterr().err == ''  # kept: nothing to say
    assert len(list((root / 'train' / 'ring').iterdir())) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith('.')]  # no partial folder left behind


def test_demo_config_uses_the_generator_defaults():
    """tools/misc/make_demo_data.py writes the defaults; the demo config must read the same data."""
    from mmengine.config import Config

    cfg = Config.fromfile(str(CONFIGS / 'soft_tiny_in1k_demo.py'))
    defaults = {k: p.default for k, p in inspect.signature(write_classes_dataset).parameters.items() if k != 'root'}
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        assert dict(loader.dataset.generator) == defaults
    assert cfg.model.num_classes == cfg.data_preprocessor.num_classes == len(CLASS_NAMES)


def test_mmpretrain_dataset_generates_and_reads(tmp_path):
    pytest.importorskip('mmpretrain')
    from soft_mm.datasets import SyntheticClassesDataset

    root = tmp_path / 'data'
    generator = {'num_train_per_class': 3, 'num_val_per_class': 2, 'image_size': 32, 'seed': 1}
    dataset = SyntheticClassesDataset(data_root=str(root), split='val', generator=generator)
    assert len(dataset) == 2 * len(CLASS_NAMES)
    assert dataset.metainfo['classes'] == CLASS_NAMES
    for index in range(len(dataset)):
        info = dataset.get_data_info(index)
        assert Path(info['img_path']).parent.name == CLASS_NAMES[info['gt_label']]
    assert len(SyntheticClassesDataset(data_root=str(root), split='train')) == 3 * len(CLASS_NAMES)
    with pytest.raises(ValueError, match='split'):
        SyntheticClassesDataset(data_root=str(root), split='test')
