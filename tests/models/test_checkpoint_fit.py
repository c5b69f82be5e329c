"""soft_mm/models/checkpoint_fit.py through the mm backbone's ``init_weights()`` (what mmdet's and mmseg's own tools
call after ``MODELS.build``): a checkpoint whose backbone tensors are another variant's is refused in one sentence
naming what the file holds and what was built; an ImageNet classifier's file (head and extra keys), a detector's
under its prefix and the authors' layout keep loading; ``partial_pretrained=True`` loads what fits, keeps the default
initialisation for the rest and says how many of each."""
from __future__ import annotations

import re
import warnings

import pytest
import torch

from soft_mm.models import SOFT, SoftVisionTransformer
from soft_mm.models.checkpoint_fit import check_backbone_checkpoint, describe_backbone
from soft_mm.utils.checkpoint import CheckpointFileError

ADVICE = ('pass a checkpoint of the built backbone, or set partial_pretrained=True on the backbone to load only the '
          'tensors that fit and keep the default initialisation for the rest (docs/user_guides/checkpoints.md).')
TINY = "SOFT arch 'tiny' (embed_dims (64, 128, 320, 512), depths (1, 2, 3, 2))"


def _save(path, state_dict) -> str:
    torch.save({'state_dict': state_dict, 'meta': {'epoch': 300}}, path)
    return str(path)


def _backbone(checkpoint: str, seed: int = 0, **kwargs) -> SOFT:
    torch.manual_seed(seed)
    return SOFT(init_cfg=dict(type='Pretrained', checkpoint=checkpoint), **{'arch': 'tiny', **kwargs})


def _unchanged(model: SOFT, before: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(value, before[key]) for key, value in model.state_dict().items())


@pytest.fixture(scope='module')
def tiny_classifier() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    return SoftVisionTransformer('tiny', num_classes=10).state_dict()


def test_another_variants_checkpoint_is_refused_naming_what_it_holds_and_what_was_built(tmp_path):
    """The issue's case: SOFT-Norm-Medium's ImageNet weights as the Tiny backbone's init_cfg."""
    torch.manual_seed(2)
    medium = _save(tmp_path / 'soft_norm_medium_in1k.pth', SoftVisionTransformer('medium', soft_norm=True).state_dict())
    model = _backbone(medium, soft_norm=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointFileError) as error:
        model.init_weights()
    assert str(error.value) == (
        f"{medium} holds the backbone of SOFT arch 'medium' (embed_dims (64, 128, 288, 512), depths (1, 3, 29, 5)), "
        f'which does not fit the one built here, {TINY}: of its 706 backbone tensors 53 of another shape (e.g. '
        'stages.2.blocks.0.attn.proj.bias (288,) in the file, (320,) built), 528 with no place in the backbone (e.g. '
        f"stages.1.blocks.2.attn.landmark_conv.weight): build arch='medium' to use it, {ADVICE}")
    assert _unchanged(model, before)  # refused before anything was copied


def test_a_smaller_variants_checkpoint_is_refused_too(tmp_path, tiny_classifier):
    """Tiny weights into Small: every tensor of the file has its place and shape, but Small's extra blocks would
    start from scratch."""
    path = _save(tmp_path / 'tiny.pth', tiny_classifier)
    with pytest.raises(CheckpointFileError, match=re.escape(
            f"holds the backbone of {TINY}, which does not fit the one built here, SOFT arch 'small' (embed_dims (64, "
            "128, 320, 512), depths (1, 3, 7, 4)): of its 178 backbone tensors 118 missing from the file (e.g. "
            "stages.1.blocks.2.attn.landmark_conv.weight): build arch='tiny' to use it, ")):
        _backbone(path, arch='small').init_weights()


@pytest.mark.parametrize(('kwargs', 'built', 'differs'), [
    ({'in_channels': 4}, "SOFT arch 'tiny' (embed_dims (64, 128, 320, 512), depths (1, 2, 3, 2), 4 input channels)",
     '1 of another shape (e.g. stages.0.downsample.0.conv.weight (32, 3, 3, 3) in the file, (32, 4, 3, 3) built)'),
    ({'landmark_mode': 'avg'}, "SOFT arch 'tiny' (embed_dims (64, 128, 320, 512), depths (1, 2, 3, 2), landmark_mode "
     "'avg')", '18 with no place in the backbone (e.g. stages.0.blocks.0.attn.landmark_conv.weight)'),
    ({'arch': {**SoftVisionTransformer('tiny').arch_settings, 'landmark_strides': (4, 4, 2)}},
     'a custom SOFT arch (embed_dims (64, 128, 320, 512), depths (1, 2, 3, 2))',
     '1 of another shape (e.g. stages.0.blocks.0.attn.landmark_conv.weight (32, 32, 8, 8) in the file, (32, 32, 4, 4) '
     "built): build arch='tiny' to use it,"),  # the file is a table arch, the built one is not
])
def test_the_same_variant_built_otherwise_is_refused_with_the_tensor_that_differs(tmp_path, tiny_classifier, kwargs,
                                                                                  built, differs):
    path = _save(tmp_path / 'tiny.pth', tiny_classifier)
    with pytest.raises(CheckpointFileError) as error:
        _backbone(path, **kwargs).init_weights()
    separator = ' ' if differs.endswith(',') else ': '
    assert str(error.value) == (f'{path} holds the backbone of {TINY}, which does not fit the one built here, {built}: '
                                f'of its 178 backbone tensors {differs}{separator}{ADVICE}')


@pytest.mark.parametrize(('kwargs', 'kept', 'message'), [
    ({'in_channels': 4}, {'stages.0.downsample.0.conv.weight'},
     "loaded 177 of the backbone's 178 tensors and kept the default initialisation for 1; of the file's 178 backbone "
     'tensors 1 of another shape (e.g. stages.0.downsample.0.conv.weight (32, 3, 3, 3) in the file, (32, 4, 3, 3) '
     'built)'),
    ({'landmark_mode': 'avg'}, set(),
     "loaded 160 of the backbone's 160 tensors and kept the default initialisation for 0; of the file's 178 backbone "
     'tensors 18 with no place in the backbone (e.g. stages.0.blocks.0.attn.landmark_conv.weight)'),
    ({'arch': 'small'}, None,
     "loaded 178 of the backbone's 296 tensors and kept the default initialisation for 118; of the file's 178 backbone "
     'tensors 118 missing from the file (e.g. stages.1.blocks.2.attn.landmark_conv.weight)'),
])
def test_partial_pretrained_loads_what_fits_and_keeps_the_default_for_the_rest(tmp_path, tiny_classifier, kwargs, kept,
                                                                               message):
    path = _save(tmp_path / 'tiny.pth', tiny_classifier)
    model = _backbone(path, partial_pretrained=True, **kwargs)
    default = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        model.init_weights()
    assert [str(w.message) for w in caught if 'partial_pretrained' in str(w.message)] == [
        f'{path}: partial_pretrained=True {message}']
    for key, value in model.state_dict().items():
        fits = key in tiny_classifier and tiny_classifier[key].shape == value.shape
        assert kept is None or fits == (key not in kept), key
        torch.testing.assert_close(value, tiny_classifier[key] if fits else default[key], rtol=0, atol=0, msg=key)


def test_another_models_file_is_refused_even_partially(tmp_path):
    other = _save(tmp_path / 'resnet.pth', {'conv1.weight': torch.zeros(64, 3, 7, 7), 'fc.weight': torch.zeros(10, 64)})
    for partial in (False, True):
        with pytest.raises(CheckpointFileError, match=rf"^{other} does not fit the SOFT backbone: only 0 of its 184 "
                                                      r"weights are in the file \(its keys start with 'conv1.', 'fc.'\)"
                                                      r': pass a SOFT checkpoint'):
            _backbone(other, partial_pretrained=partial).init_weights()


def test_a_detectors_file_without_its_prefix_is_told_to_add_it(tmp_path, tiny_classifier):
    detector = {f'backbone.{k}': v for k, v in tiny_classifier.items() if not k.startswith(('head', 'cls_'))}
    path = _save(tmp_path / 'retinanet.pth', detector)
    with pytest.raises(CheckpointFileError, match=r"looks like the checkpoint of a whole detector or segmentor: add "
                                                  r"prefix='backbone.' to the init_cfg"):
        _backbone(path).init_weights()
    model = SOFT('tiny', init_cfg=dict(type='Pretrained', checkpoint=path, prefix='backbone.'))
    model.init_weights()
    assert all(torch.equal(v, tiny_classifier[k]) for k, v in model.state_dict().items())


def test_what_keeps_loading(tmp_path, tiny_classifier, official_tiny):
    """An ImageNet classifier's file (cls_token, cls_pos_embed, head: not the backbone's), the authors' file (their
    layout, converted on load) and a file without BatchNorm's counters all fit the built variant."""
    model = SOFT('tiny')
    check_backbone_checkpoint(model, tiny_classifier, 'classifier.pth')
    check_backbone_checkpoint(model, official_tiny, 'soft_tiny_official.pth')
    check_backbone_checkpoint(model, {k: v for k, v in tiny_classifier.items() if 'num_batches_tracked' not in k},
                              'old.pth')
    with pytest.raises(CheckpointFileError, match=r"holds the backbone of SOFT arch 'tiny' .* SOFT arch 'small'"):
        check_backbone_checkpoint(SOFT('small'), official_tiny, 'soft_tiny_official.pth')


def test_the_tools_check_under_the_init_cfgs_prefix(tiny_classifier):
    """What tools/train.py calls before it runs: the file's tensors, the prefix of the init_cfg."""
    detector = {f'backbone.{k}': v for k, v in tiny_classifier.items()}
    SOFT('tiny').check_pretrained(detector, 'retinanet.pth', 'backbone.')
    with pytest.raises(CheckpointFileError, match=r"^retinanet\.pth holds the backbone of SOFT arch 'tiny'"):
        SOFT('tiny', in_channels=1).check_pretrained(detector, 'retinanet.pth', 'backbone.')


def test_describe_backbone_reads_the_variant_off_the_tensors(tiny_classifier):
    assert describe_backbone(tiny_classifier) == TINY
    assert describe_backbone(SOFT('huge', in_channels=1).state_dict()) == (
        "SOFT arch 'huge' (embed_dims (64, 128, 352, 512), depths (1, 5, 49, 5), 1 input channels)")
