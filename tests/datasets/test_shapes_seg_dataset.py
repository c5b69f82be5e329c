"""Semantic label maps of the synthetic shapes (exact against the COCO json), their atomic writing, the mmseg class."""
import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from soft_mm.datasets import synthetic_shapes
from soft_mm.datasets.synthetic_shapes import (
    SHAPE_CLASSES,
    SPLITS,
    ensure_semantic_labels,
    write_semantic_labels,
    write_shapes_dataset,
)

SMALL = {'num_train': 12, 'num_val': 5, 'image_size': 96, 'max_objects': 4, 'radius_range': (8, 20), 'seed': 3}
TINY = {'num_train': 3, 'num_val': 4, 'image_size': 64, 'radius_range': (6, 14)}


def _load(root, split):
    return json.loads((root / 'annotations' / f'instances_{split}.json').read_text())


def _read_label_map(path):
    label_map = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert label_map is not None, path
    return label_map


@pytest.fixture(scope='module')
def labelled_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp('shapes_seg') / 'data'
    write_shapes_dataset(root, **SMALL)
    assert ensure_semantic_labels(root)
    return root


@pytest.mark.parametrize('split', SPLITS)
def test_label_maps_match_the_coco_masks(labelled_dataset, split):
    """Each object's polygon raster carries its class; per image, a class's pixel count is the sum of its areas."""
    coco = _load(labelled_dataset, split)
    category_label = {c['id']: SHAPE_CLASSES.index(c['name']) + 1 for c in coco['categories']}
    assert sorted(os.listdir(labelled_dataset / 'semantic' / split)) == sorted(im['file_name'] for im in coco['images'])
    for image in coco['images']:
        label_map = _read_label_map(labelled_dataset / 'semantic' / split / image['file_name'])
        assert label_map.dtype == np.uint8 and label_map.shape == (image['height'], image['width'])
        expected_counts = np.zeros(len(SHAPE_CLASSES) + 1, np.int64)
        for ann in (a for a in coco['annotations'] if a['image_id'] == image['id']):
            label = category_label[ann['category_id']]
            mask = np.zeros_like(label_map)
            cv2.fillPoly(mask, [np.asarray(ann['segmentation'][0], np.int32).reshape(-1, 2)], 1)
            assert (label_map[mask.astype(bool)] == label).all()
            expected_counts[label] += ann['area']
        expected_counts[0] = label_map.size - expected_counts[1:].sum()
        np.testing.assert_array_equal(np.bincount(label_map.ravel(), minlength=len(expected_counts)), expected_counts)


def test_label_maps_cover_the_drawn_shapes(labelled_dataset):
    """Where the label says background, the image is the smooth gradient; each labelled object is one flat colour."""
    coco = _load(labelled_dataset, 'train')
    for image in coco['images'][:4]:
        pixels = cv2.imread(str(labelled_dataset / 'train' / image['file_name'])).astype(int)
        label_map = _read_label_map(labelled_dataset / 'semantic/train' / image['file_name'])
        count, components = cv2.connectedComponents((label_map > 0).astype(np.uint8))
        assert count - 1 == sum(a['image_id'] == image['id'] for a in coco['annotations'])
        for component in range(1, count):
            colours = pixels[components == component]
            assert (colours == colours[0]).all()
            assert len(np.unique(label_map[components == component])) == 1


def test_labels_follow_category_names_not_ids(tmp_path):
    """Label ``i + 1`` is ``SHAPE_CLASSES[i]`` whatever ids the json gives its categories; unknown names fail."""
    square = [10, 10, 30, 10, 30, 30, 10, 30]
    coco = {'images': [{'id': 5, 'file_name': 'a.png', 'height': 40, 'width': 48}],
            'annotations': [{'id': 1, 'image_id': 5, 'category_id': 7, 'segmentation': [square]}],
            'categories': [{'id': 7, 'name': 'square'}, {'id': 1, 'name': 'triangle'}, {'id': 2, 'name': 'circle'}]}
    (tmp_path / 'annotations').mkdir()
    (tmp_path / 'annotations/instances_val.json').write_text(json.dumps(coco))
    assert write_semantic_labels(tmp_path, 'val') == 1
    label_map = _read_label_map(tmp_path / 'semantic/val/a.png')
    expected = np.zeros((40, 48), np.uint8)
    expected[10:31, 10:31] = SHAPE_CLASSES.index('square') + 1  # fillPoly includes both edges
    np.testing.assert_array_equal(label_map, expected)

    coco['categories'][0]['name'] = 'hexagon'
    (tmp_path / 'annotations/instances_val.json').write_text(json.dumps(coco))
    with pytest.raises(ValueError, match="category 'hexagon' of val is not one of"):
        write_semantic_labels(tmp_path, 'val')
    with pytest.raises(ValueError, match='split must be one of'):
        write_semantic_labels(tmp_path, 'test')


def test_existing_dataset_gains_label_maps_without_rewriting_it(tmp_path):
    root = tmp_path / 'shapes'
    write_shapes_dataset(root, **TINY)
    before = {p: p.stat().st_mtime_ns for p in root.rglob('*') if p.is_file()}
    assert ensure_semantic_labels(root, num_train=50) is True  # generator arguments only matter for a missing root
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert sorted(os.listdir(root)) == ['annotations', 'semantic', 'train', 'val']
    assert [len(os.listdir(root / 'semantic' / split)) for split in SPLITS] == [3, 4]
    stamp = (root / 'semantic/val/000001.png').stat().st_mtime_ns
    assert ensure_semantic_labels(root) is False
    assert (root / 'semantic/val/000001.png').stat().st_mtime_ns == stamp


def test_ensure_writes_the_whole_dataset_when_root_is_missing(tmp_path):
    root = tmp_path / 'new' / 'shapes'
    assert ensure_semantic_labels(root, **TINY) is True
    for split, count in zip(SPLITS, (3, 4)):
        assert len(_load(root, split)['images']) == count
        assert sorted(os.listdir(root / 'semantic' / split)) == sorted(os.listdir(root / split))


# The generator module is loaded by its path, so each process starts in well under a second (numpy and OpenCV only,
# not the soft_mm package with mmdet and mmseg). Each process holds twice until the test's go: once with its complete
# copy of the missing dataset, once with its first split of label maps rendered; both are then past the existence
# check of that folder and their renames of the dataset, then of root/semantic, really race.
_ENSURE = """
import importlib.util, sys

spec = importlib.util.spec_from_file_location('shapes', sys.argv[1])
shapes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shapes)

def hold(what):
    print(what, flush=True)
    if sys.stdin.readline() != 'go\\n':
        raise SystemExit('no go from the test')

write_dataset, write_labels = shapes.write_shapes_dataset, shapes.write_semantic_labels

def write_dataset_then_hold(folder, **kwargs):
    write_dataset(folder, **kwargs)
    hold('dataset written')

def write_labels_then_hold(root, split, out_dir=None):
    count = write_labels(root, split, out_dir)
    if split == 'train':
        hold('labels written')
    return count

shapes.write_shapes_dataset, shapes.write_semantic_labels = write_dataset_then_hold, write_labels_then_hold
print(shapes.ensure_semantic_labels(sys.argv[2], num_train=40, num_val=5, image_size=64, radius_range=(6, 14)))
"""


def _wait_for(procs: list[subprocess.Popen], held: str) -> None:
    """Return once every process has said ``held`` (and holds)."""
    assert [proc.stdout.readline() for proc in procs] == [held + '\n'] * len(procs), f'every process: {held}'


def _go(procs: list[subprocess.Popen]) -> None:
    """Let the holding processes go on together."""
    for proc in procs:
        proc.stdin.write('go\n')
        proc.stdin.flush()


def test_ensure_is_atomic_when_processes_race(tmp_path):
    """Two processes (like two distributed ranks) generate data and label maps into the same missing folder."""
    root = tmp_path / 'race' / 'shapes'
    module = synthetic_shapes.__file__
    procs = [subprocess.Popen([sys.executable, '-c', _ENSURE, module, str(root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        _wait_for(procs, 'dataset written')
        assert not root.exists() and len(os.listdir(root.parent)) == 2, 'two finished copies of the dataset'
        _go(procs)
        _wait_for(procs, 'labels written')
        partial = [name for name in os.listdir(root) if name.startswith('.semantic.partial-')]
        assert not (root / 'semantic').exists() and len(partial) == 2, 'two copies of the label maps under way'
        _go(procs)
        written = sorted(proc.communicate(timeout=120)[0].strip() for proc in procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [proc.returncode for proc in procs] == [0, 0]
    assert written == ['False', 'True'], 'exactly one process publishes the label maps'
    assert sorted(os.listdir(root.parent)) == ['shapes']
    assert sorted(os.listdir(root)) == ['annotations', 'semantic', 'train', 'val'], 'the losing copies are removed'
    assert sorted(os.listdir(root / 'semantic')) == list(SPLITS)
    assert len(os.listdir(root / 'semantic/train')) == 40
    assert oct((root / 'semantic').stat().st_mode & 0o777) == oct(0o755)


def _build(**kwargs):
    pytest.importorskip('mmseg')
    from mmseg.registry import DATASETS

    import soft_mm  # noqa: F401  (registers SyntheticShapesSegDataset, built through mmengine's root DATASETS)

    return DATASETS.build(dict(type='SyntheticShapesSegDataset', _scope_='mmseg', **kwargs))


def test_mmseg_dataset_writes_missing_data_and_loads_samples(tmp_path):
    root = tmp_path / 'generated'
    pipeline = [{'type': 'LoadImageFromFile'}, {'type': 'LoadAnnotations'}, {'type': 'PackSegInputs'}]
    dataset = _build(data_root=str(root), data_prefix={'img_path': 'val/', 'seg_map_path': 'semantic/val/'},
                     test_mode=True, pipeline=pipeline, generator=TINY)
    assert len(dataset) == 4 and (root / 'semantic/train/000003.png').is_file()
    assert dataset.metainfo['classes'] == ('background', *SHAPE_CLASSES)
    assert len(dataset.metainfo['palette']) == 4 and dataset.metainfo['reduce_zero_label'] is False
    for index in range(len(dataset)):
        info = dataset.get_data_info(index)
        assert info['img_path'] == str(root / 'val' / f'{index + 1:06d}.png')
        assert info['seg_map_path'] == str(root / 'semantic/val' / f'{index + 1:06d}.png')
        sample = dataset[index]
        assert tuple(sample['inputs'].shape) == (3, 64, 64)
        gt = sample['data_samples'].gt_sem_seg.data
        assert tuple(gt.shape) == (1, 64, 64)
        np.testing.assert_array_equal(gt[0].numpy(), _read_label_map(info['seg_map_path']))
        assert 0 in gt and set(gt.unique().tolist()) <= {0, 1, 2, 3}, 'background stays 0 (no zero-label reduction)'


def test_mmseg_dataset_needs_data_root():
    with pytest.raises(ValueError, match='SyntheticShapesSegDataset needs data_root'):
        _build(data_prefix={'img_path': 'val/', 'seg_map_path': 'semantic/val/'}, pipeline=[])
