"""torch.fx symbolic tracing of the SOFT classifiers and backbone (what timm's ``feature_cls='fx'``, torchvision's
``create_feature_extractor`` and FX graph-mode quantization build on): the shape-dependent pieces are registered as
timm registers its own, so a traced model keeps them as nodes and gives exactly the eager outputs.

timm's tracer (torchvision's ``NodePathTracer``) names every node with a scan over the nodes before it, so its cost
grows with the square of the graph (about 20 s for soft_huge's 4600 nodes, traced in train and eval mode); timm's
helpers run here on the tiny variants, and torch's own ``symbolic_trace`` (which honours the same registrations)
covers all ten.
"""
from __future__ import annotations

import pytest
import timm
import torch
from timm.models._features_fx import create_feature_extractor, get_notrace_functions
from torch import nn

import soft_mm  # noqa: F401  (registers the timm entrypoints)
from soft_mm.models import SOFT, SoftAttention
from soft_mm.models.attention import soft_attention
from soft_mm.ops.functional.gelu import linear_gelu

VARIANTS = [f'soft_{norm}{arch}' for norm in ('', 'norm_') for arch in ('tiny', 'small', 'medium', 'large', 'huge')]
NARROW_ARCH = {'embed_dims': (16, 32, 48, 64), 'num_heads': (1, 2, 2, 2), 'depths': (1, 2, 2, 2)}
# torchvision's note that the train-mode graph has more nodes than the eval one (DropPath)
pytestmark = pytest.mark.filterwarnings('ignore:NOTE. The nodes obtained by tracing:UserWarning')


def _randomize(model: nn.Module) -> nn.Module:
    """Weights for a model built on the meta device: normal(0, 0.02) parameters (much faster than the truncated
    normal initialisation of the large variants), and unit-scale norms with fresh statistics."""
    model.to_empty(device='cpu')
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02)
    for module in model.modules():
        if isinstance(module, (nn.LayerNorm, nn.BatchNorm2d)):
            module.reset_parameters()
    return model


def _function_calls(graph_module: torch.fx.GraphModule, target) -> int:
    return sum(node.op == 'call_function' and node.target is target for node in graph_module.graph.nodes)


def test_soft_pieces_are_registered_with_timm():
    registered = set(get_notrace_functions())
    assert {soft_attention, linear_gelu} <= registered
    assert {'check_pyramid_input', 'resize_pos_embed', '_check_hw', '_pool_token_map'} <= {
        getattr(f, '__name__', f) for f in registered}


@pytest.mark.parametrize('name', VARIANTS)
def test_symbolic_trace_of_every_classifier_is_exact(name):
    torch.manual_seed(0)
    with torch.device('meta'):
        model = timm.create_model(name, num_classes=5)
    model = _randomize(model).eval()
    traced = torch.fx.symbolic_trace(model)
    # the SOFT op is one node per SOFT block, the fused MLP one per block: registered, not traced through
    soft_blocks = sum(isinstance(m, SoftAttention) for m in model.modules())
    assert soft_blocks == sum(model.arch_settings['depths'][:3])
    assert _function_calls(traced, soft_attention) == soft_blocks
    assert _function_calls(traced, linear_gelu) == sum(model.arch_settings['depths'])
    x = torch.randn(2, 3, 80, 112)  # not 224: the position embeddings are resized, the landmark maps pooled
    with torch.inference_mode():
        expected, out = model(x), traced(x)
    assert expected.shape == (2, 5) and expected.isfinite().all()
    assert torch.equal(out, expected)


@pytest.mark.parametrize('name', ['soft_tiny', 'soft_norm_tiny'])
def test_timm_feature_extractor_round_trip_is_exact(name):
    # what timm's test_model_forward_fx does: the whole model through timm's create_feature_extractor
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=7).eval()
    graph = create_feature_extractor(model, {'head': 'logits'})
    x = torch.randn(1, 3, 96, 64)
    with torch.inference_mode():
        expected, out = model(x), graph(x)['logits']
    assert torch.equal(out, expected)
    # and the traced graph trains (timm's test_model_backward_fx): a gradient for every parameter
    model = timm.create_model(name, num_classes=7, drop_path_rate=0.0).train()
    graph = create_feature_extractor(model, {'head': 'logits'})
    graph(torch.randn(2, 3, 64, 64))['logits'].mean().backward()
    missing = [n for n, p in graph.named_parameters() if p.grad is None]
    assert not missing
    assert sum(p.numel() for p in graph.parameters()) == sum(p.numel() for p in model.parameters())


def test_features_only_fx_gives_the_default_maps():
    x = torch.randn(2, 3, 72, 104)
    maps = {}
    for feature_cls in ('getter', 'fx'):
        torch.manual_seed(0)
        kwargs = {} if feature_cls == 'getter' else {'feature_cls': 'fx'}
        model = timm.create_model('soft_tiny', features_only=True, **kwargs).eval()
        assert model.feature_info.channels() == [64, 128, 320, 512]
        with torch.inference_mode():
            maps[feature_cls] = model(x)
    assert type(model).__name__ == 'FeatureGraphNet'
    assert [tuple(m.shape) for m in maps['fx']] == [(2, 64, 18, 26), (2, 128, 9, 13), (2, 320, 5, 7), (2, 512, 3, 4)]
    for default, traced in zip(maps['getter'], maps['fx']):
        assert torch.equal(traced, default)


def test_symbolic_trace_of_the_backbone_is_exact_and_checks_its_input():
    torch.manual_seed(0)
    backbone = SOFT(NARROW_ARCH, soft_norm=True, out_indices=(0, 2, 3)).eval()
    traced = torch.fx.symbolic_trace(backbone)
    x = torch.randn(1, 3, 67, 45)
    with torch.inference_mode():
        expected, out = backbone(x), traced(x)
    assert len(out) == 3 and [m.shape[1] for m in out] == [16, 48, 64]
    for a, b in zip(out, expected):
        assert torch.equal(a, b)
    # the input check is a node of the graph, run at every call
    with pytest.raises(ValueError, match='in_channels=3 channels, got 1'):
        traced(torch.randn(1, 1, 64, 64))
