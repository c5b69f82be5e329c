"""The COCO detection configs: published recipe, inheritance from mmdet's own bases, full-model parameter counts."""

import pytest

pytest.importorskip('mmdet')
from helpers.model_checks import out_channels, published_params_m
from helpers.repo import CONFIGS
from mmdet.registry import MODELS
from mmengine.config import Config
from mmengine.registry import init_default_scope

# published parameters (millions) of the full COCO models (80 classes), as the metafiles state them
PUBLISHED_PARAMS_M = {method: {arch: published_params_m(f'{method}_soft_{arch}_coco')
                               for arch in ('tiny', 'small', 'medium', 'large')}
                      for method in ('retinanet', 'mask_rcnn')}
CASES = [(method, arch) for method, sizes in PUBLISHED_PARAMS_M.items() for arch in sizes]


def _config(method: str, arch: str) -> Config:
    return Config.fromfile(str(CONFIGS / f'{method}_soft_{arch}_coco.py'))


@pytest.mark.parametrize('method,arch', CASES)
def test_published_recipe(method, arch):
    cfg = _config(method, arch)
    assert cfg.custom_imports.imports[0] == 'soft_mm'
    backbone = cfg.model.backbone
    assert (backbone.type, backbone.arch, backbone.soft_norm) == ('SOFT', arch, True)
    assert backbone.init_cfg == dict(type='Pretrained', checkpoint=f'checkpoints/soft_norm_{arch}_in1k.pth')
    assert cfg.model.neck.in_channels == out_channels(arch)  # the arch zoo's
    assert dict(cfg.optim_wrapper.optimizer) == dict(type='AdamW', lr=1e-4, weight_decay=1e-4)
    assert cfg.train_cfg.max_epochs == 12
    assert [s.milestones for s in cfg.param_scheduler if s.type == 'MultiStepLR'] == [[8, 11]]
    resize = [t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'Resize']
    assert [r.scale for r in resize] == [(1333, 800)]
    dataset = cfg.train_dataloader.dataset
    assert (dataset.data_root, dataset.ann_file) == ('data/coco/', 'annotations/instances_train2017.json')
    assert cfg.val_evaluator.ann_file == 'data/coco/annotations/instances_val2017.json'
    expected_metric = 'bbox' if method == 'retinanet' else ['bbox', 'segm']
    assert cfg.val_evaluator.metric == expected_metric


@pytest.mark.parametrize('method', PUBLISHED_PARAMS_M)
def test_configs_inherit_mmdet_bases(method):
    """The tiny config names mmdet's own bases (no copies); the other sizes are deltas on it."""
    text = (CONFIGS / f'{method}_soft_tiny_coco.py').read_text()
    dataset = 'coco_detection' if method == 'retinanet' else 'coco_instance'
    for base in (f'{dataset}.py', 'schedule_1x.py', 'default_runtime.py'):
        assert "'mmdet::_base_/" in text and base in text
    for arch in ('small', 'medium', 'large'):
        assert f"_base_ = './{method}_soft_tiny_coco.py'" in (CONFIGS / f'{method}_soft_{arch}_coco.py').read_text()


@pytest.mark.parametrize('method,arch', CASES)
def test_full_model_parameters_match_published(method, arch):
    cfg = _config(method, arch)
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)
    assert model.backbone.out_channels == cfg.model.neck.in_channels
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    published = PUBLISHED_PARAMS_M[method][arch]
    print(f'{method}_soft_{arch}_coco: {params_m:.2f}M parameters (published {published}M)')
    assert abs(params_m - published) <= 0.03 * published, f'{params_m:.2f}M vs published {published}M'
