"""SoftTimmClassifier: mmpretrain's TimmClassifier with the timm model's keys at any depth (EMA's averaged copy)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip('mmpretrain')
from mmengine.model import ExponentialMovingAverage
from mmpretrain.models import TimmClassifier

from soft_mm.models import SoftVisionTransformer
from soft_mm.models.mmpretrain_classifier import SoftTimmClassifier

KWARGS = {'model_name': 'soft_norm_tiny', 'num_classes': 7, 'landmark_mode': 'avg', 'drop_path_rate': 0.0}


def test_keys_are_the_timm_models_alone_and_nested():
    torch.manual_seed(0)
    classifier = SoftTimmClassifier(**KWARGS)
    timm_keys = list(SoftVisionTransformer('tiny', soft_norm=True, num_classes=7, landmark_mode='avg').state_dict())
    assert list(classifier.state_dict()) == timm_keys
    ema = ExponentialMovingAverage(classifier, momentum=0.01)
    nested = ema.state_dict()
    assert sorted(nested) == sorted(['steps', *(f'module.{k}' for k in timm_keys)])
    assert torch.equal(nested['module.head.weight'], classifier.state_dict()['head.weight'])
    # mmpretrain's own class keeps its attribute prefix when nested: why the subclass exists
    assert 'module.model.head.weight' in ExponentialMovingAverage(TimmClassifier(**KWARGS)).state_dict()


def test_round_trip_through_the_timm_keys():
    torch.manual_seed(0)
    source, target = SoftTimmClassifier(**KWARGS), SoftTimmClassifier(**KWARGS)
    target.load_state_dict(source.state_dict(), strict=True)
    x = torch.randn(2, 3, 40, 56)
    source.eval(), target.eval()
    assert torch.equal(source(x), target(x))
    ema = ExponentialMovingAverage(SoftTimmClassifier(**KWARGS), momentum=0.01)
    ema.load_state_dict({'steps': torch.tensor(3), **{f'module.{k}': v for k, v in source.state_dict().items()}})
    ema.module.eval()
    # both in inference (no grad): the same kernels (the MLPs' fused linear + GELU runs when no gradient is needed,
    # and the EMA copy's parameters need none), so equal weights give equal outputs bit for bit
    with torch.no_grad():
        assert torch.equal(ema.module(x), source(x))
