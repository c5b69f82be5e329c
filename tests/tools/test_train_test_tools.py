"""tools/train.py and tools/test.py on bad files, a kill during a checkpoint write, a NaN image and determinism.

Uses the RetinaNet demo config on 16 train / 8 val synthetic images (2 iterations of 8 images per epoch).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers.checkpoint_kill import kill_during_checkpoint_write
from helpers.repo import ROOT
from helpers.tool_process import run_tool, tool_output

pytest.importorskip('mmdet')

RETINANET_DEMO = str(ROOT / 'configs/retinanet_soft_tiny_demo.py')

SHORT = ['default_hooks.checkpoint.interval=1', 'default_hooks.logger.interval=1', 'train_dataloader.num_workers=0',
         'val_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
         'val_dataloader.persistent_workers=False']


@pytest.fixture(scope='module')
def demo_dir(tmp_path_factory) -> Path:
    from soft_mm.datasets.synthetic_shapes import write_shapes_dataset

    folder = tmp_path_factory.mktemp('demo')
    write_shapes_dataset(folder / 'data/shapes', num_train=16, num_val=8)
    return folder


@pytest.fixture(scope='module')
def demo_state_dict() -> dict[str, torch.Tensor]:
    """The weights of an untrained demo RetinaNet (keys backbone.*, neck.*, bbox_head.*)."""
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config

    register_all_modules()
    return MODELS.build(Config.fromfile(RETINANET_DEMO).model).state_dict()


def _stops_with(tool: ModuleType, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        tool.main(argv)
    message = str(exc.value)
    assert message.count('\n') == 0 and message.endswith('.'), message
    return message


def test_bad_checkpoints_stop_with_one_sentence(demo_dir, demo_state_dict, monkeypatch, load_tool):
    monkeypatch.chdir(demo_dir)
    train_tool, test_tool = load_tool('train'), load_tool('test')
    good = demo_dir / 'model.pth'
    torch.save({'meta': {}, 'state_dict': demo_state_dict}, good)
    data = good.read_bytes()
    (demo_dir / 'truncated.pth').write_bytes(data[: len(data) // 2])
    (demo_dir / 'notes.pth').write_text('epoch 12, mAP 0.77\n')
    torch.save({'state_dict': {'conv1.weight': torch.zeros(64, 3, 7, 7), 'fc.weight': torch.zeros(10, 2048)}},
               demo_dir / 'resnet.pth')
    work = ['--work-dir', str(demo_dir / 'work_bad')]

    assert _stops_with(test_tool, [RETINANET_DEMO, 'truncated.pth', *work]) == (
        'truncated.pth is truncated (the file ends before the checkpoint does): copy it again or use an earlier '
        "checkpoint (a run killed while saving with mmengine's own CheckpointHook leaves such files; soft_mm's "
        'AtomicCheckpointHook does not).')
    assert _stops_with(test_tool, [RETINANET_DEMO, 'notes.pth', *work]).startswith(
        'notes.pth is not a PyTorch checkpoint (torch.load cannot read it): pass a .pth file written by torch.save')
    assert _stops_with(test_tool, [RETINANET_DEMO, 'resnet.pth', *work]).startswith(
        "resnet.pth does not fit the model of this config: only 0 of its ")
    with pytest.raises(Exception) as exc:
        test_tool.main([RETINANET_DEMO, 'truncated.pth', *work, '--debug'])
    chain, error = [], exc.value  # --debug: the traceback shows torch's own error (the cause)
    while error is not None:
        chain.append(str(error))
        error = error.__cause__ or error.__context__
    assert any('central directory' in message for message in chain), chain

    assert _stops_with(train_tool, [RETINANET_DEMO, '--resume', 'notes.pth', *work]).startswith(
        'notes.pth is not a PyTorch checkpoint')
    assert _stops_with(train_tool, [RETINANET_DEMO, '--resume', 'resnet.pth', *work]).startswith(
        'resnet.pth is not a training checkpoint (it has no meta and state_dict entries to resume from)')
    assert _stops_with(train_tool, [RETINANET_DEMO, *work, '--cfg-options', 'load_from=resnet.pth']).startswith(
        'resnet.pth does not fit the model of this config')
    # a whole detector given as the backbone's ImageNet init
    init = ['--cfg-options', 'model.backbone.init_cfg.type=Pretrained']
    message = _stops_with(train_tool, [RETINANET_DEMO, *work, *init, 'model.backbone.init_cfg.checkpoint=model.pth'])
    assert message.startswith('model.pth does not fit model.backbone: only 0 of its ')
    assert "add prefix='backbone.' to the init_cfg" in message
    message = _stops_with(train_tool, [RETINANET_DEMO, *work, *init,
                                       'model.backbone.init_cfg.checkpoint=truncated.pth'])
    assert message.startswith('truncated.pth is truncated')


def test_missing_and_broken_configs(tmp_path, monkeypatch, load_tool):
    monkeypatch.chdir(tmp_path)
    train_tool, test_tool = load_tool('train'), load_tool('test')
    assert _stops_with(train_tool, ['configs/nothing.py']) == (
        'configs/nothing.py not found: pass the path of a config file (e.g. configs/retinanet_soft_tiny_demo.py).')
    assert _stops_with(test_tool, ['configs/nothing.py', 'x.pth']).startswith('configs/nothing.py not found')
    (tmp_path / 'broken.py').write_text(f"_base_ = ['{RETINANET_DEMO}']\nmodel = dict(backbone=dict(arch='tiny')\n")
    assert _stops_with(train_tool, ['broken.py']).startswith('broken.py cannot be parsed (')
    (tmp_path / 'no_import.py').write_text(f"_base_ = ['{RETINANET_DEMO}']\ncustom_imports = None\n")
    assert _stops_with(train_tool, ['no_import.py']).startswith(
        "no_import.py uses type='SOFT' but does not import soft_mm: add custom_imports = dict(imports=['soft_mm']")


def test_nan_image_stops_a_demo_training_step(demo_dir, monkeypatch, load_tool):
    from mmengine.hooks import Hook
    from mmengine.registry import HOOKS

    @HOOKS.register_module(name='NaNImageForTests', force=True)
    class NaNImage(Hook):
        def before_train_iter(self, runner, batch_idx, data_batch=None):
            if runner.iter + 1 == 2:
                data_batch['inputs'] = [torch.full(img.shape, float('nan')) for img in data_batch['inputs']]

    monkeypatch.chdir(demo_dir)
    work_dir = demo_dir / 'work_nan'
    config = demo_dir / 'retinanet_nan_image.py'
    config.write_text(f"_base_ = ['{RETINANET_DEMO}']\n"
                      "custom_hooks = [dict(type='InvalidLossHook'), dict(type='NaNImageForTests')]\n")
    message = _stops_with(load_tool('train'), [
        str(config), '--work-dir', str(work_dir), '--cfg-options', 'train_cfg.max_epochs=1', *SHORT])
    assert message.startswith('training stopped at iteration 2 (epoch 1) because the loss is not finite (loss=nan')
    assert 'no checkpoint was saved before it: restart after lowering the learning rate' in message
    assert not list(work_dir.glob('*.pth'))


def test_unreadable_images_stop_with_one_sentence_or_are_skipped(tmp_path, monkeypatch, load_tool):
    """A zero-byte and a truncated PNG planted in the demo's training set (8 images, batches of 2 in file order): the
    run stops at the third batch naming the first one and keeps its 2 iterations; with unreadable_images='skip' the
    epoch runs its 4 iterations with a warning naming each; a truncated test image stops tools/test.py."""
    from soft_mm.datasets.synthetic_shapes import write_shapes_dataset
    from soft_mm.utils import read_checkpoint

    write_shapes_dataset(tmp_path / 'data/shapes', num_train=8, num_val=4)
    monkeypatch.chdir(tmp_path)
    train_files = [image['file_name'] for image in json.loads(
        (tmp_path / 'data/shapes/annotations/instances_train.json').read_text())['images']]
    empty, truncated = (f'data/shapes/train/{name}' for name in train_files[4:6])  # the third batch
    Path(empty).write_bytes(b'')
    data = Path(truncated).read_bytes()
    Path(truncated).write_bytes(data[:len(data) // 2])
    train_tool, test_tool = load_tool('train'), load_tool('test')
    options = ['train_cfg.max_epochs=1', 'train_dataloader.batch_size=2', 'train_dataloader.sampler.shuffle=False',
               'train_dataloader.num_workers=1', 'train_dataloader.persistent_workers=False', 'val_cfg=None',
               'val_dataloader=None', 'val_evaluator=None', 'default_hooks.logger.interval=1']

    # a DataLoader worker meets the zero-byte file (unchecked: cv2.error ... !buf.empty(), no file named)
    message = _stops_with(train_tool, [RETINANET_DEMO, '--work-dir', 'work_stop', '--cfg-options', *options])
    saved = str(tmp_path / 'work_stop/iter_2.pth')  # (mmengine's work_dir is absolute)
    assert message == (
        f'{empty} is empty (0 bytes): remove it (and its annotation) or copy it again, then resume with --resume '
        f"{saved}, which holds the 2 iterations trained so far; or set unreadable_images = 'skip' in the config to "
        'skip unreadable training images with a warning.')
    checkpoint = read_checkpoint(saved)
    assert (checkpoint['meta']['epoch'], checkpoint['meta']['iter']) == (0, 2)
    assert Path('work_stop/last_checkpoint').read_text() == saved

    # opted in: both files skipped with a warning, the epoch completes its 4 iterations and is saved
    train_tool.main([RETINANET_DEMO, '--work-dir', 'work_skip', '--cfg-options', *options, 'unreadable_images=skip'])
    checkpoint = read_checkpoint('work_skip/epoch_1.pth')
    assert (checkpoint['meta']['epoch'], checkpoint['meta']['iter']) == (1, 4)
    log = next(Path('work_skip').glob('*/*.log')).read_text()
    for path, problem in ((empty, 'is empty (0 bytes)'), (truncated, 'cannot be decoded as an image (')):
        assert f'skipping {path}, which {problem}' in log

    # a test set in the main process (unchecked: mmcv's AssertionError: failed to load image)
    val_files = [image['file_name'] for image in json.loads(
        (tmp_path / 'data/shapes/annotations/instances_val.json').read_text())['images']]
    bad_val = Path(f'data/shapes/val/{val_files[0]}')
    bad_val.write_bytes(bad_val.read_bytes()[:100])
    message = _stops_with(test_tool, [RETINANET_DEMO, saved, '--work-dir', 'work_test', '--cfg-options',
                                      'test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False'])
    assert message == (f'{bad_val} cannot be decoded as an image (100 bytes: truncated, corrupt or not an image '
                       'format): remove it (and its annotation) or copy it again.')
    assert _stops_with(train_tool, [RETINANET_DEMO, '--cfg-options', 'unreadable_images=ignore']) == (
        "unreadable_images='ignore' in the config is not one of ('stop', 'skip'): use 'stop' (the default) or 'skip' "
        '(skip unreadable training images with a warning).')


@pytest.mark.slow
def test_demo_killed_during_checkpoint_write_resumes_and_finishes(demo_dir):
    work_dir = demo_dir / 'work_kill'
    train = [sys.executable, str(ROOT / 'tools/train.py'), RETINANET_DEMO, '--work-dir', str(work_dir)]

    def run(*args: str) -> str:
        return tool_output(['tools/train.py', RETINANET_DEMO, '--work-dir', str(work_dir), *args], demo_dir)

    run('--cfg-options', 'train_cfg.max_epochs=1', *SHORT)
    partial = kill_during_checkpoint_write([*train, '--resume', '--cfg-options', 'train_cfg.max_epochs=3', *SHORT],
                                           work_dir, cwd=demo_dir)
    assert partial.name.startswith('.epoch_2.pth.')
    assert (work_dir / 'last_checkpoint').read_text() == str(work_dir / 'epoch_1.pth')
    assert (work_dir / 'epoch_1.pth').is_file() and not (work_dir / 'epoch_2.pth').exists()  # max_keep_ckpts=1

    output = run('--resume', '--cfg-options', 'train_cfg.max_epochs=3', *SHORT)
    assert 'resumed epoch: 1, iter: 2' in output and 'Epoch(train) [3][2/2]' in output
    assert 'Epoch(train) [1]' not in output
    from soft_mm.utils import read_checkpoint

    final = read_checkpoint((work_dir / 'last_checkpoint').read_text())
    assert (final['meta']['epoch'], final['meta']['iter']) == (3, 6)
    assert sorted(p.name for p in work_dir.glob('*.pth')) == ['epoch_3.pth'] and not list(work_dir.glob('.*partial'))
    # score_thr=0: a 6-iteration model may score every box below the config's 0.05, and CocoMetric then reports
    # "the whole dataset is empty" instead of bbox_mAP; this step checks that the resumed checkpoint evaluates.
    output = tool_output(['tools/test.py', RETINANET_DEMO, str(work_dir / 'epoch_3.pth'), '--work-dir', str(work_dir),
                          '--cfg-options', 'model.test_cfg.score_thr=0.0', 'test_dataloader.num_workers=0',
                          'test_dataloader.persistent_workers=False'], demo_dir)
    assert 'coco/bbox_mAP' in output


@pytest.mark.slow
def test_same_seed_same_losses_on_cpu(demo_dir):
    """Two 2-epoch CPU runs with randomness.seed=0, deterministic=True and one thread log the same losses; a third
    with randomness.seed=1 (the control: the seed is used) logs other losses at every step."""
    losses = []
    for run, seed in (('a', 0), ('b', 0), ('c', 1)):
        work_dir = demo_dir / f'work_seed_{run}'
        run_tool(['tools/train.py', RETINANET_DEMO, '--work-dir', str(work_dir), '--cfg-options',
                  'train_cfg.max_epochs=2', 'train_cfg.val_interval=10', f'randomness.seed={seed}',
                  'randomness.deterministic=True', *SHORT], demo_dir, env={'OMP_NUM_THREADS': '1'})
        records = [json.loads(line) for path in sorted(work_dir.glob('*/vis_data/scalars.json'))
                   for line in path.read_text().splitlines()]
        losses.append([(r['step'], r['loss'], r['loss_cls'], r['loss_bbox']) for r in records if 'loss' in r])
    assert len(losses[0]) == 4  # 2 epochs x 2 iterations, logged every iteration
    assert losses[0] == losses[1]
    assert [step for step, *_ in losses[2]] == [step for step, *_ in losses[0]]
    assert all(other[1] != same[1] for other, same in zip(losses[2], losses[0])), 'seed 1 gives another loss each step'

