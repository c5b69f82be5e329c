"""model-index.yml and configs/metafiles/*.yml (openmim's model zoo of soft_mm) against the configs they describe."""
from __future__ import annotations

import copy
import functools
import inspect
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from helpers.repo import ROOT
from mmengine.config import Config

import soft_mm
from soft_mm.models.arch import ARCH_SETTINGS, variant_name

METAFILES = ROOT / 'configs' / 'metafiles'
# configs that build no SOFT backbone, so the SOFT zoo does not list them
EXCLUDED = {
    'configs/peers/retinanet_r18_dense_demo.py': "mmdet's ResNet-18 baseline of the dense demo, not a SOFT backbone",
    'configs/peers/retinanet_swin-t_dense_demo.py': "mmdet's Swin-T baseline of the dense demo, not a SOFT backbone",
}
# the ImageNet checkpoints the authors released (fudan-zvg/SOFT): (arch, soft_norm)
RELEASED = {('tiny', False), ('tiny', True), ('small', True), ('medium', True), ('large', True)}
CONVERTER = 'tools/model_converters/convert_official_checkpoint.py'
BACKBONE_KEYS = ('Backbone', 'Backbone Model', 'Backbone Arch', 'SOFT-Norm')


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _metafiles() -> list[Path]:
    return sorted(METAFILES.glob('*.yml'))


def _entries() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(metafile name, model entry, its collection) for every model of every metafile."""
    entries = []
    for path in _metafiles():
        data = _load(path)
        collections = {c['Name']: c for c in data.get('Collections', [])}
        entries += [(path.name, model, collections[model['In Collection']]) for model in data['Models']]
    return entries


ENTRIES = _entries()
IDS = [model['Name'] for _, model, _ in ENTRIES]


def _configs() -> set[str]:
    """Every config a user can train: configs/**/*.py outside configs/_base_ and configs/metafiles."""
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / 'configs').rglob('*.py')
            if '_base_' not in p.relative_to(ROOT / 'configs').parts}


@functools.cache
def _config(relative: str) -> Config:
    """The config, parsed once per session (callers must not modify it)."""
    return Config.fromfile(ROOT / relative)


def _display(arch: str, soft_norm: bool) -> str:
    return f"SOFT{'-Norm' if soft_norm else ''}-{arch.capitalize()}"


def built_backbone(cfg: Config) -> dict[str, Any]:
    """The backbone the config builds, in the metafile's terms, read from the config (nothing is built)."""
    model = cfg.model
    if 'backbone' in model:  # mmdet / mmseg: the registered SOFT backbone
        backbone = model.backbone
        soft_norm = backbone.get('soft_norm', inspect.signature(soft_mm.SOFT).parameters['soft_norm'].default)
        arch = backbone.get('arch')
        assert isinstance(arch, str) and arch in ARCH_SETTINGS, f'backbone arch {arch!r} is not a table variant'
        return {'Backbone': _display(arch, soft_norm), 'Backbone Model': backbone.type, 'Backbone Arch': arch,
                'SOFT-Norm': soft_norm}
    # mmpretrain: a TimmClassifier around one of soft_mm's timm models
    names = {variant_name(arch, norm): (arch, norm) for arch in ARCH_SETTINGS for norm in (False, True)}
    assert model.get('model_name') in names, f'{model.get("type")} builds {model.get("model_name")!r}, no SOFT variant'
    arch, soft_norm = names[model.model_name]
    return {'Backbone': _display(arch, soft_norm), 'Backbone Model': model.model_name, 'Backbone Arch': arch,
            'SOFT-Norm': soft_norm}


def test_model_index_imports_every_metafile() -> None:
    imported = _load(ROOT / 'model-index.yml')['Import']
    assert sorted(imported) == [p.relative_to(ROOT).as_posix() for p in _metafiles()]
    assert len(imported) == 4  # RetinaNet COCO, Mask R-CNN COCO, UperNet ADE20K, ImageNet classification


def test_every_config_is_in_exactly_one_metafile_or_excluded() -> None:
    listed = [model['Config'] for _, model, _ in ENTRIES]
    duplicated = sorted({c for c in listed if listed.count(c) > 1})
    assert not duplicated, f'configs listed more than once: {duplicated}'
    assert not set(listed) & set(EXCLUDED), 'a config is both listed and excluded'
    configs = _configs()
    assert sorted(configs - set(listed) - set(EXCLUDED)) == [], 'configs in no metafile (add them or exclude them)'
    assert sorted(set(listed) - configs) == [], 'metafile entries whose config does not exist'
    assert sorted(set(EXCLUDED) - configs) == [], 'excluded configs that do not exist'


def test_names_are_the_config_file_names_and_unique() -> None:
    """`mim search soft_mm --config NAME` and `mim train soft_mm NAME.py` name the same thing, and mim, which finds a
    config by its file name anywhere under soft_mm/.mim, finds exactly one."""
    for _, model, _ in ENTRIES:
        assert model['Name'] == Path(model['Config']).stem
    names = [p.name for p in (ROOT / 'configs').rglob('*.py')]
    assert sorted({n for n in names if names.count(n) > 1}) == []


@pytest.mark.parametrize('entry', ENTRIES, ids=IDS)
def test_stated_backbone_is_what_the_config_builds(entry: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
    _, model, _ = entry
    cfg = _config(model['Config'])
    stated = {key: model['Metadata'][key] for key in BACKBONE_KEYS}
    assert stated == built_backbone(cfg)


def test_backbone_reader_sees_plain_and_norm() -> None:
    """built_backbone is not a constant: it tells plain SOFT from SOFT-Norm in both kinds of config."""
    plain = built_backbone(_config('configs/soft_small_in1k.py'))
    norm = built_backbone(_config('configs/retinanet_soft_small_coco.py'))
    assert (plain['Backbone'], plain['SOFT-Norm']) == ('SOFT-Small', False)
    assert (norm['Backbone'], norm['SOFT-Norm'], norm['Backbone Model']) == ('SOFT-Norm-Small', True, 'SOFT')
    cfg = Config.fromfile(ROOT / 'configs/retinanet_soft_small_coco.py')
    cfg.model.backbone.soft_norm = False
    assert built_backbone(cfg)['Backbone'] == 'SOFT-Small'


def _is_demo(model: dict[str, Any]) -> bool:
    return model['Name'].endswith('_demo')


def _is_drop_in(model: dict[str, Any]) -> bool:
    return model['Config'].startswith('configs/drop_in/')


@pytest.mark.parametrize('entry', ENTRIES, ids=IDS)
def test_results_and_paper(entry: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
    """Published setups carry the published results and cite the paper; demos (trained here on synthetic data) and
    drop-ins (upstream recipes with SOFT swapped in) claim none."""
    _, model, collection = entry
    assert model['Metadata'].get('Demo', False) is _is_demo(model)
    if _is_demo(model) or _is_drop_in(model):
        assert 'Results' not in model
        return
    assert model['Results'] and all(set(r) == {'Task', 'Dataset', 'Metrics'} for r in model['Results'])
    paper = model.get('Paper', collection.get('Paper'))
    assert paper['URL'] in ('https://arxiv.org/abs/2110.11945', 'https://arxiv.org/abs/2207.03341')
    # plain SOFT is the NeurIPS 2021 model; SOFT-Norm (every downstream result) is the IJCV 2024 one
    assert paper['URL'].endswith('2207.03341' if model['Metadata']['SOFT-Norm'] else '2110.11945')


IMAGENET = [(m, c) for name, m, c in ENTRIES if name == 'soft_imagenet.yml' and not _is_demo(m)]


@pytest.mark.parametrize('model', [m for m, _ in IMAGENET], ids=[m['Name'] for m, _ in IMAGENET])
def test_imagenet_published_figures(model: dict[str, Any]) -> None:
    """The metafile is the one home of the published figures: each classifier states its exact parameter count (that
    of the timm model its config builds), the paper's truncated millions of it, the GFLOPs its plain / Norm twin
    states, and one ImageNet top-1."""
    meta = model['Metadata']
    assert meta['Parameters (millions)'] == int(meta['Parameters'] / 1e6)  # the paper truncates: 45.8M -> 45M
    twin = next(m['Metadata'] for m, _ in IMAGENET if m['Metadata']['Backbone Arch'] == meta['Backbone Arch']
                and m['Metadata']['SOFT-Norm'] is not meta['SOFT-Norm'])
    for key in ('Parameters', 'Parameters (millions)', 'FLOPs (billions)'):
        assert meta[key] == twin[key], key  # plain and Norm have the same tensors and cost
    [result] = model['Results']
    assert result['Dataset'] == 'ImageNet-1k'
    assert isinstance(result['Metrics']['Top 1 Accuracy'], float)
    import timm

    with torch.device('meta'):  # the exact count of the model the config builds, without allocating it
        built = timm.create_model(meta['Backbone Model'], num_classes=1000)
    assert sum(p.numel() for p in built.parameters()) == meta['Parameters']


DENSE = [m for name, m, _ in ENTRIES if name != 'soft_imagenet.yml' and 'Parameters (millions)' in m['Metadata']]


@pytest.mark.parametrize('model', DENSE, ids=[m['Name'] for m in DENSE])
def test_dense_parameters_match_the_built_model(model: dict[str, Any]) -> None:
    """The published parameter counts (whole millions, rounded either way: medium RetinaNet builds 55.54M against a
    published 55M) are those of the detector / segmentor the config builds."""
    import mmdet.registry
    import mmseg.registry
    from mmengine.registry import init_default_scope

    cfg = _config(model['Config'])
    init_default_scope(cfg.default_scope)
    registry = {'mmdet': mmdet.registry.MODELS, 'mmseg': mmseg.registry.MODELS}[cfg.default_scope]
    with torch.device('meta'):
        built = registry.build(copy.deepcopy(cfg.model))
    assert abs(sum(p.numel() for p in built.parameters()) / 1e6 - model['Metadata']['Parameters (millions)']) < 1


def _converter_args(command: str) -> tuple[str, str, bool]:
    words = shlex.split(command)
    assert words[:2] == ['python', CONVERTER] and (ROOT / CONVERTER).is_file()
    assert len(words) in (4, 5) and words[4:] in ([], ['--soft-norm']), command
    return words[2], words[3], words[4:] == ['--soft-norm']


@pytest.mark.parametrize('entry', ENTRIES, ids=IDS)
def test_weights_are_the_converter_command(entry: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
    """ImageNet entries with a released checkpoint give the command that converts it as their weights; detection and
    segmentation entries (no released weights) give the one that writes the checkpoint their backbone starts from."""
    metafile, model, _ = entry
    meta = model['Metadata']
    arch, soft_norm = meta['Backbone Arch'], meta['SOFT-Norm']
    variant = variant_name(arch, soft_norm)
    if _is_demo(model):
        assert 'Weights' not in model and 'Backbone Weights' not in meta
        return
    if metafile != 'soft_imagenet.yml':
        assert 'Weights' not in model
        source, target, norm_flag = _converter_args(meta['Backbone Weights'])
        assert target == _config(model['Config']).model.backbone.init_cfg.checkpoint
    else:
        assert 'Backbone Weights' not in meta
        assert ('Weights' in model) is ((arch, soft_norm) in RELEASED)
        if 'Weights' not in model:
            return
        source, target, norm_flag = _converter_args(model['Weights'])
    assert (source, target, norm_flag) == (f'{variant}.pth', f'checkpoints/{variant}_in1k.pth', soft_norm)


def test_mim_reads_every_entry() -> None:
    """openmim's own reader (modelindex + mim search's table) sees every metafile entry with its backbone."""
    pytest.importorskip('mim', reason='openmim is not installed (tools/install.sh installs it)')
    from mim.commands.search import convert2df
    from modelindex.load_model_index import load

    table = convert2df(load(str(ROOT / 'model-index.yml')))
    assert sorted(table.index) == sorted(IDS)
    # `mim search --field F` lower-cases F: a column with a capital letter (a unit such as '(M)') cannot be selected
    assert [column for column in table.columns if column != column.lower()] == []
    assert table.loc['retinanet_soft_small_coco', 'backbone'] == 'soft-norm-small'  # mim lower-cases strings
    assert bool(table.loc['soft_small_in1k', 'soft-norm']) is False
    assert bool(table.loc['soft_norm_small_in1k', 'soft-norm']) is True
    assert table.loc['retinanet_soft_small_coco', 'coco/box_ap'] == 42.8
