"""The bad-input matrix: each case either stops with a specific error that names the argument (and the allowed values)
or gives a finite result. Backbone cases need torch, timm and mmengine; whole-detector cases need mmdet.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.op_checks import cpu_float16
from helpers.repo import ROOT

from soft_mm.models import SOFT

RETINANET_DEMO = str(ROOT / 'configs/retinanet_soft_tiny_demo.py')


def _backbone(**kwargs) -> SOFT:
    torch.manual_seed(0)
    model = SOFT(**{'arch': 'tiny', 'landmark_mode': 'avg', 'drop_path_rate': 0.0, **kwargs})
    model.init_weights()  # the weights training starts from
    return model


def _all_finite(tensors) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


# --- construction ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(('kwargs', 'error', 'match'), [
    ({'arch': 'giant'}, ValueError, r"arch='giant' is not a SOFT architecture; valid names: tiny, small, medium"),
    ({'arch': 3}, TypeError, r'arch must be a name \(tiny, small'),
    ({'landmark_mode': 'random'}, ValueError, r"landmark_mode='random' is not one of \('conv', 'avg'\)"),
    ({'arch': {'embed_dims': [64, 128, 320, 512], 'num_heads': [1, 2, 5, 7], 'depths': [1, 1, 1, 1]}}, ValueError,
     r'embed_dims and num_heads are inconsistent.*\(512, 7\)'),
    ({'arch': {'embed_dims': [64, 128, 320], 'num_heads': [1, 2, 5], 'depths': [1, 1, 1]}}, ValueError,
     r"arch\['embed_dims'\] must be a sequence of 4 ints"),
    ({'arch': {'embed_dims': [64, 128, 320, 512], 'num_heads': [1, 2, 5, 8]}}, ValueError,
     r'arch dict is missing the keys .*depths'),
    ({'arch': {'embed_dims': [64, 128, 320, 512], 'num_heads': [1, 2, 5, 8], 'depths': [1, 1, 1, 1], 'dpeth': 1}},
     ValueError, r'arch dict has unknown keys .*dpeth.*allowed keys: embed_dims'),
    ({'arch': {'embed_dims': [64, 128, 320, 512], 'num_heads': [1, 2, 5, 8], 'depths': [1, 0, 1, 1]}}, ValueError,
     r"arch\['depths'\] must hold positive ints"),
    ({'out_indices': (0, 4)}, ValueError, r'out_indices must be a non-empty sequence of stage indices in 0..3'),
    ({'out_indices': ()}, ValueError, r'out_indices must be a non-empty sequence'),
    ({'frozen_stages': 5}, ValueError, r'frozen_stages must be an int in -1..4, got 5'),
    ({'frozen_stages': -2}, ValueError, r'frozen_stages must be an int in -1..4, got -2'),
])
def test_bad_settings_name_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        _backbone(**kwargs)


# --- inputs ---------------------------------------------------------------------------------------------------------

def test_wrong_number_of_dims():
    with pytest.raises(ValueError, match=r'input must be \(B, C, H, W\), got shape \(3, 64, 64\)'):
        _backbone().eval()(torch.randn(3, 64, 64))


def test_wrong_number_of_channels_names_in_channels():
    with pytest.raises(ValueError, match=r'in_channels=3.*got 1'):
        _backbone().eval()(torch.randn(1, 1, 64, 64))


def test_tiny_and_extreme_aspect_inputs_give_finite_maps_of_the_right_size():
    model = _backbone().eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 2, 2))  # smaller than the stride-4 stem: every map is 1x1
        assert [tuple(o.shape) for o in outs] == [(1, 64, 1, 1), (1, 128, 1, 1), (1, 320, 1, 1), (1, 512, 1, 1)]
        assert _all_finite(outs)
        outs = model(torch.randn(1, 3, 8, 2048))
        assert [tuple(o.shape) for o in outs] == [(1, 64, 2, 512), (1, 128, 1, 256), (1, 320, 1, 128),
                                                   (1, 512, 1, 64)]
        assert _all_finite(outs)


def test_batch_of_one_in_training_with_batchnorm():
    model = _backbone().train()
    x = torch.randn(1, 3, 33, 47, requires_grad=True)
    outs = model(x)
    sum((o * torch.randn_like(o)).sum() for o in outs).backward()
    assert [tuple(o.shape[2:]) for o in outs] == [(9, 12), (5, 6), (3, 3), (2, 2)]
    assert _all_finite(outs) and bool(torch.isfinite(x.grad).all())
    # a 1x1 map after the stem leaves BatchNorm one value per channel: torch refuses, as for any BN network
    with pytest.raises(ValueError, match='Expected more than 1 value per channel when training'):
        model(torch.randn(1, 3, 2, 2))


@pytest.mark.parametrize('landmark_mode', ['avg', 'conv'])
def test_all_equal_tokens_singular_kernel_stays_finite(landmark_mode):
    """A constant image makes every token (and landmark) equal: the landmark kernel is all ones (rank 1)."""
    model = _backbone(landmark_mode=landmark_mode).train()
    x = torch.full((2, 3, 64, 64), 0.5, requires_grad=True)
    outs = model(x)
    sum((o * torch.randn_like(o)).sum() for o in outs).backward()
    assert _all_finite(outs) and bool(torch.isfinite(x.grad).all())
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize('scale', [1e4, 1e-6])
def test_very_large_and_small_input_magnitudes(scale):
    model = _backbone().eval()
    torch.manual_seed(1)
    with torch.no_grad():
        outs = model(torch.randn(2, 3, 64, 64) * scale)
    assert _all_finite(outs)


@pytest.mark.parametrize('dtype', [torch.bfloat16, pytest.param(torch.float16, marks=cpu_float16)])
def test_backbone_autocast_forward_backward(dtype):
    model = _backbone().train()
    x = torch.randn(2, 3, 64, 64, requires_grad=True)
    with torch.autocast('cpu', dtype=dtype):
        outs = model(x)
    sum(o.float().square().mean() for o in outs).backward()
    assert _all_finite(outs) and bool(torch.isfinite(x.grad).all())
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)


# --- whole detector (mmdet) -----------------------------------------------------------------------------------------

def _retinanet_and_batch(boxes_per_image: list[int], size: tuple[int, int] = (96, 128)):
    """The demo RetinaNet (SOFT-Norm-Tiny) and a preprocessed training batch with the given numbers of boxes."""
    pytest.importorskip('mmdet')
    from mmdet.registry import MODELS
    from mmdet.structures import DetDataSample
    from mmdet.utils import register_all_modules
    from mmengine.config import Config
    from mmengine.structures import InstanceData

    register_all_modules()
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(RETINANET_DEMO).model).train()
    h, w = size
    inputs, samples = [], []
    for n in boxes_per_image:
        inputs.append(torch.randint(0, 256, (3, h, w), dtype=torch.uint8))
        sample = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0)))
        xy = torch.rand(n, 2) * torch.tensor([w - 40.0, h - 40.0])
        sample.gt_instances = InstanceData(bboxes=torch.cat([xy, xy + 20 + 15 * torch.rand(n, 2)], 1),
                                           labels=torch.randint(0, 3, (n,)))
        samples.append(sample)
    data = model.data_preprocessor({'inputs': inputs, 'data_samples': samples}, training=True)
    return model, data


def _loss_and_grads(model, data) -> tuple[dict, list[torch.Tensor]]:
    losses = model.loss(data['inputs'], data['data_samples'])
    total, _ = model.parse_losses(losses)
    total.backward()
    return losses, [p.grad for p in model.parameters() if p.grad is not None]


def test_detection_batch_with_images_without_ground_truth():
    model, data = _retinanet_and_batch([0, 2, 0])
    losses, grads = _loss_and_grads(model, data)
    assert all(bool(torch.isfinite(sum(v) if isinstance(v, list) else v).all()) for v in losses.values())
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)


def test_detection_batch_of_one_in_training_with_batchnorm():
    model, data = _retinanet_and_batch([3])
    _, grads = _loss_and_grads(model, data)
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)


@pytest.mark.parametrize('dtype', [torch.bfloat16, pytest.param(torch.float16, marks=cpu_float16)])
def test_detector_autocast_loss_forward_backward(dtype):
    """CPU autocast through the whole RetinaNet loss path (backbone, FPN, head, focal and L1 losses).

    The prediction path is not covered: it ends in mmcv's nms, whose CPU kernel has no bfloat16/float16 version.
    """
    model, data = _retinanet_and_batch([2, 1])
    with torch.autocast('cpu', dtype=dtype):
        losses = model.loss(data['inputs'], data['data_samples'])
        total, _ = model.parse_losses(losses)
    total.float().backward()
    assert bool(torch.isfinite(total).all())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)


def test_config_naming_soft_without_custom_imports(tmp_path):
    """The tools stop with the fix; other OpenMMLab tools see a registry KeyError, which the tools also explain."""
    pytest.importorskip('mmdet')  # the demo's bases are mmdet's
    from soft_mm.cli.config_loading import load_config
    from soft_mm.cli.errors import ConfigError, explain

    config = tmp_path / 'retinanet_soft.py'
    config.write_text(f"_base_ = ['{ROOT / 'configs/retinanet_soft_tiny_demo.py'}']\ncustom_imports = None\n")
    with pytest.raises(ConfigError, match=r"uses type='SOFT' but does not import soft_mm: add custom_imports = "
                                          r"dict\(imports=\['soft_mm'\]"):
        load_config(str(config))
    assert 'add custom_imports' in explain(KeyError('SOFT is not in the mmdet::model registry. Please check'))


SOFT_ARGUMENTS = ('arch, soft_norm, in_channels, out_indices, frozen_stages, norm_eval, with_cp, drop_path_rate, '
                  'soft_block_norm, qk_init_std, compile_stages, norm_cfg, init_cfg, partial_pretrained')


@pytest.mark.parametrize(('option', 'sentence'), [
    ('model.backbone.arhc=tiny', "the config's RetinaNet > SOFT: SOFT() got an unexpected keyword argument 'arhc' (did "
     f"you mean 'arch'?): its arguments are {SOFT_ARGUMENTS}, and its attention settings landmark_mode, "
     'landmark_grid, newton_iters, newton_ridge, newton_backward.'),
    ('model.backbone.frozen_stages=5', "the config's RetinaNet > SOFT: frozen_stages must be an int in -1..4, got 5."),
    ('model.neck.in_channelz=3', "the config's RetinaNet > FPN: FPN.__init__() got an unexpected keyword argument "
     "'in_channelz'."),
])
def test_a_bad_model_argument_through_train_is_one_sentence_and_the_traceback_on_request(tmp_path, option, sentence):
    """--cfg-options that misspell or mis-set an argument of a class the config builds: one sentence on stderr
    (nothing else: no traceback, no pkg_resources warnings), exit status 1; SOFT_MM_DEBUG=1 gives the traceback."""
    pytest.importorskip('mmdet')
    from helpers.tool_process import run_tool

    args = ['tools/train.py', RETINANET_DEMO, '--work-dir', 'work', '--cfg-options', option]
    plain = run_tool(args, tmp_path, timeout=300, check=False)
    assert plain.returncode == 1 and plain.stderr.strip().splitlines() == [sentence], plain.stderr[-3000:]
    debug = run_tool(args, tmp_path, timeout=300, check=False, env={'SOFT_MM_DEBUG': '1'})
    assert debug.returncode == 1 and 'Traceback (most recent call last)' in debug.stderr


# --- bad files given to the tools (images, checkpoints) ---------------------------------------------------------------

def _bad_images(folder: Path) -> dict[str, tuple[Path, str]]:
    """kind -> (path, the problem tools/infer.py and tools/analysis_tools/attention_health.py name)."""
    (folder / 'images').mkdir()
    (folder / 'text.png').write_text('not an image\n')
    (folder / 'empty.png').write_bytes(b'')
    return {'missing': (folder / 'missing.png', 'not found'),
            'folder': (folder / 'images', 'is a folder, not an image'),
            'text': (folder / 'text.png', r'cannot be decoded as an image \(empty, truncated or not an image format\)'),
            'empty': (folder / 'empty.png', r'cannot be decoded as an image \(error\)')}


def _image(folder: Path) -> Path:
    import cv2
    import numpy as np

    path = folder / 'image.png'
    cv2.imwrite(str(path), np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    return path


@pytest.mark.parametrize('tool_name', ['infer', 'analysis_tools/attention_health'])
def test_tools_name_a_bad_image_and_the_fix(tool_name, tmp_path, load_tool):
    pytest.importorskip('mmdet')
    tool = load_tool(tool_name)
    checkpoint = tmp_path / 'never_read.pth'  # images are checked first: the checkpoint is not read
    for path, problem in _bad_images(tmp_path).values():
        args = [str(path), RETINANET_DEMO, str(checkpoint)] if tool_name == 'infer' else [RETINANET_DEMO, str(path)]
        with pytest.raises(SystemExit, match=rf'^{path} {problem}: pass an image file that OpenCV reads \(PNG, JPEG, '
                                             r'BMP, \.\.\.\), e\.g\. data/shapes/val/000001\.png\.$'):
            tool.main(args)


def test_infer_names_a_bad_checkpoint_before_building_the_model(tmp_path, load_tool, monkeypatch):
    pytest.importorskip('mmdet')
    tool, image = load_tool('infer'), _image(tmp_path)
    (tmp_path / 'folder.pth').mkdir()
    (tmp_path / 'notes.pth').write_text('these are not weights\n')
    torch.save({'meta': {'epoch': 1}}, tmp_path / 'meta_only.pth')
    cases = {'missing.pth': 'not found: pass the path of an existing checkpoint',
             'folder.pth': 'is a folder, not a checkpoint file: pass a .pth file',
             'notes.pth': 'is not a PyTorch checkpoint (torch.load cannot read it): pass a .pth file',
             'meta_only.pth': 'holds no tensors (neither a state_dict nor a bare state dict): pass a .pth file'}
    import mmdet.apis

    monkeypatch.setattr(mmdet.apis, 'init_detector', None)  # the file is refused before a model is built
    for name, problem in cases.items():
        with pytest.raises(SystemExit) as stop:
            tool.main([str(image), RETINANET_DEMO, str(tmp_path / name)])
        assert str(stop.value).startswith(f'{tmp_path / name} {problem}'), str(stop.value)


@pytest.mark.parametrize('tool_name', ['infer', 'analysis_tools/attention_health'])
def test_tools_refuse_another_models_checkpoint(tool_name, tmp_path, load_tool):
    """mmengine loads such a file with a logged warning and goes on with random weights; the tools stop instead."""
    pytest.importorskip('mmdet')
    image, other = _image(tmp_path), tmp_path / 'resnet.pth'
    torch.save({'state_dict': {'conv1.weight': torch.zeros(64, 3, 7, 7), 'fc.weight': torch.zeros(10, 64)}}, other)
    args = ([str(image), RETINANET_DEMO, str(other)] if tool_name == 'infer'
            else [RETINANET_DEMO, str(other), str(image)])
    with pytest.raises(SystemExit, match=rf"^{other} does not fit the model of this config: only 0 of its \d+ weights "
                                         r"are in the file \(its keys start with 'conv1\.', 'fc\.'\): pass a "
                                         r'checkpoint trained with this config\.$'):
        load_tool(tool_name).main([*args, '--device', 'cpu'])


def test_train_refuses_another_variants_backbone_checkpoint_before_it_runs(tmp_path):
    """SOFT-Norm-Small ImageNet weights as the Tiny demo's init_cfg: mmengine would load them with a logged warning
    and train on; tools/train.py stops with the backbone's own sentence, before the demo data is even written."""
    pytest.importorskip('mmdet')
    from helpers.tool_process import run_tool

    from soft_mm.models import SoftVisionTransformer

    checkpoint = tmp_path / 'soft_norm_small_in1k.pth'
    torch.save({'state_dict': SoftVisionTransformer('small', soft_norm=True).state_dict()}, checkpoint)
    proc = run_tool(['tools/train.py', RETINANET_DEMO, '--work-dir', 'work', '--cfg-options',
                     'model.backbone.init_cfg.type=Pretrained', f'model.backbone.init_cfg.checkpoint={checkpoint}'],
                    tmp_path, timeout=300, check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"{checkpoint} holds the backbone of SOFT arch 'small' (embed_dims (64, 128, 320, 512), depths (1, 3, 7, 4)), "
        "which does not fit the one built here, SOFT arch 'tiny' (embed_dims (64, 128, 320, 512), depths (1, 2, 3, "
        '2)): of its 296 backbone tensors 118 with no place in the backbone (e.g. stages.1.blocks.2.attn.'
        "landmark_conv.weight): build arch='small' to use it, pass a checkpoint of the built backbone, or set "
        'partial_pretrained=True on the backbone to load only the tensors that fit and keep the default '
        'initialisation for the rest (docs/user_guides/checkpoints.md).'], proc.stderr[-3000:]
    assert not (tmp_path / 'data').exists()


def test_infer_process_one_line_and_debug(tmp_path):
    pytest.importorskip('mmdet')
    from helpers.tool_process import run_tool

    bad = _bad_images(tmp_path)['text'][0]
    plain = run_tool(['tools/infer.py', str(bad), RETINANET_DEMO, 'x.pth'], tmp_path, timeout=300, check=False)
    assert plain.returncode == 1 and 'Traceback' not in plain.stderr
    assert plain.stderr.strip().splitlines() == [(f'{bad} cannot be decoded as an image (empty, truncated or not an '
                                                  'image format): pass an image file that OpenCV reads (PNG, JPEG, '
                                                  'BMP, ...), e.g. data/shapes/val/000001.png.')]
    debug = run_tool(['tools/infer.py', str(bad), RETINANET_DEMO, 'x.pth', '--debug'], tmp_path, timeout=300,
                     check=False)
    assert debug.returncode == 1 and 'Traceback (most recent call last)' in debug.stderr
    assert 'InputFileError' in debug.stderr


# --- data folders and annotation files named by a config ------------------------------------------------------------

def _coco_like(tmp_path: Path, **dataset):
    """An mmengine Config with a COCO train dataset under ``tmp_path/coco`` and a val evaluator's annotation file."""
    from mmengine.config import Config

    root = f'{tmp_path}/coco/'
    return Config({'train_dataloader': {'dataset': {'type': 'CocoDataset', 'data_root': root, **dataset}},
                   'val_dataloader': {'dataset': {'type': 'CocoDataset', 'data_root': root}},
                   'val_evaluator': {'type': 'CocoMetric', 'ann_file': f'{root}annotations/val.json'}})


def test_data_checks_name_the_path_the_config_key_and_the_fix(tmp_path):
    pytest.importorskip('mmdet')
    from mmdet.utils import register_all_modules
    from mmengine.config import Config

    from soft_mm.cli.config_checks import DataFileError, MissingPathError, check_data_paths

    register_all_modules()
    root = tmp_path / 'coco'
    cfg = _coco_like(tmp_path, ann_file='annotations/train.json', data_prefix={'img': 'train2017/'})
    with pytest.raises(MissingPathError, match=rf'^{root}/ not found: put the dataset there in the layout the README '
                                               r'describes, point the config at it with --cfg-options '
                                               r'train_dataloader\.dataset\.data_root=DIR, or train a demo config '
                                               r'\(configs/\*_demo\.py\), which generates its own data \(tools/misc/'
                                               r'make_demo_data\.py writes the demo data ahead\)\.$'):
        check_data_paths(cfg, ('train',))
    (root / 'annotations/train.json').mkdir(parents=True)
    with pytest.raises(DataFileError, match=r'annotations/train.json is a folder, not an annotation file: .*'
                                            r'--cfg-options train_dataloader\.dataset\.ann_file=FILE'):
        check_data_paths(cfg, ('train',))
    (root / 'annotations/train.json').rmdir()
    for content, problem in ((b'', 'is empty'), (b'{"images": [{"id": 1}, {"id"', 'is not a complete JSON file'),
                             (b'images,annotations\n', 'is not a complete JSON file')):
        (root / 'annotations/train.json').write_bytes(content)
        with pytest.raises(DataFileError, match=rf'^{root}/annotations/train.json {problem}.*: download or generate '
                                                r'it again'):
            check_data_paths(cfg, ('train',))
    (root / 'annotations/train.json').write_text('{"images": [], "annotations": [], "categories": []}\n')
    with pytest.raises(MissingPathError, match=rf'^{root}/train2017/ not found: .*--cfg-options '
                                               r'train_dataloader\.dataset\.data_prefix\.img=DIR'):
        check_data_paths(cfg, ('train',))
    (root / 'train2017').mkdir()
    check_data_paths(cfg, ('train',))  # complete: no error
    (root / 'annotations/val.json').write_text('{"images": [')
    with pytest.raises(DataFileError, match=r'val.json is not a complete JSON file .*download or generate it again'):
        check_data_paths(cfg, ('val',))
    # inside a dataset wrapper the key names the wrapped dataset
    wrapped = Config({'train_dataloader': {'dataset': {'type': 'RepeatDataset', 'times': 2, 'dataset': {
        'type': 'CocoDataset', 'data_root': str(tmp_path / 'nowhere')}}}})
    with pytest.raises(MissingPathError, match=r'--cfg-options train_dataloader\.dataset\.dataset\.data_root=DIR'):
        check_data_paths(wrapped, ('train',))


def test_train_tool_names_a_missing_image_folder(tmp_path, monkeypatch, load_tool):
    pytest.importorskip('mmdet')
    monkeypatch.chdir(tmp_path)
    for name in ('annotations/instances_train2017.json', 'annotations/instances_val2017.json'):
        (tmp_path / 'data/coco' / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / 'data/coco' / name).write_text('{}')
    with pytest.raises(SystemExit, match=r'^data/coco/train2017/ not found: .*--cfg-options '
                                         r'train_dataloader\.dataset\.data_prefix\.img=DIR'):
        load_tool('train').main([str(ROOT / 'configs/retinanet_soft_tiny_coco.py')])


def test_test_tool_names_a_folder_given_as_the_checkpoint(tmp_path, monkeypatch, load_tool):
    pytest.importorskip('mmdet')
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'epoch_4.pth').mkdir()  # e.g. a work dir's name typed for its checkpoint
    with pytest.raises(SystemExit, match=r'^epoch_4.pth is a folder, not a checkpoint file: pass the path of an '
                                         r'existing checkpoint \(or remove load_from\)\.$'):
        load_tool('test').main([RETINANET_DEMO, 'epoch_4.pth'])
