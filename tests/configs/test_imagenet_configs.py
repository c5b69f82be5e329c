"""The ImageNet classification configs (mmpretrain): the install, the authors' recipe on mmpretrain's own bases, the
exact parameter counts of the ten classifiers, the weight-decay groups, and strict loading of converted checkpoints."""
from __future__ import annotations

import importlib.metadata

import pytest
import torch

pytest.importorskip('mmpretrain')
from helpers.model_checks import VARIANTS
from helpers.repo import CONFIGS
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope

# Parameters of the 1000-class classifiers, as the ImageNet metafile states them (counted from the authors' model
# definitions, small with the published depths 1,3,7,4); plain and SOFT-Norm have the same tensors.
PARAMS = {variant.name: variant.num_params for variant in VARIANTS.values()}
NAMES = list(PARAMS)


def _config(name: str) -> Config:
    return Config.fromfile(str(CONFIGS / f'{name}_in1k.py'))


def _build(cfg: Config, device: str = 'meta') -> torch.nn.Module:
    from mmpretrain.registry import MODELS

    init_default_scope('mmpretrain')
    with torch.device(device):
        return MODELS.build(cfg.model)


def test_mmpretrain_imports_with_its_models():
    import mmpretrain
    import mmpretrain.models  # crashes with transformers >= 4.56 next to pycocotools (its multimodal models)

    assert mmpretrain.__version__ == '1.2.0'
    assert 'TimmClassifier' in mmpretrain.models.__dict__
    try:
        version = importlib.metadata.version('transformers')
    except importlib.metadata.PackageNotFoundError:
        return
    major, minor = (int(v) for v in version.split('.')[:2])
    assert (major, minor) < (4, 56), f'transformers {version} breaks `import mmpretrain`; pin it below 4.56'


@pytest.mark.parametrize('name', NAMES)
def test_config_builds_the_published_classifier(name):
    cfg = _config(name)
    model = _build(cfg)
    assert type(model).__name__ == 'SoftTimmClassifier'
    assert type(model.model).__name__ == 'SoftVisionTransformer'
    assert model.model.soft_norm == ('norm' in name)
    assert sum(p.numel() for p in model.parameters()) == PARAMS[name]


def test_base_inherits_mmpretrain_and_sets_the_authors_recipe():
    text = (CONFIGS / '_base_/soft_in1k.py').read_text()
    for base in ('datasets/imagenet_bs64_swin_224.py', 'schedules/imagenet_bs1024_adamw_swin.py', 'default_runtime.py'):
        assert f"'mmpretrain::_base_/{base}'" in text
    cfg = _config('soft_norm_small')
    assert cfg.default_scope == 'mmpretrain'
    assert cfg.model.num_classes == cfg.data_preprocessor.num_classes == 1000
    dataset = cfg.train_dataloader.dataset
    assert (dataset.type, dataset.data_root, dataset.split, dataset.get('ann_file')) == (
        'ImageNet', 'data/imagenet', 'train', None)
    assert cfg.val_dataloader.dataset.split == 'val'
    train = {t.type: t for t in dataset.pipeline}
    assert (train['RandomResizedCrop'].scale, train['RandomResizedCrop'].interpolation) == (224, 'bicubic')
    rand_augment = train['RandAugment']
    assert (rand_augment.policies, rand_augment.num_policies, rand_augment.total_level, rand_augment.magnitude_level,
            rand_augment.magnitude_std) == ('timm_increasing', 2, 10, 9, 0.5)
    assert train['RandomErasing'].erase_prob == 0.25
    test = {t.type: t for t in cfg.test_dataloader.dataset.pipeline}
    assert (test['ResizeEdge'].scale, test['ResizeEdge'].edge, test['CenterCrop'].crop_size) == (256, 'short', 224)
    assert tuple(cfg.val_evaluator.topk) == (1, 5)
    assert [(a.type, a.alpha) for a in cfg.model.train_cfg.augments] == [('Mixup', 0.8), ('CutMix', 1.0)]
    assert (cfg.model.loss.type, cfg.model.loss.label_smooth_val) == ('LabelSmoothLoss', 0.1)
    assert cfg.model.drop_path_rate == 0.1
    assert cfg.train_cfg.max_epochs == 300
    optimizer = cfg.optim_wrapper.optimizer
    assert (optimizer.type, optimizer.lr, optimizer.weight_decay) == ('AdamW', 1e-3, 0.05)
    assert cfg.optim_wrapper.clip_grad.max_norm == 1.0
    assert (cfg.auto_scale_lr.base_batch_size, cfg.auto_scale_lr.enable) == (1024, True)
    warmup, cosine = cfg.param_scheduler
    assert (warmup.type, warmup.start_factor * optimizer.lr, warmup.end) == ('LinearLR', 1e-6, 10)
    assert (cosine.type, cosine.begin, cosine.end) == ('CosineAnnealingLR', 10, 300)
    assert cosine.eta_min_ratio * optimizer.lr == pytest.approx(5e-5)
    assert [(h.type, h.get('momentum')) for h in cfg.custom_hooks] == [('EMAHook', 4e-5), ('InvalidLossHook', None)]
    assert cfg.default_hooks.checkpoint.type == 'AtomicCheckpointHook'


def test_no_weight_decay_on_norms_biases_position_embeddings_and_cls_token():
    cfg = _config('soft_norm_tiny')
    model = _build(cfg, device='cpu')
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay = {names[id(p)] for group in wrapper.optimizer.param_groups if group['weight_decay'] == 0
                for p in group['params']}
    norms = {f'{n}.{p}' for n, m in model.named_modules()
             if isinstance(m, (torch.nn.LayerNorm, torch.nn.BatchNorm2d)) for p, _ in m.named_parameters()}
    expected = ({n for n in names.values() if n.endswith('.bias') or 'pos_embed' in n or 'cls_token' in n}
                | norms)
    assert 'model.cls_pos_embed' in expected and 'model.stages.2.pos_embed' in expected
    assert no_decay == expected
    decay = {names[id(p)] for group in wrapper.optimizer.param_groups if group['weight_decay'] == 0.05
             for p in group['params']}
    assert decay == set(names.values()) - expected
    assert wrapper.clip_grad_kwargs == {'max_norm': 1.0}


@pytest.mark.parametrize('name', ['soft_tiny', 'soft_norm_tiny'])
def test_converted_authors_checkpoint_loads_strictly(name, tmp_path, official_tiny):
    """The authors' layout -> tools/model_converters/convert_official_checkpoint.py -> strict load into the config's
    classifier, and the classifier's state dict is the file's (the same keys as the timm model: no wrapper prefix)."""
    from soft_mm.models.checkpoint_conversion import load_converted_checkpoint, make_meta, save_converted_checkpoint
    from soft_mm.models.official.layout import convert_official_state_dict

    official = official_tiny
    converted, arch, unmapped = convert_official_state_dict(official)
    assert (arch, unmapped) == ('tiny', [])
    path = tmp_path / f'{name}_in1k.pth'
    save_converted_checkpoint(path, converted, make_meta(arch, 'norm' in name))
    state_dict, _ = load_converted_checkpoint(path)
    model = _build(_config(name), device='cpu')
    model.load_state_dict(state_dict, strict=True)
    reloaded = model.state_dict()
    assert set(reloaded) == set(state_dict)
    assert all(torch.equal(reloaded[k], v) for k, v in state_dict.items())

