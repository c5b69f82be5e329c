"""tools/train.py, tools/test.py, tools/infer.py and tools/dist_train.sh on the demo detectors, on CPU.

Each tool runs in a fresh process (as a user runs it) inside a scratch folder, where the demo configs find (or
write) their data under data/shapes.
"""
from __future__ import annotations

import json
import math
import pickle
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
from helpers.repo import ROOT
from helpers.tool_process import logged_metrics, run_tool

pytest.importorskip('mmdet')

RETINANET_DEMO = str(ROOT / 'configs/retinanet_soft_tiny_demo.py')
MASK_RCNN_DEMO = str(ROOT / 'configs/mask_rcnn_soft_tiny_demo.py')


def scalars(work_dir: Path) -> list[dict]:
    """The records mmengine's LocalVisBackend wrote (work_dir/<timestamp>/vis_data/scalars.json), oldest first."""
    lines = []
    for path in sorted(work_dir.glob('*/vis_data/scalars.json')):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


@pytest.fixture(scope='module')
def tiny_demo_dir(tmp_path_factory) -> Path:
    """A scratch folder holding data/shapes with 16 train and 8 val images (the demo configs read data/shapes)."""
    from soft_mm.datasets.synthetic_shapes import write_shapes_dataset

    folder = tmp_path_factory.mktemp('tiny_demo')
    write_shapes_dataset(folder / 'data/shapes', num_train=16, num_val=8)
    return folder

# The RetinaNet demo (4 epochs, conv landmarks) reaches bbox mAP 0.64-0.66 (configs/retinanet_soft_tiny_demo.py); the
# bar is about half that, which absorbs run-to-run variation of CPU training.
RETINANET_DEMO_MIN_MAP = 0.35
# The first of the Mask R-CNN demo's 4 epochs reaches 0.169 bbox / 0.194 segm mAP (2 epochs 0.421-0.429 /
# 0.458-0.465); an untrained detector scores 0.
MASK_RCNN_FIRST_EPOCH_MIN_MAP = {'bbox': 0.08, 'segm': 0.08}
# score_thr=0: after one epoch on 16 images the detector may score every box below the config's 0.05, and CocoMetric
# then reports "the whole dataset is empty" instead of the metrics these short runs check for.
SCORE_EVERY_BOX = 'model.test_cfg.rcnn.score_thr=0.0'


def test_missing_dataset_stops_with_one_sentence(tmp_path):
    proc = run_tool(['tools/train.py', str(ROOT / 'configs/retinanet_soft_tiny_coco.py')], tmp_path, check=False)
    assert proc.returncode == 1
    assert 'Traceback' not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        'data/coco/ not found: put the dataset there in the layout the README describes, point the config at it with '
        '--cfg-options train_dataloader.dataset.data_root=DIR, or train a demo config (configs/*_demo.py), which '
        'generates its own data (tools/misc/make_demo_data.py writes the demo data ahead).')


def _fake_coco(folder):
    for name in ('annotations/instances_train2017.json', 'annotations/instances_val2017.json'):
        (folder / 'data/coco' / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / 'data/coco' / name).write_text('{}')
    for images in ('train2017', 'val2017'):  # the data_prefix folders
        (folder / 'data/coco' / images).mkdir(exist_ok=True)


def test_missing_annotation_and_checkpoint_stop_with_one_sentence(tmp_path, monkeypatch, load_tool):
    train_tool, test_tool = load_tool('train'), load_tool('test')
    monkeypatch.chdir(tmp_path)
    config = str(ROOT / 'configs/mask_rcnn_soft_small_coco.py')
    (tmp_path / 'data/coco').mkdir(parents=True)
    with pytest.raises(SystemExit, match=r'^data/coco/annotations/instances_train2017.json not found: put the'):
        train_tool.main([config])
    _fake_coco(tmp_path)
    with pytest.raises(SystemExit) as exc:
        train_tool.main([config])
    assert str(exc.value).startswith('checkpoints/soft_norm_small_in1k.pth not found: create it with '
                                     'tools/model_converters/convert_official_checkpoint.py')
    with pytest.raises(SystemExit, match=r'^work_dirs/nothing.pth not found: pass the path of an existing checkpoint'):
        train_tool.main([config, '--resume', 'work_dirs/nothing.pth',
                         '--cfg-options', 'model.backbone.init_cfg=None'])
    with pytest.raises(SystemExit, match=r'^epoch_12.pth not found'):
        test_tool.main([config, 'epoch_12.pth'])


def test_amp_and_cpu_adaptation_of_the_config(monkeypatch, load_tool):
    train_tool = load_tool('train')
    from soft_mm.cli import adapt_config_to_device

    monkeypatch.setattr('torch.cuda.is_available', lambda: False)
    cfg = train_tool.build_config(train_tool.parse_args([RETINANET_DEMO, '--amp']))
    assert cfg.optim_wrapper.type == 'CPUAmpOptimWrapper' and 'loss_scale' not in cfg.optim_wrapper
    assert cfg.optim_wrapper.clip_grad.max_norm == 1.0  # the rest of the config's wrapper is kept
    with pytest.raises(SystemExit, match=r'^--amp-dtype float16 needs a GPU: CPU mixed precision runs in bfloat16'):
        train_tool.build_config(train_tool.parse_args([RETINANET_DEMO, '--amp', '--amp-dtype', 'float16']))
    from soft_mm.cli.errors import ConfigError
    with pytest.raises(ConfigError, match='--amp-dtype needs --amp'):
        train_tool.build_config(train_tool.parse_args([RETINANET_DEMO, '--amp-dtype', 'bfloat16']))
    cfg = train_tool.build_config(train_tool.parse_args([RETINANET_DEMO, '--resume', '--work-dir', 'w']))
    assert cfg.optim_wrapper.type == 'OptimWrapper'
    assert (cfg.resume, cfg.load_from, cfg.work_dir) == (True, None, 'w')
    adapt_config_to_device(cfg, 'none')
    assert cfg.env_cfg.dist_cfg.backend == 'gloo' and cfg.launcher == 'none'
    assert 'model_wrapper_cfg' not in cfg
    # distributed on CPU (process group already up): SyncBN -> BN anywhere in the model, DDP without device_ids
    cfg.model.neck.norm_cfg = {'type': 'SyncBN'}
    cfg.model.bbox_head.norm_cfg = {'type': 'SyncBN'}
    monkeypatch.setattr('torch.distributed.is_initialized', lambda: True)
    adapt_config_to_device(cfg, 'pytorch')
    assert (cfg.model.neck.norm_cfg.type, cfg.model.bbox_head.norm_cfg.type) == ('BN', 'BN')
    assert cfg.model_wrapper_cfg.type == 'MMDistributedDataParallel' and cfg.model_wrapper_cfg.device_ids is None
    assert cfg.launcher == 'pytorch'
    with pytest.raises(ValueError, match='launcher must be one of'):
        adapt_config_to_device(cfg, 'torchrun')
    monkeypatch.setattr('torch.cuda.is_available', lambda: True)
    cfg = train_tool.build_config(train_tool.parse_args([RETINANET_DEMO, '--amp']))
    assert (cfg.optim_wrapper.type, cfg.optim_wrapper.loss_scale) == ('AmpOptimWrapper', 'dynamic')
    assert cfg.optim_wrapper.dtype == 'float16'
    cfg = train_tool.build_config(train_tool.parse_args([RETINANET_DEMO, '--amp', '--amp-dtype', 'bfloat16']))
    assert (cfg.optim_wrapper.type, cfg.optim_wrapper.dtype) == ('AmpOptimWrapper', 'bfloat16')
    assert cfg.work_dir == 'work_dirs/retinanet_soft_tiny_demo'


@pytest.mark.slow
def test_mask_rcnn_demo_learns_resumes_and_tests(tmp_path):
    """The Mask R-CNN demo from an empty folder, stopped after the first of its 4 epochs (the learning-rate schedule is
    the demo's up to there; the whole demo takes 4 times as long): boxes and masks above chance. Then ``--resume``
    from its checkpoint for one more epoch and tools/test.py on the result, on the first 16 train / 8 val images
    (``dataset.indices``: 2 iterations, 8 pictures)."""
    work_dir = tmp_path / 'work'
    proc = run_tool(['tools/train.py', MASK_RCNN_DEMO, '--work-dir', str(work_dir), '--cfg-options',
                     'train_cfg.max_epochs=1', 'train_cfg.val_interval=1'], tmp_path)
    metrics = logged_metrics(proc.stdout + proc.stderr)
    print(f'Mask R-CNN demo, 1 of 4 epochs: {metrics}')
    assert metrics['coco/bbox_mAP'] >= MASK_RCNN_FIRST_EPOCH_MIN_MAP['bbox']
    assert metrics['coco/segm_mAP'] >= MASK_RCNN_FIRST_EPOCH_MIN_MAP['segm']
    for key in ('coco/bbox_mAP_50', 'coco/segm_mAP_50'):
        assert key in metrics and math.isfinite(metrics[key]) and metrics[key] >= 0, key
    assert (work_dir / 'epoch_1.pth').is_file()
    losses = [r['loss'] for r in scalars(work_dir) if 'loss' in r]
    assert losses and all(math.isfinite(v) for v in losses)

    proc = run_tool(['tools/train.py', MASK_RCNN_DEMO, '--work-dir', str(work_dir), '--resume', '--cfg-options',
                     'train_cfg.max_epochs=2', 'train_dataloader.dataset.indices=16',
                     'val_dataloader.dataset.indices=8', 'default_hooks.logger.interval=1', SCORE_EVERY_BOX], tmp_path)
    output = proc.stdout + proc.stderr
    assert 'resumed epoch: 1' in output and 'Epoch(train) [2][2/2]' in output and 'Epoch(train) [1]' not in output
    assert (work_dir / 'epoch_2.pth').is_file()

    results = tmp_path / 'results.pkl'
    proc = run_tool(['tools/test.py', MASK_RCNN_DEMO, str(work_dir / 'epoch_2.pth'), '--work-dir', str(work_dir),
                     '--out', str(results), '--show-dir', 'shown', '--cfg-options', 'test_dataloader.dataset.indices=8',
                     SCORE_EVERY_BOX], tmp_path)
    metrics = logged_metrics(proc.stdout + proc.stderr)
    assert math.isfinite(metrics['coco/bbox_mAP']) and math.isfinite(metrics['coco/segm_mAP'])
    with open(results, 'rb') as f:
        assert len(pickle.load(f)) == 8
    assert len(list(work_dir.glob('*/shown/*.png'))) == 8


@pytest.mark.slow
def test_dist_train_two_cpu_processes(tiny_demo_dir):
    """``tools/dist_train.sh CONFIG 2`` on CPU: two gloo ranks split the 16 images (2 iterations of 2x4 per epoch)."""
    work_dir = tiny_demo_dir / 'work_dist'
    proc = run_tool(['tools/dist_train.sh', RETINANET_DEMO, '2', '--work-dir', str(work_dir), '--cfg-options',
                     'train_cfg.max_epochs=2', 'default_hooks.logger.interval=1', 'train_dataloader.batch_size=4'],
                    tiny_demo_dir, env={'PORT': '29517'})
    output = proc.stdout + proc.stderr
    assert 'Distributed training: True' in output and "'backend': 'gloo'" in output
    assert 'Epoch(train) [2][2/2]' in output and '[3/' not in output
    # each rank evaluates half of the 8 val images and rank 0 collects them through gloo; after 4 steps the detector
    # may still score every box below the 0.05 threshold, so CocoMetric may report an empty result here
    assert re.search(r'Epoch\(val\) \[2\]\[\d+/\d+\]', output)
    assert (work_dir / 'epoch_2.pth').is_file()


MAIN_JOB = pytest.mark.xdist_group('retinanet_main_job')  # the tests of the one main-job run (tests/tools/conftest.py)


@pytest.mark.slow
@MAIN_JOB
def test_retinanet_demo_main_job_learns(retinanet_main_job):
    """The README's main job from an empty folder: writes the data, trains, evaluates above the bar."""
    job = retinanet_main_job
    assert (job.folder / 'data/shapes/annotations/instances_val.json').is_file()
    print(f'RetinaNet demo: {job.metrics}')
    assert job.metrics['coco/bbox_mAP'] >= RETINANET_DEMO_MIN_MAP


def predicted_scores(results: Path) -> list[np.ndarray]:
    """The detection scores of every image in a ``tools/test.py --out`` file, in dataset order."""
    with open(results, 'rb') as f:
        return [np.asarray(sample['pred_instances']['scores']) for sample in pickle.load(f)]


COMPILED_IMAGES = 24


@pytest.mark.slow
@MAIN_JOB
def test_retinanet_demo_checkpoint_in_float32_bfloat16_and_compiled(retinanet_main_job):
    """tools/test.py on the main job's checkpoint: in float32 the training's own last evaluation; in bfloat16 (CPU
    autocast, soft_mm's bfloat16-products policy) other scores within 0.01 mAP; with the backbone compiled (aot_eager:
    dynamo's graph run by the eager kernels, no C++ build) and the checkpoint loaded into it by the runner afterwards,
    the float32 detections of the first 24 images (a checkpoint that missed the compiled module detects other
    boxes)."""
    job = retinanet_main_job

    def evaluate(name: str, *options: str) -> tuple[str, dict[str, float], list[np.ndarray]]:
        results = job.folder / f'{name}.pkl'
        proc = run_tool(['tools/test.py', RETINANET_DEMO, str(job.checkpoint), '--work-dir', str(job.folder / name),
                         '--out', str(results), *options], job.folder)
        output = proc.stdout + proc.stderr
        return output, logged_metrics(output), predicted_scores(results)

    _, fp32_metrics, fp32_scores = evaluate('float32')
    assert len(fp32_scores) == 100  # the demo's val images
    assert fp32_metrics['coco/bbox_mAP'] == pytest.approx(job.metrics['coco/bbox_mAP'], abs=1e-3)

    _, bf16_metrics, bf16_scores = evaluate('bfloat16', '--amp')
    print(f'RetinaNet demo in bfloat16: {bf16_metrics}')
    assert abs(bf16_metrics['coco/bbox_mAP'] - fp32_metrics['coco/bbox_mAP']) <= 0.01
    # it ran in bfloat16: a float32 run repeats the float32 scores bit for bit, bfloat16 products change them
    assert any(a.shape != b.shape or not np.array_equal(a, b) for a, b in zip(bf16_scores, fp32_scores))

    output, _, compiled_scores = evaluate('compiled', '--compile', 'aot_eager', '--cfg-options',
                                          f'test_dataloader.dataset.indices={COMPILED_IMAGES}')
    assert len(compiled_scores) == COMPILED_IMAGES
    for compiled, eager in zip(compiled_scores, fp32_scores):
        assert compiled.shape == eager.shape and np.allclose(compiled, eager, atol=1e-4)
    graphs = re.findall(r'torch\.compile \(aot_eager\): (\d+) graph\(s\) captured', output)
    assert graphs and int(graphs[-1]) >= 1, 'the compiled backbone ran (dynamo captured its graphs)'


@pytest.mark.slow
@MAIN_JOB
def test_retinanet_demo_infer_draws_detections_in_float32_and_bfloat16(retinanet_main_job):
    job = retinanet_main_job
    image = job.folder / 'data/shapes/val/000001.png'
    out = job.folder / 'detections.png'

    def infer(*options: str) -> list[str]:
        proc = run_tool(['tools/infer.py', str(image), RETINANET_DEMO, str(job.checkpoint), '--out', str(out),
                         *options], job.folder)
        lines = proc.stdout.strip().splitlines()
        return lines[lines.index(f'wrote {out}') + 1:]

    detections = infer()
    assert detections, 'at least one detection above the score threshold'
    assert all(line.split()[0] in ('circle', 'square', 'triangle') for line in detections)
    drawn, original = cv2.imread(str(out)), cv2.imread(str(image))
    assert drawn.shape == original.shape and np.abs(drawn.astype(int) - original).sum() > 0
    bf16_detections = infer('--amp')
    # the same drawn detections up to one box at the score threshold, with the scores or boxes of a bfloat16 forward
    assert bf16_detections and abs(len(bf16_detections) - len(detections)) <= 1
    assert all(line.split()[0] in ('circle', 'square', 'triangle') for line in bf16_detections)
    assert bf16_detections != detections, 'a float32 forward prints the float32 lines again'


def test_infer_writes_its_picture_under_work_dirs(tmp_path):
    """The README's inference command drew detections.png into the folder it ran in (the checkout's root); without
    --out the picture goes to work_dirs/<config name>/<image name>_det.png, and nothing else is written."""
    import torch
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    from soft_mm.datasets.synthetic_shapes import draw_image

    init_default_scope('mmdet')
    torch.manual_seed(0)
    checkpoint = tmp_path / 'retinanet.pth'
    torch.save({'state_dict': MODELS.build(Config.fromfile(RETINANET_DEMO).model).state_dict()}, checkpoint)
    image, _ = draw_image(np.random.default_rng(0), 128, 3, (10.0, 30.0))
    cv2.imwrite(str(tmp_path / 'shapes.png'), image)
    proc = run_tool(['tools/infer.py', 'shapes.png', RETINANET_DEMO, str(checkpoint)], tmp_path, timeout=600)
    out = Path('work_dirs/retinanet_soft_tiny_demo/shapes_det.png')
    assert f'wrote {out}' in proc.stdout.splitlines(), proc.stdout[-2000:]
    assert cv2.imread(str(tmp_path / out)).shape == image.shape
    assert sorted(path.name for path in tmp_path.iterdir()) == ['retinanet.pth', 'shapes.png', 'work_dirs']


def test_make_demo_data_writes_once(tmp_path, load_tool):
    make_demo_data = load_tool('misc/make_demo_data')
    root = tmp_path / 'shapes'
    make_demo_data.main(['--root', str(root), '--num-train', '3', '--num-val', '2', '--seed', '4'])
    coco = json.loads((root / 'annotations/instances_train.json').read_text())
    assert len(coco['images']) == 3 and 'seed 4' in coco['info']['description']
    assert len(list((root / 'semantic/train').iterdir())) == 3 and len(list((root / 'semantic/val').iterdir())) == 2
    stamp = (root / 'train/000001.png').stat().st_mtime_ns
    make_demo_data.main(['--root', str(root), '--num-train', '5'])
    assert (root / 'train/000001.png').stat().st_mtime_ns == stamp and not (root / 'train/000004.png').exists()
    make_demo_data.main(['--root', str(root), '--num-train', '5', '--num-val', '1', '--force'])
    assert len(list((root / 'train').iterdir())) == 5
