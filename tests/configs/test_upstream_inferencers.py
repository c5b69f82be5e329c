"""The upstream inferencers run SOFT models from soft_mm's demo configs: mmdet's ``DetInferencer`` and mmseg's
``MMSegInferencer`` build the model through ``custom_imports``, load a checkpoint in mmengine's format and write
pictures."""
from __future__ import annotations

from pathlib import Path

import mmcv
import numpy as np
import pytest
import torch
from helpers.repo import ROOT
from mmengine.config import Config
from mmengine.registry import init_default_scope

SEG_CONFIG = ROOT / 'configs/upernet_soft_tiny_demo.py'
DET_CONFIG = ROOT / 'configs/retinanet_soft_tiny_demo.py'
OPACITY = 0.8  # MMSegInferencer's default overlay opacity


def _save_random_checkpoint(config: Path, scope: str, dataset_meta: dict, path: Path) -> Path:
    """A randomly initialised model of ``config`` saved as mmengine's runner saves one (``meta.dataset_meta``)."""
    cfg = Config.fromfile(str(config))
    init_default_scope(scope)
    from mmengine.registry import MODELS

    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    torch.save({'meta': {'dataset_meta': dataset_meta}, 'state_dict': model.state_dict()}, path)
    return path


@pytest.fixture(scope='module')
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from soft_mm.datasets.synthetic_shapes import write_shapes_dataset

    root = tmp_path_factory.mktemp('shapes')
    write_shapes_dataset(root, num_train=1, num_val=2)
    return root


def test_mmseg_inferencer_overlays_the_prediction(shapes: Path, tmp_path: Path) -> None:
    pytest.importorskip('mmseg')
    from mmseg.apis import MMSegInferencer

    from soft_mm.datasets.shapes_seg_dataset import SyntheticShapesSegDataset

    meta = SyntheticShapesSegDataset.METAINFO
    weights = _save_random_checkpoint(SEG_CONFIG, 'mmseg', meta, tmp_path / 'seg.pth')
    image_path = min((shapes / 'val').glob('*.png'))
    inferencer = MMSegInferencer(model=str(SEG_CONFIG), weights=str(weights), device='cpu')
    assert type(inferencer.model.backbone).__name__ == 'SOFT'
    # An untrained model may give one class everywhere. Its classifier's bias shifted by minus each class's mean logit
    # on this image (the bias adds a constant to a class's logits) leaves every class the argmax somewhere.
    logits = inferencer(str(image_path), return_datasamples=True).seg_logits.data
    with torch.no_grad():
        inferencer.model.decode_head.conv_seg.bias -= logits.mean((1, 2))
    result = inferencer(str(image_path), out_dir=str(tmp_path / 'out'), return_datasamples=True, with_labels=False)
    prediction = result.pred_sem_seg.data[0].numpy()
    shares = np.bincount(prediction.ravel(), minlength=4) / prediction.size
    assert shares.min() > 0.02, f'every class predicted on some pixels: {shares}'
    picture_path = tmp_path / 'out/vis' / image_path.name
    image = mmcv.imread(str(image_path), channel_order='rgb').astype(np.float64)
    picture = mmcv.imread(str(picture_path), channel_order='rgb').astype(np.float64)
    assert picture.shape == image.shape and prediction.shape == image.shape[:2]
    # every pixel is mmseg's blend of the input with the palette colour of its predicted class, truncated to uint8
    # (measured: exactly, at every pixel; 1 allows the other rounding of the float product)
    palette = np.array(meta['palette'], dtype=np.float64)
    expected = np.floor((1 - OPACITY) * image + OPACITY * palette[prediction])
    assert np.abs(picture - expected).max() <= 1
    # so the picture shows each class at exactly its predicted pixels, in its predicted share of the picture (a class's
    # blend is >= 135 away from any other's: the palette colours differ by >= 170 in some channel); the shape classes'
    # colours stand out from the input (measured: by >= 52 at every such pixel)
    blends = np.floor((1 - OPACITY) * image[None] + OPACITY * palette[:, None, None])  # (class, H, W, 3)
    shown = np.abs(picture[None] - blends).max(-1).argmin(0)
    assert np.array_equal(shown, prediction)
    assert np.array_equal(np.bincount(shown.ravel(), minlength=4) / shown.size, shares)  # 0.32, 0.36, 0.27, 0.05
    assert (np.abs(picture - image)[prediction > 0].max(-1) > 10).mean() > 0.99


def test_det_inferencer_draws_detections(shapes: Path, tmp_path: Path) -> None:
    pytest.importorskip('mmdet')
    from mmdet.apis import DetInferencer

    from soft_mm.datasets.shapes_dataset import SyntheticShapesDataset

    meta = SyntheticShapesDataset.METAINFO
    weights = _save_random_checkpoint(DET_CONFIG, 'mmdet', meta, tmp_path / 'det.pth')
    image_path = min((shapes / 'val').glob('*.png'))
    # an untrained model scores every box near the focal-loss prior (0.01): keep and draw all of them
    cfg = Config.fromfile(str(DET_CONFIG))
    cfg.model.test_cfg.score_thr = 0.0
    inferencer = DetInferencer(model=cfg, weights=str(weights), device='cpu')
    assert type(inferencer.model.backbone).__name__ == 'SOFT'
    result = inferencer(str(image_path), out_dir=str(tmp_path / 'out'), pred_score_thr=0.0, no_save_pred=False)
    prediction = result['predictions'][0]
    assert len(prediction['bboxes']) > 0 and set(prediction['labels']) <= {0, 1, 2}
    picture = mmcv.imread(str(tmp_path / 'out/vis' / image_path.name), channel_order='rgb').astype(np.int64)
    image = mmcv.imread(str(image_path), channel_order='rgb').astype(np.int64)
    assert picture.shape == image.shape
    # the best box is drawn: its outline differs from the input
    best = int(np.argmax(prediction['scores']))
    x1, y1, x2, y2 = (round(float(v)) for v in np.clip(prediction['bboxes'][best], 0, image.shape[1] - 1))
    outline = np.concatenate([picture[y1, x1:x2 + 1] - image[y1, x1:x2 + 1],
                              picture[y1:y2 + 1, x1] - image[y1:y2 + 1, x1]])
    assert (np.abs(outline).max(-1) > 0).mean() > 0.5
    assert (tmp_path / 'out/preds' / f'{image_path.stem}.json').is_file()


def test_det_inferencer_draws_masks(shapes: Path, tmp_path: Path) -> None:
    pytest.importorskip('mmdet')
    from mmdet.apis import DetInferencer
    from pycocotools import mask as mask_utils

    from soft_mm.datasets.shapes_dataset import SyntheticShapesDataset

    config = ROOT / 'configs/mask_rcnn_soft_tiny_demo.py'
    weights = _save_random_checkpoint(config, 'mmdet', SyntheticShapesDataset.METAINFO, tmp_path / 'mask.pth')
    image_path = min((shapes / 'val').glob('*.png'))
    cfg = Config.fromfile(str(config))
    cfg.model.test_cfg.rcnn.score_thr = 0.0  # an untrained model: keep and draw every box and its mask
    inferencer = DetInferencer(model=cfg, weights=str(weights), device='cpu')
    result = inferencer(str(image_path), out_dir=str(tmp_path / 'out'), pred_score_thr=0.0, no_save_pred=False)
    prediction = result['predictions'][0]
    assert len(prediction['masks']) == len(prediction['bboxes']) > 0
    masks = np.stack([mask_utils.decode(rle) for rle in prediction['masks']]).astype(bool)
    picture = mmcv.imread(str(tmp_path / 'out/vis' / image_path.name), channel_order='rgb').astype(np.int64)
    image = mmcv.imread(str(image_path), channel_order='rgb').astype(np.int64)
    assert masks.shape[1:] == image.shape[:2] == picture.shape[:2]
    # mmdet's visualizer blends every mask into the picture: it differs from the input where the masks are
    covered = masks.any(0)
    assert covered.any()
    assert (np.abs(picture - image)[covered].max(-1) > 0).mean() > 0.9
