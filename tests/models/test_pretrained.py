"""Pretrained weights the timm way and the versioned state-dict layout.

``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=...))`` and ``checkpoint_path=`` load the
authors' release (converted at load time) or a soft_mm checkpoint; the mm backbone's ``init_cfg`` takes the authors'
file as it is; ``SoftPyramid._load_from_state_dict`` migrates the authors' layout under any prefix and refuses a
newer layout version."""
from __future__ import annotations

import argparse
from collections import OrderedDict

import pytest
import timm
import torch
from torch import nn

from soft_mm.models import SOFT, SoftPyramid, SoftVisionTransformer
from soft_mm.models.checkpoint_conversion import CLASSIFIER_ONLY_KEYS, make_meta, save_converted_checkpoint
from soft_mm.models.official.layout import convert_official_state_dict
from soft_mm.ops.compat import HAS_SAFE_GLOBALS


def assert_state_dict_equal(actual: dict, expected: dict, skip: tuple[str, ...] = ()) -> None:
    expected = {k: v for k, v in expected.items() if k not in skip}
    assert set(actual) == set(expected)
    for key, tensor in expected.items():
        torch.testing.assert_close(actual[key], tensor, rtol=0, atol=0, msg=key)


@pytest.fixture(scope='module')
def official_file(tmp_path_factory, official_tiny):
    """The authors' tiny release as timm's train script writes it: weights, EMA weights (different) and args."""
    path = tmp_path_factory.mktemp('official') / 'soft_tiny_official.pth.tar'
    ema = {k: v + 0.5 if v.is_floating_point() else v for k, v in official_tiny.items()}
    torch.save({'state_dict': official_tiny, 'state_dict_ema': ema, 'epoch': 299,
                'args': argparse.Namespace(model='soft_tiny')}, path)
    return path, official_tiny, ema


@pytest.fixture(scope='module')
def converted_tiny(official_tiny):
    converted, arch, _ = convert_official_state_dict(official_tiny)
    assert arch == 'tiny'
    return converted


# ---------------------------------------------------------------------------------------------------------------------
# timm


def test_pretrained_without_a_file_says_how(official_file):
    with pytest.raises(ValueError, match=r'pretrained=True: no soft_norm_small weights are hosted; .*'
                                         r'pretrained_cfg_overlay=dict\(file=path\)'):
        timm.create_model('soft_norm_small', pretrained=True)


def test_pretrained_with_a_missing_file_says_so_in_one_sentence(tmp_path):
    """timm raised a FileNotFoundError with no message."""
    missing = tmp_path / 'missing.pth'
    with pytest.raises(FileNotFoundError) as error:
        timm.create_model('soft_norm_small', pretrained=True, pretrained_cfg_overlay=dict(file=str(missing)))
    assert str(error.value) == (f"{missing} not found (the file of pretrained_cfg_overlay): pass the path of an "
                                "existing checkpoint file (the authors' release or a soft_mm checkpoint).")
    with pytest.raises(FileNotFoundError, match=rf'^{tmp_path} is a folder, not a checkpoint file \(the file of '
                                                r'pretrained_cfg\): pass the path'):
        timm.create_model('soft_tiny', pretrained=True, pretrained_cfg=dict(file=str(tmp_path)))


def test_pretrained_overlay_file_converts_the_authors_release(official_file):
    path, _, ema = official_file
    model = timm.create_model('soft_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    # timm reads the EMA weights of a file that has them; the filter converts them exactly
    assert_state_dict_equal(model.state_dict(), convert_official_state_dict(ema)[0])


def test_checkpoint_path_converts_the_authors_release(official_file):
    path, official, _ = official_file
    bare = path.with_name('bare.pth')
    torch.save(official, bare)  # a bare state dict (no EMA): exactly the converter's output
    model = timm.create_model('soft_norm_tiny', checkpoint_path=str(bare))
    assert model.soft_norm
    assert_state_dict_equal(model.state_dict(), convert_official_state_dict(official)[0])


def test_pretrained_adapts_the_head_and_the_stem(official_file):
    path, _, ema = official_file
    converted = convert_official_state_dict(ema)[0]
    model = timm.create_model('soft_tiny', pretrained=True, num_classes=7, in_chans=1,
                              pretrained_cfg_overlay=dict(file=str(path)))
    assert model.head.out_features == 7
    stem = model.stages[0].downsample[0].conv.weight
    torch.testing.assert_close(stem, converted['stages.0.downsample.0.conv.weight'].sum(1, keepdim=True))
    torch.testing.assert_close(model.stages[3].pos_embed, converted['stages.3.pos_embed'], rtol=0, atol=0)


def test_pretrained_soft_mm_checkpoints(tmp_path, converted_tiny):
    """A saved soft_mm state dict and a converted file (state_dict + meta) load unchanged."""
    source = timm.create_model('soft_norm_tiny')
    saved = tmp_path / 'soft_norm_tiny.pth'
    torch.save(source.state_dict(), saved)
    model = timm.create_model('soft_norm_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=str(saved)))
    assert_state_dict_equal(model.state_dict(), source.state_dict())
    converted_file = tmp_path / 'soft_tiny_converted.pth'
    save_converted_checkpoint(converted_file, converted_tiny, make_meta('tiny', soft_norm=False))
    model = timm.create_model('soft_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=str(converted_file)))
    assert_state_dict_equal(model.state_dict(), converted_tiny)


def test_pretrained_of_another_arch_is_refused(official_file):
    path, _, _ = official_file
    with pytest.raises(ValueError, match=r'does not have the layout of the arch: depths \(1, 2, 3, 2\) '
                                         r'\(arch: \(1, 3, 7, 4\)\)'):
        timm.create_model('soft_small', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))


def test_pretrained_outputs_match_the_converted_model_in_float64(official_file, converted_tiny):
    path, official, _ = official_file
    bare = path.with_name('bare64.pth')
    torch.save(official, bare)
    model = timm.create_model('soft_tiny', checkpoint_path=str(bare)).double().eval()
    reference = SoftVisionTransformer('tiny').double().eval()
    reference.load_state_dict(converted_tiny, strict=True)
    images = torch.randn(1, 3, 64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(images), reference(images), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------------
# The mm backbone's init_cfg


def test_backbone_init_cfg_takes_the_authors_file(official_file, converted_tiny):
    # timm's checkpoint reading wraps torch.load in safe_globals([argparse.Namespace]), whose exit removes Namespace
    # from the allow-list that `import soft_mm` registered (torch 2.14); loading into a SOFT model registers it again.
    # torch < 2.4 has no allow-list: there timm's checkpoint_path reader refuses the file (pretrained_cfg_overlay's
    # file is read by soft_mm instead, tested above)
    if HAS_SAFE_GLOBALS:
        timm.create_model('soft_norm_tiny', checkpoint_path=str(official_file[0]))
    path, _, _ = official_file
    backbone = SOFT('tiny', soft_norm=True, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    backbone.init_weights()  # mmengine reads 'state_dict' (not the EMA weights) and loads non-strictly
    assert_state_dict_equal(backbone.state_dict(), converted_tiny, skip=CLASSIFIER_ONLY_KEYS)


# ---------------------------------------------------------------------------------------------------------------------
# The layout version


def test_state_dict_carries_the_layout_version():
    assert SoftPyramid._version == 1
    for model in (SOFT('tiny'), SoftVisionTransformer('tiny', num_classes=0)):
        assert model.state_dict()._metadata['']['version'] == SoftPyramid._version


def test_authors_layout_is_migrated_under_a_prefix(official_tiny, converted_tiny):
    """A detector-like parent whose checkpoint holds the authors' keys under ``backbone.``: the backbone's
    ``_load_from_state_dict`` renames them with its own arch before its children read them."""
    parent = nn.Module()
    parent.backbone = SOFT('tiny')
    parent.neck = nn.Linear(2, 2)
    state_dict = OrderedDict({f'backbone.{k}': v for k, v in official_tiny.items() if k not in
                              ('cls_token', 'head.weight', 'head.bias')})
    state_dict.update({f'neck.{k}': v for k, v in parent.neck.state_dict().items()})
    state_dict._metadata = {'': {'version': 1}, 'backbone': {'version': 1}}  # version 1 saved, authors' keys
    result = parent.load_state_dict(state_dict, strict=False)
    assert result.missing_keys == [] and result.unexpected_keys == ['backbone.cls_pos_embed']
    assert_state_dict_equal(parent.backbone.state_dict(), converted_tiny, skip=CLASSIFIER_ONLY_KEYS)


def test_soft_mm_layout_loads_unchanged_with_or_without_metadata(converted_tiny):
    source = SoftVisionTransformer('tiny')
    source.load_state_dict(converted_tiny)
    saved = source.state_dict()
    for state_dict in (saved, dict(saved)):  # version 1 in the metadata; no metadata (timm's clean_state_dict)
        model = SoftVisionTransformer('tiny')
        model.load_state_dict(state_dict, strict=True)
        assert_state_dict_equal(model.state_dict(), converted_tiny)


@pytest.mark.parametrize('cls', [SOFT, SoftVisionTransformer])
def test_newer_layout_version_is_refused(cls):
    model = cls('tiny')
    state_dict = model.state_dict()
    state_dict._metadata[''] = {'version': SoftPyramid._version + 1}
    with pytest.raises(ValueError, match=r"the state dict under 'the top level' has the SOFT layout version 2, newer "
                                         r'than this soft_mm reads \(1\): update soft_mm'):
        cls('tiny').load_state_dict(state_dict)
