"""The README's drop-in snippet turns mmdet's own installed PVT-Tiny RetinaNet config into a trainable SOFT model."""
from pathlib import Path

import pytest

mmdet = pytest.importorskip('mmdet')
from helpers.model_checks import train_two_steps_reaching_the_backbone, without_scope
from helpers.repo import ROOT
from mmengine.config import Config
from mmengine.runner import Runner

DROP_IN = ROOT / 'configs/drop_in/retinanet_pvt-t_soft_small_coco.py'
MMDET_PVT = Path(mmdet.__file__).parent / '.mim/configs/pvt/retinanet_pvt-t_fpn_1x_coco.py'




def test_snippet_changes_only_the_backbone_and_neck_inputs():
    original = without_scope(Config.fromfile(str(MMDET_PVT)).to_dict())
    swapped = without_scope(Config.fromfile(str(DROP_IN)).to_dict())
    assert original['model']['backbone']['type'] == 'PyramidVisionTransformer'
    assert swapped['model']['backbone'] == dict(
        type='SOFT', arch='small', soft_norm=True,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/soft_norm_small_in1k.pth'))
    assert swapped['model']['neck']['in_channels'] == [64, 128, 320, 512]
    for key in ('train_dataloader', 'val_evaluator', 'optim_wrapper', 'param_scheduler', 'train_cfg'):
        assert swapped[key] == original[key], key
    for model in (swapped['model'], original['model']):
        model.pop('backbone'), model['neck'].pop('in_channels')
    assert swapped['model'] == original['model']


def test_snippet_model_trains_on_demo_data(tmp_path, monkeypatch):
    """One epoch of 2 steps (4 demo images, batch 2) with the swapped config: finite losses, and a finite non-zero
    gradient on every backbone parameter in each step."""
    from soft_mm.datasets.synthetic_shapes import write_shapes_dataset

    monkeypatch.chdir(tmp_path)
    write_shapes_dataset(tmp_path / 'data/shapes', num_train=4, num_val=1)
    cfg = Config.fromfile(str(DROP_IN))
    demo_data = Config.fromfile(str(ROOT / 'configs/_base_/datasets/demo_shapes_detection.py'))
    cfg.merge_from_dict(dict(
        custom_imports=dict(imports=[*cfg.custom_imports.imports, 'soft_mm.datasets']),
        # no stochastic depth: a batch of 2 drops a block's branch for both images one time in 100 (at rate 0.1)
        model=dict(backbone=dict(init_cfg=None, drop_path_rate=0.0), bbox_head=dict(num_classes=3)),
        train_dataloader=dict(batch_size=2, num_workers=0, persistent_workers=False,
                              dataset=demo_data.train_dataloader.dataset),
        train_cfg=dict(max_epochs=1), val_cfg=None, val_dataloader=None, val_evaluator=None,
        work_dir=str(tmp_path / 'work'), default_hooks=dict(logger=dict(interval=1))))
    import soft_mm.datasets  # noqa: F401
    runner = Runner.from_cfg(cfg)
    train_two_steps_reaching_the_backbone(runner, 'detection loss')
