"""The synthetic shapes generator: exact boxes and masks, determinism, atomic concurrent writing, the mmdet class."""
import json
import os
import re
import subprocess
import sys

import cv2
import numpy as np
import pytest

from soft_mm.datasets.synthetic_shapes import (
    SHAPE_CLASSES,
    draw_image,
    ensure_semantic_labels,
    ensure_shapes_dataset,
    shape_polygon,
    write_shapes_dataset,
)


def _load(root, split):
    return json.loads((root / 'annotations' / f'instances_{split}.json').read_text())


@pytest.fixture(scope='module')
def small_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp('shapes') / 'data'
    write_shapes_dataset(root, num_train=12, num_val=5, image_size=96, max_objects=4, radius_range=(8, 20), seed=3)
    return root


def test_layout_and_categories(small_dataset):
    for split, count in (('train', 12), ('val', 5)):
        coco = _load(small_dataset, split)
        assert [c['name'] for c in coco['categories']] == list(SHAPE_CLASSES)
        assert len(coco['images']) == count
        assert sorted(os.listdir(small_dataset / split)) == sorted(im['file_name'] for im in coco['images'])
        assert len({a['id'] for a in coco['annotations']}) == len(coco['annotations'])
        per_image = np.bincount([a['image_id'] for a in coco['annotations']], minlength=count + 1)[1:]
        assert per_image.min() >= 1 and per_image.max() <= 4


def test_boxes_and_areas_match_the_drawn_masks(small_dataset):
    """Each box is the tight box of the polygon's raster and the area its pixel count; the pixels carry the colour."""
    coco = _load(small_dataset, 'train')
    image_info = {im['id']: im for im in coco['images']}
    for ann in coco['annotations']:
        info = image_info[ann['image_id']]
        mask = np.zeros((info['height'], info['width']), np.uint8)
        polygon = np.asarray(ann['segmentation'][0]).reshape(-1, 2)
        cv2.fillPoly(mask, [polygon.astype(np.int32)], 1)
        ys, xs = np.nonzero(mask)
        x, y, w, h = ann['bbox']
        assert (x, y, x + w, y + h) == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
        assert ann['area'] == len(xs)
        image = cv2.imread(str(small_dataset / 'train' / info['file_name']))
        colours = image[mask.astype(bool)]
        assert (colours == colours[0]).all(), 'a shape is one flat colour'


def test_objects_do_not_overlap():
    rng = np.random.default_rng(0)
    for _ in range(20):
        _, objects = draw_image(rng, 128, 6, (10.0, 30.0))
        boxes = [o['bbox'] for o in objects]
        for i, (x0, y0, w0, h0) in enumerate(boxes):
            for x1, y1, w1, h1 in boxes[i + 1:]:
                assert x0 + w0 <= x1 or x1 + w1 <= x0 or y0 + h0 <= y1 or y1 + h1 <= y0


def test_same_seed_same_files_other_seed_other_files(tmp_path):
    kwargs = dict(num_train=3, num_val=2, image_size=64, radius_range=(6, 14))
    write_shapes_dataset(tmp_path / 'a', seed=5, **kwargs)
    write_shapes_dataset(tmp_path / 'b', seed=5, **kwargs)
    write_shapes_dataset(tmp_path / 'c', seed=6, **kwargs)
    for split in ('train', 'val'):
        assert _load(tmp_path / 'a', split)['annotations'] == _load(tmp_path / 'b', split)['annotations']
        assert _load(tmp_path / 'a', split)['annotations'] != _load(tmp_path / 'c', split)['annotations']
    assert (tmp_path / 'a/train/000001.png').read_bytes() == (tmp_path / 'b/train/000001.png').read_bytes()
    assert _load(tmp_path / 'a', 'train')['annotations'] != _load(tmp_path / 'a', 'val')['annotations']


def test_polygons_and_bad_arguments():
    square = shape_polygon('square', (10.0, 10.0), 5.0, 0.0)
    np.testing.assert_allclose(square, [[15, 10], [10, 15], [5, 10], [10, 5]], atol=1e-12)
    assert shape_polygon('circle', (0.0, 0.0), 2.0, 0.3).shape == (48, 2)
    with pytest.raises(ValueError, match='kind must be one of'):
        shape_polygon('hexagon', (0.0, 0.0), 1.0, 0.0)
    with pytest.raises(ValueError, match='too small'):
        write_shapes_dataset('/nonexistent', image_size=32, radius_range=(5, 30))


# Each process writes its complete copy, says so and waits for the test's go before renaming it: both are then past
# the existence check with a finished copy, so their renames really race (the imports alone take seconds, the write
# milliseconds: without the hold the second process would only find the first one's dataset).
_ENSURE = """
import sys
import soft_mm.datasets.synthetic_shapes as shapes

write = shapes.write_shapes_dataset

def write_then_hold(folder, **kwargs):
    write(folder, **kwargs)
    print('written', flush=True)
    if sys.stdin.readline() != 'go\\n':
        raise SystemExit('no go from the test')

shapes.write_shapes_dataset = write_then_hold
print(shapes.ensure_shapes_dataset(sys.argv[1], num_train=40, num_val=5, image_size=96, radius_range=(8, 20)))
"""


def test_ensure_is_atomic_when_processes_race(tmp_path):
    """Two processes (like two distributed ranks) generate into the same missing folder at the same time."""
    root = tmp_path / 'race' / 'shapes'
    procs = [subprocess.Popen([sys.executable, '-c', _ENSURE, str(root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        assert [proc.stdout.readline() for proc in procs] == ['written\n'] * 2, 'both write a copy'
        assert not root.exists() and len(os.listdir(root.parent)) == 2, 'two finished copies, none published yet'
        for proc in procs:
            proc.stdin.write('go\n')
            proc.stdin.flush()
        written = sorted(proc.communicate(timeout=120)[0].strip() for proc in procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [proc.returncode for proc in procs] == [0, 0]
    assert written == ['False', 'True'], 'exactly one process publishes the dataset'
    assert sorted(os.listdir(root.parent)) == ['shapes'], 'the losing copy is removed'
    assert len(_load(root, 'train')['images']) == 40 and len(os.listdir(root / 'train')) == 40
    assert oct(root.stat().st_mode & 0o777) == oct(0o755)
    assert not ensure_shapes_dataset(root), 'an existing dataset is kept'


def test_writing_the_data_says_what_and_where_once(tmp_path, capsys):
    """The demo's first run writes its data set for seconds: a line before, one after; nothing when it exists."""
    root = tmp_path / 'shapes'
    assert ensure_semantic_labels(root, num_train=3, num_val=2, image_size=96, radius_range=(8, 20))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (f'writing the synthetic shapes data set (3 train and 2 val images) to {root} (once: later runs '
                        'read it) ...')
    assert lines[2] == f'writing the label maps of the segmentation demo to {root / "semantic"} (once: later runs ' \
                       'read it) ...'
    assert re.fullmatch(rf'wrote {re.escape(str(root))} in \d+\.\d s', lines[1]) and len(lines) == 4
    assert lines[3].startswith(f'wrote {root / "semantic"} in ')
    assert not ensure_semantic_labels(root) and capsys.readouterr() == ('', '')
    ensure_shapes_dataset(tmp_path / 'defaults_counted', num_val=1, image_size=96, radius_range=(8, 20), num_train=1)
    assert '(1 train and 1 val images)' in capsys.readouterr().err


def test_mmdet_dataset_writes_missing_data(tmp_path):
    pytest.importorskip('mmdet')
    from mmdet.registry import DATASETS

    import soft_mm  # noqa: F401  (registers SyntheticShapesDataset, built through mmengine's root DATASETS)

    root = tmp_path / 'generated'
    dataset = DATASETS.build(dict(
        type='SyntheticShapesDataset', data_root=str(root), ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'), test_mode=True, pipeline=[],
        generator=dict(num_train=2, num_val=6, image_size=64, radius_range=(6, 14))))
    assert len(dataset) == 6 and (root / 'annotations/instances_train.json').is_file()
    assert dataset.metainfo['classes'] == SHAPE_CLASSES
    first = dataset[0]
    assert first['img_path'].startswith(str(root / 'val')) and len(first['instances']) >= 1
    assert {'bbox', 'bbox_label', 'mask'} <= set(first['instances'][0])
