"""Tests of soft_mm.models.official (convert and layout): key mapping, arch inference, file handling and
the reproduction of the authors' forward pass by a converted model.

The authors' model cannot be installed here, so ``official_forward`` below is an independent functional reference of
their forward pass (plain torch, written from the SOFT paper's description; it uses neither soft_mm.ops nor
soft_mm.models) that reads the OFFICIAL-layout state dict directly.
"""
from __future__ import annotations

import argparse
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from soft_mm.models import ARCH_SETTINGS, AUTHORS_SETTINGS, SOFT, SoftVisionTransformer, resolve_arch
from soft_mm.models.checkpoint_conversion import (
    CLASSIFIER_ONLY_KEYS,
    build_classifier_from_checkpoint,
    load_converted_checkpoint,
    load_official_checkpoint,
    make_meta,
    save_converted_checkpoint,
    select_state_dict,
    verify_converted,
)
from soft_mm.models.official.layout import convert_official_state_dict, infer_arch, map_official_key, match_arch
from soft_mm.utils.checkpoint.reader import UnsafeCheckpointError

HEAD_DIM = 32


def backbone_state_dict(state_dict: dict) -> dict:
    """A converted classifier state dict without the classifier-only tensors: what the SOFT backbone holds."""
    return {k: v for k, v in state_dict.items() if k not in CLASSIFIER_ONLY_KEYS}


AUTHORS_SMALL_PARAMS = 38_858_462


# ---------------------------------------------------------------------------------------------------------------------
# Functional reference of the authors' model, on their state-dict layout


def _conv_bn_relu(x: torch.Tensor, sd: dict, conv: str, bn: str, stride: int) -> torch.Tensor:
    x = F.conv2d(x, sd[f'{conv}.weight'], sd[f'{conv}.bias'], stride=stride, padding=1)
    x = F.batch_norm(x, sd[f'{bn}.running_mean'], sd[f'{bn}.running_var'], sd[f'{bn}.weight'], sd[f'{bn}.bias'],
                     training=False, eps=1e-5)
    return F.relu(x)


def _layer_norm(x: torch.Tensor, sd: dict, name: str, eps: float) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], sd[f'{name}.weight'], sd[f'{name}.bias'], eps=eps)


def _linear(x: torch.Tensor, sd: dict, name: str) -> torch.Tensor:
    return F.linear(x, sd[f'{name}.weight'], sd[f'{name}.bias'])


def _squared_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Expanded form, as the authors compute it: |a|^2 + |b|^2 - 2 a b^T (no clamping)."""
    return (a * a).sum(-1).unsqueeze(-1) + (b * b).sum(-1).unsqueeze(-2) - 2 * a @ b.transpose(-1, -2)


def _newton_pinv(a: torch.Tensor, iters: int, ridge: float) -> torch.Tensor:
    """The authors' Newton-Schulz iteration: alpha = 0.9 * 2 / max_row_sum(A)^2 per matrix, V0 = alpha (A + ridge I)."""
    alpha = 0.9 * 2 / a.sum(-1).amax(-1) ** 2
    p = a + ridge * torch.eye(a.shape[-1], dtype=a.dtype)
    v = alpha[..., None, None] * p
    for _ in range(iters):
        v = 2 * v - v @ p @ v
    return v


def _soft_block(x: torch.Tensor, sd: dict, prefix: str, hw: tuple[int, int], soft_norm: bool,
                newton_iters: int, ridge: float) -> torch.Tensor:
    """Post-norm SOFT block ``block{s}.{j}.att`` on tokens (B, N, C)."""
    b, n, c = x.shape
    heads = sd[f'{prefix}.mha.attn.conv.weight'].shape[0]
    d = c // heads
    q = _linear(x, sd, f'{prefix}.mha.W_q').reshape(b, n, heads, d).transpose(1, 2) * d ** -0.25  # (B, h, N, d)
    v = _linear(x, sd, f'{prefix}.mha.W_v').reshape(b, n, heads, d).transpose(1, 2)
    landmark_weight = sd[f'{prefix}.mha.attn.Qlandmark_op.weight']
    q_map = q.reshape(b * heads, *hw, d).permute(0, 3, 1, 2)
    landmarks = F.conv2d(q_map, landmark_weight, stride=landmark_weight.shape[-1]).flatten(2).transpose(1, 2)
    landmarks = F.gelu(_layer_norm(landmarks, sd, f'{prefix}.mha.attn.Qnorm_act.0', 1e-5))
    landmarks = landmarks.reshape(b, heads, -1, d)
    kernel_q = torch.exp(-_squared_distance(q, landmarks) / 2)  # K1 (B, h, N, m)
    kernel_landmarks = torch.exp(-_squared_distance(landmarks, landmarks) / 2)  # A (B, h, m, m)
    inverse = _newton_pinv(kernel_landmarks, newton_iters, ridge)
    if soft_norm:
        d_inv_sqrt = kernel_landmarks.sum(-1) ** -0.5
        inverse = d_inv_sqrt.unsqueeze(-1) * inverse * d_inv_sqrt.unsqueeze(-2)
    out = (kernel_q @ inverse) @ (kernel_q.transpose(-1, -2) @ v)
    v_conv = sd[f'{prefix}.mha.attn.conv.weight']
    v_map = v.permute(0, 3, 1, 2).reshape(b * d, heads, *hw)
    local = F.conv2d(v_map, v_conv, padding=v_conv.shape[-1] // 2, groups=heads)
    out = out + local.reshape(b, d, heads, n).permute(0, 2, 3, 1)
    out = _linear(out.transpose(1, 2).reshape(b, n, c), sd, f'{prefix}.mha.ff')
    x = _layer_norm(x + out, sd, f'{prefix}.norm1', 1e-5)
    mlp = _linear(F.gelu(_linear(x, sd, f'{prefix}.ff1'), approximate='tanh'), sd, f'{prefix}.ff2')
    return _layer_norm(x + mlp, sd, f'{prefix}.norm2', 1e-5)


def _pvt_block(x: torch.Tensor, sd: dict, prefix: str) -> torch.Tensor:
    """Pre-norm softmax block ``block4.{j}`` on tokens (B, 1 + N, C)."""
    b, n, c = x.shape
    heads = c // HEAD_DIM
    y = _layer_norm(x, sd, f'{prefix}.norm1', 1e-6)
    q = _linear(y, sd, f'{prefix}.attn.q').reshape(b, n, heads, HEAD_DIM).transpose(1, 2)
    k, v = _linear(y, sd, f'{prefix}.attn.kv').reshape(b, n, 2, heads, HEAD_DIM).permute(2, 0, 3, 1, 4)
    attn = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM), dim=-1)
    x = x + _linear((attn @ v).transpose(1, 2).reshape(b, n, c), sd, f'{prefix}.attn.proj')
    y = _layer_norm(x, sd, f'{prefix}.norm2', 1e-6)
    return x + _linear(F.gelu(_linear(y, sd, f'{prefix}.mlp.fc1')), sd, f'{prefix}.mlp.fc2')


def _depth(sd: dict, stage: int) -> int:
    return len({key.split('.')[1] for key in sd if key.startswith(f'block{stage}.')})


def official_forward(sd: dict, images: torch.Tensor, soft_norm: bool, newton_iters: int = 20,
                     ridge: float = 0.01) -> torch.Tensor:
    """Logits of the authors' classifier for 224x224 ``images`` (B, 3, 224, 224), from their state dict."""
    x = _conv_bn_relu(images, sd, 'patch_embed1.proj.0', 'patch_embed1.proj.1', 2)
    x = _conv_bn_relu(x, sd, 'patch_embed1.proj.3', 'patch_embed1.proj.4', 1)
    x = _conv_bn_relu(x, sd, 'patch_embed1.proj.6', 'patch_embed1.proj.7', 2)
    for stage in (1, 2, 3):
        if stage > 1:
            x = _conv_bn_relu(x, sd, f'patch_embed{stage}.proj.0', f'patch_embed{stage}.proj.1', 2)
        b, c, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2) + sd[f'pos_embed{stage}']
        for j in range(_depth(sd, stage)):
            tokens = _soft_block(tokens, sd, f'block{stage}.{j}.att', (h, w), soft_norm, newton_iters, ridge)
        x = tokens.transpose(1, 2).reshape(b, c, h, w)
    x = _conv_bn_relu(x, sd, 'patch_embed4.proj.0', 'patch_embed4.proj.1', 2)
    tokens = x.flatten(2).transpose(1, 2)
    tokens = torch.cat([sd['cls_token'].expand(tokens.shape[0], -1, -1), tokens], dim=1) + sd['pos_embed4']
    for j in range(_depth(sd, 4)):
        tokens = _pvt_block(tokens, sd, f'block4.{j}')
    tokens = _layer_norm(tokens, sd, 'norm', 1e-6)
    return _linear(tokens[:, 0], sd, 'head')


# ---------------------------------------------------------------------------------------------------------------------
# Reproduction: a converted model computes the authors' logits


@pytest.fixture(scope='module')
def tiny_float64(official_tiny):
    official = {k: v.double() if v.is_floating_point() else v for k, v in official_tiny.items()}
    images = torch.randn(1, 3, 224, 224, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return official, images


@pytest.fixture(scope='module')
def reference_logits(tiny_float64):
    official, images = tiny_float64
    return {soft_norm: official_forward(official, images, soft_norm) for soft_norm in (False, True)}


def _converted_model(official: dict, soft_norm: bool, **overrides) -> SoftVisionTransformer:
    state_dict, arch, _ = convert_official_state_dict(official)
    settings = {**AUTHORS_SETTINGS.as_dict(), **overrides}
    model = SoftVisionTransformer(arch, soft_norm=soft_norm, **settings).double().eval()
    model.load_state_dict(state_dict, strict=True)
    return model


@pytest.mark.parametrize('soft_norm', [False, True], ids=['plain', 'norm'])
def test_converted_model_reproduces_official_forward(tiny_float64, reference_logits, soft_norm):
    official, images = tiny_float64
    model = _converted_model(official, soft_norm)
    with torch.no_grad():
        logits = model(images)
    expected = reference_logits[soft_norm]
    diff = (logits - expected).abs().max().item()
    print(f'soft_norm={soft_norm}: max |logit diff| = {diff:.3e} (logits up to {expected.abs().max():.2f})')
    assert diff < 1e-11


def test_reproduction_check_can_fail(tiny_float64, reference_logits):
    """The random weights make the attention matter: SOFT-Norm and the 0.01 ridge change the logits visibly."""
    official, images = tiny_float64
    assert (reference_logits[True] - reference_logits[False]).abs().max() > 1e-2
    with torch.no_grad():
        logits_without_ridge = _converted_model(official, soft_norm=False, newton_ridge=0.0)(images)
    assert (logits_without_ridge - reference_logits[False]).abs().max() > 1e-4


# ---------------------------------------------------------------------------------------------------------------------
# Mapping and arch inference on all five of the authors' layouts


_BUFFER_SUFFIXES = ('running_mean', 'running_var', 'num_batches_tracked')


@pytest.mark.parametrize('variant', ['tiny', 'small'])
def test_every_official_tensor_is_carried_over_unchanged(variant, official_tiny, official_small):
    official = official_tiny if variant == 'tiny' else official_small
    converted, _, unmapped = convert_official_state_dict(official)
    assert unmapped == []
    assert len(converted) == len(official) + 1  # pos_embed4 becomes two tensors
    for key, tensor in official.items():
        if key == 'pos_embed4':
            torch.testing.assert_close(converted['cls_pos_embed'], tensor[:, :1], rtol=0, atol=0)
            torch.testing.assert_close(converted['stages.3.pos_embed'], tensor[:, 1:], rtol=0, atol=0)
        else:
            torch.testing.assert_close(converted[map_official_key(key)], tensor, rtol=0, atol=0)
    assert converted['stages.3.pos_embed'].untyped_storage().data_ptr() != \
        official['pos_embed4'].untyped_storage().data_ptr()  # a copy: saving it does not drag the whole storage


@pytest.mark.parametrize('variant', ['tiny', 'small', 'medium', 'large', 'huge'])
def test_all_official_layouts_convert_completely(variant, official_layout):
    """Every key of the authors' five layouts maps (shapes only: meta tensors, no memory), the parameter count is
    theirs (header line), and the published variants infer their table arch; their 38.9M small does not."""
    shapes, num_params = official_layout(variant)
    official = {k: torch.empty(shape, device='meta') for k, shape in shapes.items()}
    converted, arch, unmapped = convert_official_state_dict(official)
    assert unmapped == []
    assert len(converted) == len(shapes) + 1
    assert sum(v.numel() for k, v in converted.items() if not k.endswith(_BUFFER_SUFFIXES)) == num_params
    if variant == 'small':
        assert isinstance(arch, dict) and arch['depths'] == [1, 3, 20, 4]
    else:
        assert arch == variant
        assert resolve_arch(infer_arch(official)) == ARCH_SETTINGS[variant]


def test_authors_small_becomes_a_custom_depth_20_arch(official_small, load_tool):
    describe_arch = load_tool('model_converters/convert_official_checkpoint').describe_arch
    converted, arch, unmapped = convert_official_state_dict(official_small)
    assert unmapped == []
    assert arch == {'embed_dims': [64, 128, 320, 512], 'num_heads': [2, 4, 10, 16], 'depths': [1, 3, 20, 4],
                    'landmark_strides': [8, 4, 2], 'v_conv_kernels': [9, 5, 3], 'mlp_ratio': 4}
    assert match_arch(arch) is None
    description = describe_arch(arch)
    assert "closest is 'small'" in description and 'depths (1, 3, 20, 4) (table: (1, 3, 7, 4))' in description
    assert verify_converted(converted, arch) == AUTHORS_SMALL_PARAMS  # strict load into the classifier
    SOFT(arch, **AUTHORS_SETTINGS.as_dict()).load_state_dict(backbone_state_dict(converted), strict=True)


def test_converted_tiny_loads_strictly_into_classifier_and_backbone(official_tiny):
    converted, arch, _ = convert_official_state_dict(official_tiny)
    assert arch == 'tiny'
    SoftVisionTransformer(arch).load_state_dict(converted, strict=True)
    backbone = SOFT(arch)
    result = backbone.load_state_dict(converted, strict=False)
    assert result.missing_keys == []
    assert sorted(result.unexpected_keys) == ['cls_pos_embed', 'cls_token', 'head.bias', 'head.weight']
    backbone.load_state_dict(backbone_state_dict(converted), strict=True)
    assert verify_converted(converted, arch) == 13_069_056


# ---------------------------------------------------------------------------------------------------------------------
# Checkpoint containers, unmapped keys and layouts that cannot be converted


def _strip(state_dict: dict) -> dict:
    return dict(list(state_dict.items())[:3])  # a few tensors suffice for selection tests


def test_select_state_dict_containers(official_tiny):
    weights = _strip(official_tiny)
    ema = {k: v + 1 for k, v in weights.items()}
    assert select_state_dict({'state_dict': weights, 'epoch': 3})[1] == 'state_dict'
    assert select_state_dict({'model': weights, 'args': argparse.Namespace(lr=1)})[1] == 'model'
    assert select_state_dict(weights)[1] == ''  # bare state dict
    both = {'state_dict': weights, 'state_dict_ema': ema}
    chosen, key = select_state_dict(both)
    assert key == 'state_dict' and chosen.keys() == weights.keys()
    chosen, key = select_state_dict(both, key='state_dict_ema')
    assert key == 'state_dict_ema'
    torch.testing.assert_close(next(iter(chosen.values())), next(iter(ema.values())))
    with pytest.warns(UserWarning, match='only EMA weights'):
        assert select_state_dict({'state_dict_ema': ema})[1] == 'state_dict_ema'
    prefixed = {f'module.{k}': v for k, v in weights.items()}
    assert select_state_dict({'model': prefixed})[0].keys() == weights.keys()


def test_select_state_dict_errors(official_tiny):
    weights = _strip(official_tiny)
    with pytest.raises(ValueError, match=r"key='model' is not in the checkpoint; it has \['state_dict'\]"):
        select_state_dict({'state_dict': weights}, key='model')
    with pytest.raises(ValueError, match='is not one of'):
        select_state_dict({'state_dict': weights}, key='weights')
    with pytest.raises(ValueError, match='found no state dict'):
        select_state_dict({'epoch': 3, 'optimizer': {}})
    with pytest.raises(ValueError, match='non-tensor values'):
        select_state_dict({'state_dict': {**weights, 'step': 3}})


def test_unmapped_keys_are_reported(official_tiny):
    extra = {'head_dist.weight': torch.zeros(1000, 512), 'block1.0.att.mha.W_k.weight': torch.zeros(64, 64)}
    converted, _, unmapped = convert_official_state_dict({**official_tiny, **extra})
    assert sorted(unmapped) == sorted(extra)
    SoftVisionTransformer('tiny').load_state_dict(converted, strict=True)


def test_layouts_that_cannot_be_converted_fail_clearly(official_tiny):
    with pytest.raises(ValueError, match=r'no block1\.\* keys: this is not an official SOFT state dict'):
        convert_official_state_dict({'conv1.weight': torch.zeros(64, 3, 7, 7), 'fc.weight': torch.zeros(10, 64)})
    linear_landmarks = {**official_tiny, 'block3.0.att.mha.attn.Qlandmark_op.weight': torch.zeros(32, 32)}
    with pytest.raises(ValueError, match='Linear landmark op'):
        convert_official_state_dict(linear_landmarks)
    bad_heads = {**official_tiny, 'block2.0.att.mha.attn.conv.weight': torch.zeros(3, 1, 5, 5)}
    with pytest.raises(ValueError, match=r'block2.0 has inconsistent shapes'):
        convert_official_state_dict(bad_heads)
    missing = {k: v for k, v in official_tiny.items() if k != 'block3.1.att.ff2.weight'}
    converted, arch, _ = convert_official_state_dict(missing)
    fit_error = r'(?s)does not fit SoftVisionTransformer.*stages\.2\.blocks\.1\.mlp\.fc2\.weight'
    with pytest.raises(ValueError, match=fit_error):
        verify_converted(converted, arch)


# ---------------------------------------------------------------------------------------------------------------------
# Files: the authors' containers in, weights_only-safe converted files out


class _Opaque:  # an object that torch.load(weights_only=True) refuses
    pass


def test_load_official_checkpoint_timm_file_reads_safely(tmp_path, official_tiny):
    path = tmp_path / 'soft_tiny.pth'
    torch.save({'state_dict': official_tiny, 'state_dict_ema': official_tiny, 'epoch': 299,
                'args': argparse.Namespace(model='soft_tiny', lr=1e-3)}, path)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # the Namespace is allow-listed: no fallback to full unpickling
        state_dict, key = load_official_checkpoint(path)
    assert key == 'state_dict' and state_dict.keys() == official_tiny.keys()
    assert load_official_checkpoint(path, key='state_dict_ema')[1] == 'state_dict_ema'


def test_load_official_checkpoint_refuses_pickles_unless_allowed(tmp_path, official_tiny):
    path = tmp_path / 'old.pth'
    torch.save({'model': _strip(official_tiny), 'extra': _Opaque()}, path)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # the default refuses before anything is unpickled: no warning, no fallback
        with pytest.raises(UnsafeCheckpointError, match=rf'^{path} holds a pickled \S+_Opaque, which torch.load\('
                                                        r'weights_only=True\) refuses to run: only if you trust the '
                                                        r'file, pass allow_pickle=True'):
            load_official_checkpoint(path)
    with pytest.warns(UserWarning, match='weights_only=False'):
        assert load_official_checkpoint(path, allow_pickle=True)[1] == 'model'


@pytest.mark.parametrize('arch_source', ['tiny', 'small'])
def test_converted_file_round_trip(tmp_path, arch_source, official_tiny, official_small):
    official = official_tiny if arch_source == 'tiny' else official_small
    converted, arch, _ = convert_official_state_dict(official)
    path = tmp_path / 'converted.pth'
    save_converted_checkpoint(path, converted, make_meta(arch, soft_norm=True, source='x.pth', source_key='model'))
    raw = torch.load(path, weights_only=True)  # only tensors and plain python values
    assert raw['meta']['arch'] == arch and raw['meta']['soft_norm'] is True
    assert raw['meta']['newton_ridge'] == 0.01 and raw['meta']['landmark_mode'] == 'conv'
    state_dict, meta = load_converted_checkpoint(path)
    assert state_dict.keys() == converted.keys() and meta == raw['meta']
    if arch_source == 'tiny':
        model = build_classifier_from_checkpoint(path)
        assert model.soft_norm and model.num_classes == 1000
        attn = model.stages[0].blocks[0].attn
        assert (attn.newton_iters, attn.newton_ridge, attn.landmark_mode) == (20, 0.01, 'conv')
        torch.testing.assert_close(model.stages[3].pos_embed.detach(), official['pos_embed4'][:, 1:])


def test_converted_file_is_an_mmengine_pretrained_checkpoint(tmp_path, official_tiny):
    converted, arch, _ = convert_official_state_dict(official_tiny)
    path = tmp_path / 'soft_tiny_converted.pth'
    save_converted_checkpoint(path, converted, make_meta(arch, soft_norm=False))
    backbone = SOFT(arch, init_cfg={'type': 'Pretrained', 'checkpoint': str(path)})
    backbone.init_weights()
    for key, tensor in backbone.state_dict().items():
        torch.testing.assert_close(tensor, converted[key], rtol=0, atol=0, msg=key)


def test_load_converted_checkpoint_rejects_other_files(tmp_path, official_tiny):
    path = tmp_path / 'official.pth'
    torch.save({'state_dict': _strip(official_tiny)}, path)
    with pytest.raises(ValueError, match='not a converted SOFT checkpoint'):
        load_converted_checkpoint(path)
