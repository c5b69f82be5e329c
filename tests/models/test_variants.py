"""The ten timm classifiers: the arch zoo (soft_mm.models.arch.ARCH_SETTINGS) times plain / SOFT-Norm, each an explicit
entrypoint of soft_mm/models/classifier.py; the variant record of the tests (tests/helpers/model_checks.py), read from
the ImageNet metafile; and every config's channel lists against the zoo."""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import timm
import torch
from helpers.model_checks import VARIANTS, Variant, get_variant, out_channels
from helpers.repo import CONFIGS

from soft_mm.models import ARCH_SETTINGS, SoftVisionTransformer, resolve_arch, variant_name
from soft_mm.models import classifier as classifier_module


def test_record_has_ten_variants_in_table_order():
    assert list(VARIANTS) == [f'soft_{s}' for s in ('tiny', 'small', 'medium', 'large', 'huge')] + [
        f'soft_norm_{s}' for s in ('tiny', 'small', 'medium', 'large', 'huge')]
    norm_small = VARIANTS['soft_norm_small']
    assert (norm_small.arch, norm_small.soft_norm, norm_small.top1, norm_small.num_params) == ('small', True, 82.4,
                                                                                              24_110_092)
    assert VARIANTS['soft_medium'].out_channels == (64, 128, 288, 512) and VARIANTS['soft_medium'].top1 == 82.9
    assert VARIANTS['soft_norm_huge'].title == 'SOFT-Norm-Huge' and VARIANTS['soft_large'].title == 'SOFT-Large'
    with pytest.raises(dataclasses.FrozenInstanceError):
        norm_small.top1 = 90.0


def test_record_is_the_zoo_times_plain_and_norm():
    assert list(VARIANTS) == [variant_name(arch, soft_norm) for soft_norm in (False, True) for arch in ARCH_SETTINGS]
    for variant in VARIANTS.values():
        assert variant.name == variant_name(variant.arch, variant.soft_norm)
        # plain and Norm of an arch have the same tensors and the same published size and cost
        twin = VARIANTS[variant_name(variant.arch, not variant.soft_norm)]
        assert (twin.num_params, twin.params_m, twin.gflops) == (variant.num_params, variant.params_m, variant.gflops)
        assert resolve_arch(variant.arch)['embed_dims'] == variant.out_channels
        assert variant.params_m == int(variant.num_params / 1e6)  # the paper truncates: 45.8M -> 45M


def test_get_variant_names_the_valid_ones():
    assert get_variant('soft_tiny') is VARIANTS['soft_tiny']
    with pytest.raises(ValueError,
                       match=r"name='soft_base' is not a SOFT variant; valid names: soft_tiny, .*soft_norm_huge"):
        get_variant('soft_base')


def test_timm_lists_exactly_the_record():
    assert sorted(timm.list_models('soft*')) == sorted(VARIANTS)
    assert timm.list_models(module='classifier') == sorted(VARIANTS)
    assert timm.list_pretrained('soft*') == []  # no hosted weights: pretrained=True needs a file


def test_timm_registers_the_zoo_times_plain_and_norm():
    zoo = {variant_name(arch, soft_norm) for arch in ARCH_SETTINGS for soft_norm in (False, True)}
    assert len(zoo) == 10
    assert set(timm.list_models('soft*')) == set(timm.list_models(module='classifier')) == zoo
    assert set(classifier_module.TIMM_MODELS) == zoo


@pytest.mark.parametrize('name', list(VARIANTS))
def test_entrypoint_is_written_out_for_its_variant(name):
    variant = VARIANTS[name]
    entrypoint = getattr(classifier_module, name)  # importable: from soft_mm.models.classifier import soft_tiny
    assert entrypoint is timm.models.model_entrypoint(name)
    assert (entrypoint.__name__, entrypoint.__qualname__, entrypoint.__module__) == (
        name, name, 'soft_mm.models.classifier')
    assert f'@register_model\ndef {name}(' in inspect.getsource(classifier_module)  # a grep finds its definition
    assert variant.title in entrypoint.__doc__
    with torch.device('meta'):
        model = timm.create_model(name)
    assert isinstance(model, SoftVisionTransformer)
    assert model.soft_norm is variant.soft_norm and model.arch_settings == resolve_arch(variant.arch)
    assert model.pretrained_cfg['architecture'] == name
    assert sum(p.numel() for p in model.parameters()) == variant.num_params  # the metafile's exact count


def test_out_channels_of_custom_archs():
    assert out_channels('medium') == [64, 128, 288, 512]
    assert out_channels({'embed_dims': (8, 16, 24, 32), 'num_heads': (1, 2, 3, 4), 'depths': (1, 1, 1, 1)}) == [
        8, 16, 24, 32]
    with pytest.raises(ValueError, match="arch='base'"):
        out_channels('base')


# ---------------------------------------------------------------------------------------------------------------------
# The configs' channel lists
#
# mmengine's python configs cannot import soft_mm to read the arch zoo: an import statement switches
# Config.fromfile to the lazy-import ("new style") parser, where `_base_ = 'mmdet::...'` inheritance is refused (it
# is kept only when `_base_` happens to come first in the file, an accident of mmengine's ast walk). So each config
# states its lists and this test checks every one against the zoo.


def _soft_configs() -> list[Path]:
    """The detection and segmentation configs with SOFT in their name (the classifiers' are ``soft_*_in1k``)."""
    return sorted(p for p in CONFIGS.rglob('*.py') if '_base_' not in p.parts
                  and 'soft' in p.name and not p.name.startswith('soft_'))


def _channel_lists(model: dict) -> list[tuple[str, object, object]]:
    """``(where, stated, zoo)`` for every neck / decode-head / auxiliary-head channel setting of ``model``."""
    backbone = model['backbone']
    channels = out_channels(backbone['arch'])
    channels = [channels[i] for i in backbone.get('out_indices', range(len(channels)))]
    found = []
    for name in ('neck', 'decode_head'):
        head = model.get(name)
        if isinstance(head, dict) and 'in_channels' in head:
            index = head.get('in_index', list(range(len(channels))))
            expected = [channels[i] for i in index] if isinstance(index, (list, tuple)) else channels[index]
            found.append((f'{name}.in_channels', head['in_channels'], expected))
    aux = model.get('auxiliary_head')
    for i, head in enumerate(aux if isinstance(aux, list) else [aux] if aux else []):
        found.append((f'auxiliary_head[{i}].in_channels', head['in_channels'], channels[head['in_index']]))
    return found


def test_the_soft_configs_are_found():
    names = {p.name for p in _soft_configs()}
    assert {'retinanet_soft_tiny_coco.py', 'mask_rcnn_soft_tiny_coco.py', 'retinanet_soft_medium_coco.py',
            'upernet_soft_small_ade20k.py', 'upernet_soft_medium_ade20k.py', 'mask_rcnn_soft_tiny_demo.py',
            'retinanet_soft_tiny_dense_demo.py', 'retinanet_pvt-t_soft_small_coco.py',
            'upernet_swin-t_soft_small_ade20k.py'} <= names


@pytest.mark.parametrize('path', _soft_configs(), ids=lambda p: str(p.relative_to(CONFIGS)))
def test_config_channel_lists_are_the_records(path):
    pytest.importorskip('mmdet')
    pytest.importorskip('mmseg')
    from mmengine.config import Config

    model = Config.fromfile(str(path)).to_dict()['model']
    backbone = model['backbone']
    if backbone.get('type') not in ('SOFT', 'soft_mm.SOFT'):
        pytest.skip(f'{path.name} has no SOFT backbone')
    found = _channel_lists(model)
    assert found, f'{path.name} states no channel list'
    for where, stated, expected in found:
        assert stated == expected, f'{path.name}: {where} = {stated}, the arch zoo says {expected}'


def test_channel_check_can_fail():
    model = {'backbone': {'type': 'SOFT', 'arch': 'medium'}, 'neck': {'in_channels': [64, 128, 320, 512]},
             'auxiliary_head': {'in_channels': 320, 'in_index': 2}}
    assert _channel_lists(model) == [('neck.in_channels', [64, 128, 320, 512], [64, 128, 288, 512]),
                                     ('auxiliary_head[0].in_channels', 320, 288)]
    assert isinstance(VARIANTS['soft_medium'], Variant)
