"""Tests of the arch zoo: the published parameter counts, and the validation of custom arch dicts."""
from __future__ import annotations

import pytest
import torch
from helpers.model_checks import VARIANTS

from soft_mm.models import ARCH_SETTINGS, SOFT, SoftVisionTransformer, resolve_arch, variant_name

# The exact parameter counts as the ImageNet metafile states them (the SOFT paper's models: the authors'
# tiny/medium/large/huge definitions and small with depths 1,3,7,4; 1000 classes, conv landmarks, cls token, position
# embeddings).
PARAMS = {v.arch: v.num_params for v in VARIANTS.values()}
TABLE = {  # dims, heads, depths: the SOFT paper's table copied here, the independent check of the zoo
    'tiny': ((64, 128, 320, 512), (2, 4, 10, 16), (1, 2, 3, 2)),
    'small': ((64, 128, 320, 512), (2, 4, 10, 16), (1, 3, 7, 4)),
    'medium': ((64, 128, 288, 512), (2, 4, 9, 16), (1, 3, 29, 5)),
    'large': ((64, 128, 320, 512), (2, 4, 10, 16), (1, 3, 40, 5)),
    'huge': ((64, 128, 352, 512), (2, 4, 11, 16), (1, 5, 49, 5)),
}


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def num_params_on_meta(cls: type[torch.nn.Module], *args, **kwargs) -> int:
    """Parameters of ``cls(*args, **kwargs)`` built on the meta device: shapes only, no memory, no random init
    (initialising the 87M-parameter huge model twice on the CPU would dominate the runtime)."""
    with torch.device('meta'):
        model = cls(*args, **kwargs)
    assert all(p.is_meta for p in model.parameters())
    return num_params(model)


@pytest.mark.parametrize('arch', list(PARAMS))
def test_classifier_parameter_counts(arch):
    plain = num_params_on_meta(SoftVisionTransformer, arch, num_classes=1000, landmark_mode='conv')
    norm = num_params_on_meta(SoftVisionTransformer, arch, soft_norm=True, num_classes=1000, landmark_mode='conv')
    assert plain == norm == PARAMS[arch]
    assert int(plain / 1e6) == VARIANTS[variant_name(arch, False)].params_m  # the paper truncates: 45.8M -> 45M


def test_zoo_matches_the_papers_table():
    assert list(ARCH_SETTINGS) == list(TABLE)
    for arch, (dims, heads, depths) in TABLE.items():
        settings = resolve_arch(arch)
        assert (settings['embed_dims'], settings['num_heads'], settings['depths']) == (dims, heads, depths)
        assert all(d // h == 32 for d, h in zip(dims, heads))  # head dim 32 everywhere
        assert settings['landmark_strides'] == (8, 4, 2) and settings['v_conv_kernels'] == (9, 5, 3)
        assert settings['mlp_ratio'] == 4


def test_avg_landmarks_drop_exactly_the_landmark_samplers():
    # per SOFT block: conv (32 * 32 * r^2, no bias) + LayerNorm(32); r = 8/4/2 in stages 1-3 of tiny (depths 1,2,3)
    per_block = [32 * 32 * r * r + 64 for r in (8, 4, 2)]
    expected = PARAMS['tiny'] - sum(n * d for n, d in zip(per_block, (1, 2, 3)))
    assert num_params_on_meta(SoftVisionTransformer, 'tiny', landmark_mode='avg') == expected


def test_backbone_drops_exactly_the_classifier_extras():
    # cls token, its position embedding and the 512 -> 1000 head
    assert num_params_on_meta(SOFT, 'tiny') == PARAMS['tiny'] - 512 - 512 - (512 * 1000 + 1000)
    assert num_params(SOFT('tiny')) == num_params_on_meta(SOFT, 'tiny')  # the meta build is the real one


def test_resolve_arch_returns_a_copy():
    settings = resolve_arch('tiny')
    settings['depths'] = (9, 9, 9, 9)
    assert resolve_arch('tiny')['depths'] == (1, 2, 3, 2)


def test_custom_arch_is_applied():
    arch = {'embed_dims': [32, 64, 96, 128], 'num_heads': [1, 2, 3, 4], 'depths': [1, 1, 2, 1],
            'landmark_strides': [4, 2, 1], 'v_conv_kernels': [7, 3, 1], 'mlp_ratio': 2}
    settings = resolve_arch(arch)
    assert settings['embed_dims'] == (32, 64, 96, 128) and settings['landmark_strides'] == (4, 2, 1)
    model = SOFT(arch=arch).eval()
    assert model.out_channels == [32, 64, 96, 128]
    assert [len(stage.blocks) for stage in model.stages] == [1, 1, 2, 1]
    for i, (stride, kernel) in enumerate(zip((4, 2, 1), (7, 3, 1))):
        attn = model.stages[i].blocks[0].attn
        assert attn.landmark_conv.stride == (stride, stride) and attn.v_conv.kernel_size == (kernel, kernel)
        assert attn.head_dim == 32
    assert model.stages[3].blocks[0].mlp.fc1.out_features == 2 * 128
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 64))
    assert [tuple(o.shape) for o in outs] == [(1, 32, 16, 16), (1, 64, 8, 8), (1, 96, 4, 4), (1, 128, 2, 2)]


def test_custom_arch_defaults():
    settings = resolve_arch({'embed_dims': (8, 16, 24, 32), 'num_heads': (1, 2, 3, 4), 'depths': (1, 1, 1, 1)})
    assert settings['landmark_strides'] == (8, 4, 2) and settings['v_conv_kernels'] == (9, 5, 3)
    assert settings['mlp_ratio'] == 4


def test_authors_small_layout_as_a_custom_arch():
    # the authors' code defines small with depths 1,3,20,4: 38.9M parameters, not the published 24M (the SOFT paper)
    arch = {**resolve_arch('small'), 'depths': (1, 3, 20, 4)}
    assert round(num_params_on_meta(SoftVisionTransformer, arch) / 1e5) == 389


VALID = {'embed_dims': (8, 16, 24, 32), 'num_heads': (1, 2, 3, 4), 'depths': (1, 1, 1, 1)}


@pytest.mark.parametrize('arch, match', [
    ({k: v for k, v in VALID.items() if k != 'depths'}, "missing.*'depths'"),
    ({k: v for k, v in VALID.items() if k == 'depths'}, "missing.*'embed_dims', 'num_heads'"),
    ({**VALID, 'num_heads': (1, 3, 3, 4)}, r'divisible.*\(16, 3\)'),
    ({**VALID, 'depths': (1, 1, 1)}, "depths"),
    ({**VALID, 'embed_dims': (8, 16, 24, 32, 40)}, "embed_dims"),
    ({**VALID, 'landmark_strides': (8, 4, 2, 1)}, "landmark_strides"),
    ({**VALID, 'v_conv_kernels': (9, 5)}, "v_conv_kernels"),
    ({**VALID, 'v_conv_kernels': (9, 4, 3)}, "v_conv_kernels.*odd"),
    ({**VALID, 'depths': (1, 0, 1, 1)}, "depths.*positive"),
    ({**VALID, 'embed_dims': (8, 16, 24.0, 32)}, "embed_dims"),
    ({**VALID, 'num_heads': 4}, "num_heads"),
    ({**VALID, 'mlp_ratio': 0}, "mlp_ratio"),
    ({**VALID, 'sr_ratios': (8, 4, 2, 1)}, r"unknown keys \['sr_ratios'\]"),
    ({**VALID, 'mlp_ratios': 4, 'depth': 3}, r"unknown keys \['depth', 'mlp_ratios'\]"),
])
def test_invalid_custom_arch(arch, match):
    with pytest.raises(ValueError, match=match):
        resolve_arch(arch)


def test_unknown_arch_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"'base'.*tiny, small, medium, large, huge"):
        resolve_arch('base')
    with pytest.raises(ValueError, match='tiny, small, medium, large, huge'):
        SOFT(arch='Tiny')
    with pytest.raises(TypeError, match='arch'):
        resolve_arch(('tiny',))
