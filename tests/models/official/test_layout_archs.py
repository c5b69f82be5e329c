"""The converter reads head counts and stage attention kinds from the arch, not from assumptions (head dim 32, SOFT
in stages 1-3): authors'-layout state dicts of custom archs, made from soft_mm models by an independent inverse key
map, convert back exactly, and the converted models compute what the originals compute."""
from __future__ import annotations

import re

import pytest
import torch

from soft_mm.models import AUTHORS_SETTINGS, SOFT, SoftVisionTransformer, resolve_arch
from soft_mm.models.official.layout import convert_official_state_dict, infer_arch

# SOFT stages 1-2, softmax stages 3-4; head dim 16 everywhere (the softmax heads follow the SOFT head dim).
TWO_SOFTMAX_STAGES = {'embed_dims': (32, 64, 96, 128), 'num_heads': (2, 4, 6, 8), 'depths': (1, 2, 2, 1),
                      'stage_attention': ('soft', 'soft', 'softmax', 'softmax'), 'landmark_strides': (4, 2),
                      'v_conv_kernels': (5, 3), 'mlp_ratio': 2}
# The default stage kinds with head dim 16: stage 4 has 8 heads, not 128 / 32 = 4.
HEAD_DIM_16 = {'embed_dims': (32, 64, 96, 128), 'num_heads': (2, 4, 6, 8), 'depths': (1, 1, 2, 1),
               'landmark_strides': (4, 2, 2), 'v_conv_kernels': (5, 3, 3)}
# Stage 4 with 2 heads of 64 while the SOFT stages have head dim 32: no tensor tells it, only the arch can.
WIDE_STAGE4_HEADS = {'embed_dims': (64, 64, 96, 128), 'num_heads': (2, 2, 3, 2), 'depths': (1, 1, 1, 1),
                     'landmark_strides': (4, 2, 2), 'v_conv_kernels': (5, 3, 3)}

_STEM = {'0.conv': '0', '0.bn': '1', '1.conv': '3', '1.bn': '4', '2.conv': '6', '2.bn': '7'}
_SOFT_NAMES = {'attn.qk': 'att.mha.W_q', 'attn.v': 'att.mha.W_v', 'attn.proj': 'att.mha.ff',
               'attn.landmark_conv': 'att.mha.attn.Qlandmark_op', 'attn.landmark_norm': 'att.mha.attn.Qnorm_act.0',
               'attn.v_conv': 'att.mha.attn.conv', 'norm1': 'att.norm1', 'norm2': 'att.norm2', 'mlp.fc1': 'att.ff1',
               'mlp.fc2': 'att.ff2'}


def to_authors_layout(state_dict: dict[str, torch.Tensor], kinds: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """soft_mm classifier keys -> the authors' names (fudan-zvg/SOFT), written from their key lists."""
    out = {'pos_embed4': torch.cat([state_dict['cls_pos_embed'], state_dict['stages.3.pos_embed']], dim=1)}
    for key, tensor in state_dict.items():
        if key in ('cls_pos_embed', 'stages.3.pos_embed'):
            continue
        if m := re.fullmatch(r'stages\.0\.downsample\.(\d\.(?:conv|bn))\.(\w+)', key):
            out[f'patch_embed1.proj.{_STEM[m[1]]}.{m[2]}'] = tensor
        elif m := re.fullmatch(r'stages\.(\d)\.downsample\.(conv|bn)\.(\w+)', key):
            out[f'patch_embed{int(m[1]) + 1}.proj.{0 if m[2] == "conv" else 1}.{m[3]}'] = tensor
        elif m := re.fullmatch(r'stages\.(\d)\.pos_embed', key):
            out[f'pos_embed{int(m[1]) + 1}'] = tensor
        elif m := re.fullmatch(r'stages\.(\d)\.blocks\.(\d+)\.(.+)\.(weight|bias)', key):
            stage = int(m[1])
            name = _SOFT_NAMES[m[3]] if kinds[stage] == 'soft' else m[3]
            out[f'block{stage + 1}.{m[2]}.{name}.{m[4]}'] = tensor
        else:
            assert key in ('cls_token', 'norm.weight', 'norm.bias', 'head.weight', 'head.bias'), key
            out[key] = tensor
    return out


def classifier(arch: dict, seed: int = 0) -> SoftVisionTransformer:
    torch.manual_seed(seed)
    model = SoftVisionTransformer(arch, num_classes=10, drop_path_rate=0.0, **AUTHORS_SETTINGS.as_dict())
    with torch.no_grad():  # non-zero biases, non-unit norms and BN statistics, so that every tensor matters
        for name, tensor in model.state_dict().items():
            if name.endswith('running_var'):
                tensor.uniform_(0.5, 1.5)
            elif tensor.is_floating_point() and (tensor.ndim == 1 or name.endswith('running_mean')):
                tensor.add_(0.1 * torch.randn_like(tensor))
    return model.double().eval()


def authors_state_dict(arch: dict) -> tuple[SoftVisionTransformer, dict[str, torch.Tensor]]:
    model = classifier(arch)
    return model, to_authors_layout(model.state_dict(), resolve_arch(arch)['stage_attention'])


def test_inverse_map_is_the_authors_layout(official_tiny):
    """The test's own inverse map gives exactly the authors' key names (checked on their tiny layout)."""
    model = SoftVisionTransformer('tiny', **AUTHORS_SETTINGS.as_dict())
    assert set(to_authors_layout(model.state_dict(), resolve_arch('tiny')['stage_attention'])) == set(official_tiny)


@pytest.mark.parametrize('arch', [TWO_SOFTMAX_STAGES, HEAD_DIM_16], ids=['softmax-stages-3-4', 'head-dim-16'])
def test_custom_arch_converts_back_exactly(arch):
    model, official = authors_state_dict(arch)
    converted, found_arch, unmapped = convert_official_state_dict(official)
    assert unmapped == []
    assert resolve_arch(found_arch) == resolve_arch(arch)  # head counts and stage kinds included
    reference = model.state_dict()
    assert converted.keys() == reference.keys()
    for key, tensor in reference.items():
        torch.testing.assert_close(converted[key], tensor, rtol=0, atol=0, msg=key)
    rebuilt = SoftVisionTransformer(found_arch, num_classes=10, **AUTHORS_SETTINGS.as_dict()).double().eval()
    rebuilt.load_state_dict(converted, strict=True)
    images = torch.randn(2, 3, 64, 96, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(images), model(images), rtol=0, atol=0)


def test_softmax_head_count_comes_from_the_arch():
    model, official = authors_state_dict(WIDE_STAGE4_HEADS)
    guessed = infer_arch(official)  # no arch given: the SOFT stages' head dim (32) -> 128 / 32 = 4 heads
    assert guessed['num_heads'] == [2, 2, 3, 4]
    converted, found_arch, _ = convert_official_state_dict(official, arch=WIDE_STAGE4_HEADS)
    assert resolve_arch(found_arch)['num_heads'] == (2, 2, 3, 2)
    rebuilt = SoftVisionTransformer(found_arch, num_classes=10, **AUTHORS_SETTINGS.as_dict()).double().eval()
    rebuilt.load_state_dict(converted, strict=True)
    images = torch.randn(1, 3, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(images), model(images), rtol=0, atol=0)
        wrong = SoftVisionTransformer(guessed, num_classes=10, **AUTHORS_SETTINGS.as_dict()).double().eval()
        wrong.load_state_dict(converted, strict=True)  # same tensors, 4 heads: another function
        assert (wrong(images) - model(images)).abs().max() > 1e-6


def test_model_loads_the_authors_layout_with_its_own_head_counts():
    """load_state_dict migrates the authors' layout with the model's arch: the stage-4 heads need no guess."""
    model, official = authors_state_dict(WIDE_STAGE4_HEADS)
    target = SoftVisionTransformer(WIDE_STAGE4_HEADS, num_classes=10, **AUTHORS_SETTINGS.as_dict()).double()
    target.load_state_dict(official, strict=True)
    for key, tensor in model.state_dict().items():
        torch.testing.assert_close(target.state_dict()[key], tensor, rtol=0, atol=0, msg=key)
    backbone = SOFT(TWO_SOFTMAX_STAGES, **AUTHORS_SETTINGS.as_dict()).double()
    _, two_softmax = authors_state_dict(TWO_SOFTMAX_STAGES)
    result = backbone.load_state_dict(two_softmax, strict=False)
    assert result.missing_keys == [] and sorted(result.unexpected_keys) == [
        'cls_pos_embed', 'cls_token', 'head.bias', 'head.weight']


def test_arch_that_does_not_fit_is_named():
    _, official = authors_state_dict(TWO_SOFTMAX_STAGES)
    with pytest.raises(ValueError, match=r"stage_attention \('soft', 'soft', 'softmax', 'softmax'\) \(arch: \('soft', "
                                         r"'soft', 'soft', 'softmax'\)\)"):
        convert_official_state_dict(official, arch={**TWO_SOFTMAX_STAGES, 'stage_attention': (
            'soft', 'soft', 'soft', 'softmax'), 'landmark_strides': (4, 2, 2), 'v_conv_kernels': (5, 3, 3)})
    with pytest.raises(ValueError, match=r"layout of arch='tiny': embed_dims"):
        convert_official_state_dict(official, arch='tiny')
    with pytest.raises(ValueError, match='depths'):
        SoftVisionTransformer({**TWO_SOFTMAX_STAGES, 'depths': (1, 1, 2, 1)}).load_state_dict(official)


def test_block_of_unknown_kind_fails_clearly(official_tiny):
    broken = {k: v for k, v in official_tiny.items() if not k.startswith('block4.0.attn.q.')}
    with pytest.raises(ValueError, match=r'block4\.0 has neither of block4\.0\.att\.mha\.W_q\.weight \(soft\) or '
                                         r'block4\.0\.attn\.q\.weight \(softmax\)'):
        infer_arch(broken)
