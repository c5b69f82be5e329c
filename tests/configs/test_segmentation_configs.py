"""The UperNet ADE20K configs build the published models through mmseg's registry."""

import pytest
import torch

pytest.importorskip('mmseg')
from helpers.model_checks import published_params_m
from helpers.repo import CONFIGS
from mmengine.config import Config
from mmseg.registry import MODELS
from mmseg.utils import register_all_modules

# published UperNet parameter counts (SOFT-Norm backbones, with the auxiliary FCN head as in mmseg's counts), as the
# metafile states them
PUBLISHED_M = {size: published_params_m(f'upernet_soft_{size}_ade20k') for size in ('small', 'medium')}


def build(size: str) -> torch.nn.Module:
    register_all_modules()
    cfg = Config.fromfile(str(CONFIGS / f'upernet_soft_{size}_ade20k.py'))
    assert cfg.model.backbone.type == 'SOFT' and cfg.model.backbone.soft_norm is True
    assert cfg.model.backbone.init_cfg.checkpoint == f'checkpoints/soft_norm_{size}_in1k.pth'
    assert cfg.train_dataloader.dataset.data_root == 'data/ade/ADEChallengeData2016'
    assert cfg.optim_wrapper.optimizer.lr == 6e-5 and cfg.optim_wrapper.optimizer.weight_decay == 0.01
    assert cfg.train_cfg.max_iters == 160000
    cfg.model.backbone.init_cfg = None
    with torch.device('meta'):
        return MODELS.build(cfg.model)


@pytest.mark.parametrize('size', sorted(PUBLISHED_M))
def test_upernet_params_match_published(size):
    model = build(size)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    assert abs(params - PUBLISHED_M[size]) / PUBLISHED_M[size] < 0.03, params


def test_upernet_small_forward_on_odd_size():
    register_all_modules()
    cfg = Config.fromfile(str(CONFIGS / 'upernet_soft_small_ade20k.py'))
    cfg.model.backbone.init_cfg = None
    cfg.model.backbone.arch = dict(embed_dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4], depths=[1, 1, 1, 1])
    cfg.model.decode_head.update(in_channels=[32, 64, 96, 128], channels=32)
    cfg.model.auxiliary_head.update(in_channels=96, channels=16)
    cfg.model.decode_head.norm_cfg = cfg.model.auxiliary_head.norm_cfg = dict(type='BN', requires_grad=True)
    model = MODELS.build(cfg.model).eval()
    with torch.no_grad():
        logits = model(torch.randn(1, 3, 97, 131), mode='tensor')
    assert logits.shape == (1, 150, 25, 33)  # stride-4 logits of a 97 x 131 input (ceil at each stride-2 conv)
    assert torch.isfinite(logits).all()
