"""soft_mm.models.attention_health: landmarks recorded from a real forward, figures per layer, and a forward (and
backward) that is bit-identical with the recorder on and off."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from soft_mm.models import SOFT
from soft_mm.models.attention_health import (
    LandmarkRecorder,
    attention_health,
    format_health_table,
    health_scalars,
    landmark_kernel_health,
    short_layer_name,
)


def _backbone(mode: str, seed: int = 0) -> SOFT:
    torch.manual_seed(seed)
    model = SOFT(arch='tiny', soft_norm=True, landmark_mode=mode, drop_path_rate=0.0)
    model.init_weights()
    return model


@pytest.mark.parametrize('mode', ['avg', 'conv'])
def test_forward_and_backward_are_bit_identical_with_the_recorder(mode):
    model = _backbone(mode).train()
    x = torch.randn(2, 3, 97, 131, generator=torch.Generator().manual_seed(0))

    def run() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        model.zero_grad()
        outs = model(x)
        sum(out.mul(torch.linspace(-1, 1, out.shape[1])[:, None, None]).sum() for out in outs).backward()
        return [out.detach().clone() for out in outs], [p.grad.clone() for p in model.parameters()]

    plain_outs, plain_grads = run()
    recorder = LandmarkRecorder(model)
    with recorder:
        hooked_outs, hooked_grads = run()
    assert all(len(captures) == 1 for captures in recorder.landmarks.values())
    assert all(torch.equal(a, b) for a, b in zip(plain_outs, hooked_outs))
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, hooked_grads))
    again_outs, _ = run()  # detached: no hook left behind
    assert all(torch.equal(a, b) for a, b in zip(plain_outs, again_outs))
    assert not recorder.attached


def test_recorded_landmarks_are_the_layers_own():
    model = _backbone('conv').eval()
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    layer = model.stages[0].blocks[0].attn
    seen = {}
    handle = layer.register_forward_pre_hook(lambda module, args: seen.update(x=args[0], hw=args[1]))
    recorder = LandmarkRecorder(model)
    with torch.no_grad(), recorder:
        model(x)
    handle.remove()
    with torch.no_grad():  # the layer's own sampling of its own queries
        expected = layer.sample_landmarks(layer.queries(seen['x']), seen['hw'])
    (recorded,) = recorder.landmarks['stages.0.blocks.0.attn']
    assert torch.equal(recorded, expected)
    assert [tokens for tokens, _, _ in recorder.outputs['stages.0.blocks.0.attn']] == [16 * 24]


def test_report_aggregates_the_ops_figures_per_layer():
    model = _backbone('conv').eval()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    recorder = LandmarkRecorder(model)
    seen = {}
    handle = model.stages[1].blocks[1].attn.register_forward_hook(
        lambda module, args, out: seen.update(x=args[0].double(), out=out.double()))
    with torch.no_grad(), recorder:
        model(x)
    handle.remove()
    report = recorder.health(target_residual=1e-6, max_iters=80)
    s2b1 = report[2]
    assert s2b1.name == 'stages.1.blocks.1.attn' and s2b1.tokens == 8 * 8
    assert s2b1.branch_ratio == pytest.approx(float(seen['out'].norm(dim=-1).mean() / seen['x'].norm(dim=-1).mean()),
                                              rel=1e-12)
    mean_out = seen['out'].mean(1, keepdim=True)
    cosines = (seen['out'] * mean_out).sum(-1) / (seen['out'].norm(dim=-1) * mean_out.norm(dim=-1))
    assert s2b1.uniformity == pytest.approx(float(cosines.mean()), rel=1e-9)
    assert [layer.name for layer in report] == [name for name, _ in model.named_modules() if name.endswith('.attn')
                                                and 'stages.3' not in name]
    for layer in report:
        (landmarks,) = recorder.landmarks[layer.name]
        figures = landmark_kernel_health(landmarks, 20, 0.01, 1e-6, 80)
        assert layer.num_sets == landmarks.shape[0] * landmarks.shape[1]
        assert layer.condition_max == float(figures.condition.max())
        assert layer.residual_median == float(figures.residual.median())
        assert layer.effective_rank_min == int(figures.effective_rank.min())
        assert layer.iters_to_target == int(figures.iters_to_target.max())
        assert layer.num_landmarks == landmarks.shape[2]


def test_average_pooled_landmarks_collapse_at_initialisation_and_conv_ones_do_not():
    """The finding behind docs/advanced/attention_health.md, at a fixed seed: at initialisation every 'avg'
    layer's landmark kernel is at the coincident-landmark ceiling (few eigenvalues above the ridge, 20 iterations far
    from converged), every 'conv' layer's is well-conditioned and inverted to rounding."""
    x = torch.randn(1, 3, 128, 128, generator=torch.Generator().manual_seed(3))
    ceiling = (49 + 0.01) / 0.01
    avg = attention_health(_backbone('avg').eval(), x)
    conv = attention_health(_backbone('conv').eval(), x)
    # the collapsed stage-1 layer adds one and the same vector to every token, the conv one a token-specific one
    assert avg[0].uniformity > 0.99
    assert conv[0].uniformity < 0.9
    assert avg[0].effective_rank_median <= 2
    for layer in avg:
        assert layer.condition_max > 0.8 * ceiling
        assert layer.effective_rank_median < 0.6 * layer.num_landmarks  # 1/49 in stage 1, up to 29/49 in stage 3
        assert layer.residual_max > 0.5
        assert layer.iters_to_target > 20
    for layer in conv:
        assert layer.condition_max < 0.05 * ceiling
        assert layer.effective_rank_min == layer.num_landmarks
        assert layer.residual_max < 1e-8
        assert layer.iters_to_target <= 20


def test_table_and_scalars_carry_every_layer():
    report = attention_health(_backbone('avg').eval(), torch.randn(1, 3, 64, 64))
    table = format_health_table(report).splitlines()
    assert len(table) == 2 + 6  # header, rule, the 1 + 2 + 3 SOFT layers of tiny
    assert table[2].split()[:3] == ['s1.b0', str(16 * 16), '49']
    scalars = health_scalars(report)
    assert scalars['attn_health/max_residual'] == max(layer.residual_max for layer in report)
    assert scalars['attn_health/s3.b2/condition'] == report[-1].condition_max
    assert all(math.isfinite(value) for value in scalars.values())


def test_short_layer_names():
    assert short_layer_name('backbone.stages.0.blocks.1.attn') == 's1.b1'
    assert short_layer_name('stages.2.blocks.10.attn') == 's3.b10'
    assert short_layer_name('encoder.attn') == 'encoder.attn'


def test_models_without_soft_layers_are_refused():
    with pytest.raises(ValueError, match='has no SOFT attention layer'):
        attention_health(nn.Linear(2, 2), torch.zeros(1, 2))
    with pytest.raises(TypeError, match='run must be a callable or an input tensor'):
        attention_health(_backbone('avg'), 'image.png')
