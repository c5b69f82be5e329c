"""The README's drop-in snippet turns mmseg's own installed Swin-T UperNet ADE20K config into a trainable SOFT model."""
from pathlib import Path

import pytest

mmseg = pytest.importorskip('mmseg')
from helpers.model_checks import train_two_steps_reaching_the_backbone, without_scope
from helpers.repo import ROOT
from mmengine.config import Config
from mmengine.runner import Runner

DROP_IN = ROOT / 'configs/drop_in/upernet_swin-t_soft_small_ade20k.py'
MMSEG_SWIN = (Path(mmseg.__file__).parent
              / '.mim/configs/swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py')




def test_snippet_changes_only_the_backbone_and_head_inputs():
    original = without_scope(Config.fromfile(str(MMSEG_SWIN)).to_dict())
    swapped = without_scope(Config.fromfile(str(DROP_IN)).to_dict())
    assert original['model']['backbone']['type'] == 'SwinTransformer'
    assert swapped['model']['backbone'] == {
        'type': 'SOFT', 'arch': 'small', 'soft_norm': True,
        'init_cfg': {'type': 'Pretrained', 'checkpoint': 'checkpoints/soft_norm_small_in1k.pth'}}
    assert swapped['model']['decode_head']['in_channels'] == [64, 128, 320, 512]
    assert swapped['model']['auxiliary_head']['in_channels'] == 320
    for key in ('train_dataloader', 'val_evaluator', 'optim_wrapper', 'param_scheduler', 'train_cfg'):
        assert swapped[key] == original[key], key
    for model in (swapped['model'], original['model']):
        model.pop('backbone'), model['decode_head'].pop('in_channels'), model['auxiliary_head'].pop('in_channels')
    assert swapped['model'] == original['model']


@pytest.mark.slow  # about 3 minutes on 2 busy cores (SOFT-Small + a 512-channel UPerHead)
def test_snippet_model_trains_on_demo_data(tmp_path, monkeypatch):
    """Two steps (batch 2, 96-px crops) on 4 demo images with 4 classes: finite losses, and a finite non-zero
    gradient on every backbone parameter in each step."""
    monkeypatch.chdir(tmp_path)
    cfg = Config.fromfile(str(DROP_IN))
    demo_data = Config.fromfile(str(ROOT / 'configs/_base_/datasets/demo_shapes_semantic.py'))
    dataset = demo_data.train_dataloader.dataset
    dataset.generator.update(num_train=4, num_val=1)
    crop = (96, 96)
    cfg.merge_from_dict({
        # no stochastic depth: a batch of 2 drops a block's branch for both images one time in 100 (at rate 0.1)
        'model': {'backbone': {'init_cfg': None, 'drop_path_rate': 0.0}, 'data_preprocessor': {'size': crop},
                   'decode_head': {'num_classes': 4}, 'auxiliary_head': {'num_classes': 4}},
        'train_dataloader': {'batch_size': 2, 'num_workers': 0, 'persistent_workers': False, 'dataset': dataset},
        'train_cfg': {'max_iters': 2, 'val_interval': 100},
        'val_cfg': None, 'val_dataloader': None, 'val_evaluator': None,
        'test_cfg': None, 'test_dataloader': None, 'test_evaluator': None,
        'work_dir': str(tmp_path / 'work'), 'default_hooks': {'logger': {'interval': 1},
                                                           'checkpoint': {'interval': 100}}})
    cfg.model.data_preprocessor.size = crop
    cfg.data_preprocessor = cfg.model.data_preprocessor
    import soft_mm.datasets  # noqa: F401
    runner = Runner.from_cfg(cfg)
    train_two_steps_reaching_the_backbone(runner, 'segmentation losses')
