"""Tests of SoftVisionTransformer and its timm entrypoints: shapes, heads, the feature API, and the shared state-dict
layout with the SOFT backbone."""
from __future__ import annotations

import pytest
import timm
import torch

import soft_mm  # noqa: F401  (registers the timm entrypoints)
from soft_mm.models import ARCH_SETTINGS, SOFT, SoftVisionTransformer

VARIANTS = [f'soft_{norm}{arch}' for norm in ('', 'norm_') for arch in ('tiny', 'small', 'medium', 'large', 'huge')]
NARROW_ARCH = {'embed_dims': (16, 32, 48, 64), 'num_heads': (1, 2, 2, 2), 'depths': (1, 2, 2, 2)}


def make(**kwargs) -> SoftVisionTransformer:
    torch.manual_seed(0)
    return SoftVisionTransformer(**{'arch': NARROW_ARCH, 'num_classes': 7, **kwargs})


def test_all_ten_entrypoints_are_registered():
    names = timm.list_models('soft_*')
    assert set(VARIANTS) <= set(names)
    assert len(VARIANTS) == 10
    for name in VARIANTS:
        assert timm.is_model(name)
        cfg = timm.models.get_pretrained_cfg(name)
        assert cfg.num_classes == 1000 and cfg.input_size == (3, 224, 224) and cfg.classifier == 'head'


def test_create_model_soft_small_with_num_classes():
    model = timm.create_model('soft_small', num_classes=10).eval()
    assert isinstance(model, SoftVisionTransformer)
    assert model.arch_settings['depths'] == ARCH_SETTINGS['small']['depths'] == (1, 3, 7, 4)
    assert not model.soft_norm and model.head.out_features == 10
    with torch.no_grad():
        logits = model(torch.randn(2, 3, 64, 64))
    assert logits.shape == (2, 10) and logits.isfinite().all()
    # the pretrained config's first conv and classifier name real weights (timm adapts them when loading)
    state_dict = model.state_dict()
    assert model.pretrained_cfg['first_conv'] + '.weight' in state_dict
    assert state_dict[model.pretrained_cfg['first_conv'] + '.weight'].shape[1] == 3
    assert model.pretrained_cfg['classifier'] + '.weight' in state_dict


def test_norm_entrypoints_build_soft_norm_attention():
    # avg landmarks: at init the LN+GELU conv landmarks are far from the small queries and from each other, so
    # A ~ I and D ~ I and SOFT-Norm is nearly a no-op there (a difference of ~1e-5); pooled queries make A non-trivial.
    torch.manual_seed(0)
    plain = timm.create_model('soft_tiny', num_classes=3, landmark_mode='avg').eval()
    torch.manual_seed(0)
    norm = timm.create_model('soft_norm_tiny', num_classes=3, landmark_mode='avg').eval()
    assert norm.soft_norm and not plain.soft_norm
    assert all(m.soft_norm for m in norm.modules() if hasattr(m, 'newton_iters'))
    norm.load_state_dict(plain.state_dict())  # same layout
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert (plain(x) - norm(x)).abs().max() > 1e-2  # observed 0.36


def test_entrypoint_kwargs_reach_the_model():
    model = timm.create_model('soft_tiny', num_classes=0, landmark_mode='avg', landmark_grid=5, newton_iters=9,
                              drop_path_rate=0.0, in_chans=1)
    attn = model.stages[0].blocks[0].attn
    assert (attn.landmark_mode, attn.landmark_grid, attn.newton_iters) == ('avg', 5, 9)
    assert model.stages[0].downsample[0].conv.in_channels == 1
    with torch.no_grad():
        assert model.eval()(torch.randn(1, 1, 32, 32)).shape == (1, 512)


def test_forward_features_and_head_shapes():
    model = make().eval()
    x = torch.randn(2, 3, 96, 64)
    with torch.no_grad():
        features = model.forward_features(x)
        pre_logits = model.forward_head(features, pre_logits=True)
        logits = model.forward_head(features)
        full = model(x)
    assert features.shape == (2, 1 + 3 * 2, 64)  # cls token + the stride-32 map
    assert pre_logits.shape == (2, 64)
    torch.testing.assert_close(pre_logits, features[:, 0], rtol=0, atol=0)  # 'token' pooling: the cls token
    torch.testing.assert_close(logits, model.head(features[:, 0]), rtol=0, atol=0)
    torch.testing.assert_close(full, logits, rtol=0, atol=0)


def test_global_pool_avg_and_reset_classifier():
    model = make().eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        features = model.forward_features(x)
        model.reset_classifier(5, global_pool='avg')
        assert model.head.out_features == 5 and model.num_classes == 5
        torch.testing.assert_close(model.forward_head(features, pre_logits=True), features[:, 1:].mean(1))
        assert model(x).shape == (2, 5)
        model.reset_classifier(0)
        assert model(x).shape == (2, 64) and model.global_pool == 'avg'
    with pytest.raises(ValueError, match='global_pool'):
        model.reset_classifier(3, global_pool='max')
    with pytest.raises(ValueError, match='global_pool'):
        make(global_pool='max')
    assert isinstance(model.get_classifier(), torch.nn.Identity)


def test_drop_rate_is_dropout_before_the_head():
    model = make(drop_rate=0.5, drop_path_rate=0.0).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(x), rtol=0, atol=0)
        model.head_drop.train()
        pre_logits = model.forward_head(model.forward_features(x), pre_logits=True)
    zeroed = (pre_logits == 0).float().mean().item()
    assert 0.3 < zeroed < 0.7  # about half of the 2 x 64 features dropped


def test_features_only_with_out_indices():
    torch.manual_seed(0)
    model = timm.create_model('soft_tiny', features_only=True, out_indices=(1, 2)).eval()
    assert model.feature_info.channels() == [128, 320]
    assert model.feature_info.reduction() == [8, 16]
    with torch.no_grad():
        maps = model(torch.randn(1, 3, 64, 96))
    assert [tuple(m.shape) for m in maps] == [(1, 128, 8, 12), (1, 320, 4, 6)]

    full = timm.create_model('soft_tiny', features_only=True).eval()
    assert full.feature_info.channels() == [64, 128, 320, 512]
    assert full.feature_info.reduction() == [4, 8, 16, 32]
    # the maps are the backbone's with the same weights (stage 4 differs: the classifier has a cls token there)
    backbone = SOFT('tiny').eval()
    backbone.load_state_dict({k[len('model.'):]: v for k, v in full.state_dict().items()}, strict=False)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        got, ref = full(x), backbone(x)
    for i in range(3):
        torch.testing.assert_close(got[i], ref[i], rtol=0, atol=1e-5)
    assert got[3].shape == ref[3].shape == (1, 512, 2, 3)


def test_classifier_state_dict_loads_into_the_backbone():
    classifier = make().eval()
    backbone = SOFT(arch=NARROW_ARCH).eval()
    missing, unexpected = backbone.load_state_dict(classifier.state_dict(), strict=False)
    assert missing == []
    assert sorted(unexpected) == ['cls_pos_embed', 'cls_token', 'head.bias', 'head.weight']

    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        classifier_maps = classifier.forward_intermediates(x, indices=4, intermediates_only=True)
        backbone_maps = backbone(x)
    assert [m.shape for m in classifier_maps] == [m.shape for m in backbone_maps]
    for i in range(3):
        torch.testing.assert_close(classifier_maps[i], backbone_maps[i], rtol=0, atol=1e-6)
    # stage 4 attends to the cls token in the classifier, so its map must differ
    assert (classifier_maps[3] - backbone_maps[3]).abs().max() > 1e-4


def test_forward_intermediates():
    model = make().eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, indices=[0, 2])
        torch.testing.assert_close(final, model.forward_features(x), rtol=0, atol=0)
        assert [tuple(m.shape) for m in maps] == [(2, 16, 16, 16), (2, 48, 4, 4)]
        final, maps = model.forward_intermediates(x, indices=[1], stop_early=True)
        assert tuple(final.shape) == (2, 8 * 8, 32)  # the last map run, as tokens
        torch.testing.assert_close(final, maps[0].flatten(2).transpose(1, 2), rtol=0, atol=0)
        assert model.forward_intermediates(x, indices=2, intermediates_only=True)[0].shape == (2, 48, 4, 4)
    with pytest.raises(ValueError, match='output_fmt'):
        model.forward_intermediates(x, output_fmt='NHWC')


def test_forward_intermediates_after_pruning():
    model = make().eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
        model.prune_intermediate_layers([0, 1])
        assert len(model.stages) == 2 and model.num_classes == 0
        final, maps = model.forward_intermediates(x, indices=[0, 1])
    for a, b in zip(maps, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(final, ref[1].flatten(2).transpose(1, 2), rtol=0, atol=0)


def test_grad_checkpointing_and_no_weight_decay():
    model = make(drop_path_rate=0.0)
    calls = []
    model.stages[1].blocks[0].register_forward_pre_hook(lambda *args: calls.append(1))
    model.set_grad_checkpointing(True)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert len(calls) == 2  # recomputed in backward
    names = model.no_weight_decay()
    assert names == {'cls_token', 'cls_pos_embed', 'stages.0.pos_embed', 'stages.1.pos_embed', 'stages.2.pos_embed',
                     'stages.3.pos_embed'}
    assert names <= set(model.state_dict())


def test_any_input_size():
    model = make().eval()
    with torch.no_grad():
        for hw in ((224, 224), (33, 47), (8, 8)):
            logits = model(torch.randn(1, 3, *hw))
            assert logits.shape == (1, 7) and logits.isfinite().all()


@pytest.mark.parametrize('coarse', [True, False])
def test_group_matcher_orders_the_parameters_for_layer_decay(coarse):
    # timm's layer-wise learning-rate decay (create_optimizer_v2(..., layer_decay=...)) reads group_matcher: every
    # parameter in one group, the stem first, then the stages (coarse) or blocks in depth order, the head last
    from timm.models import group_parameters
    from timm.optim import param_groups_layer_decay

    model = timm.create_model('soft_norm_small')
    groups = list(group_parameters(model, model.group_matcher(coarse=coarse)).values())
    names = [name for name, _ in model.named_parameters()]
    assert sorted(name for group in groups for name in group) == sorted(names)
    assert {'cls_token', 'cls_pos_embed', 'stages.0.pos_embed', 'stages.0.downsample.0.conv.weight'} <= set(groups[0])
    assert 'head.weight' in groups[-1]
    depths = ARCH_SETTINGS['small']['depths']
    where = {name: i for i, group in enumerate(groups) for name in group}
    if coarse:  # the stem, the four stages (each with its downsampling), the final norm with the head
        assert len(groups) == 1 + 4 + 1
        assert [where[f'stages.{s}.blocks.0.attn.proj.weight'] for s in range(4)] == [1, 2, 3, 4]
    else:  # the stem, one group per block (a stage's downsampling with its first block, the final norm with the
        # last: timm's "the previous group"), the head
        blocks = [f'stages.{s}.blocks.{b}.mlp.fc1.weight' for s, depth in enumerate(depths) for b in range(depth)]
        assert [where[name] for name in blocks] == list(range(1, 1 + sum(depths)))
        assert where['stages.2.downsample.conv.weight'] == where['stages.2.blocks.0.norm1.weight']
        assert where['norm.weight'] == sum(depths) and len(groups) == 2 + sum(depths)
    scales = param_groups_layer_decay(model, weight_decay=0.05, layer_decay=0.75)
    assert max(g['lr_scale'] for g in scales) == 1.0 and min(g['lr_scale'] for g in scales) < 0.75 ** (len(groups) - 2)
