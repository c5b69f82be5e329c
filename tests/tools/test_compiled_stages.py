"""The backbone switch ``compile_stages`` (soft_mm/models/compiled.py) in a detector trained by tools/train.py: the
RetinaNet demo with its backbone's stages compiled trains to the mAP of the eager run. The stages are compiled by
AOTAutograd without code generation (``backend='aot_eager'``: the same graphs inductor would get, forward and
backward; inductor's C++ build of every stage takes minutes on this machine), one epoch from the same seed."""
from __future__ import annotations

import pytest
from helpers.repo import ROOT
from helpers.tool_process import logged_metrics, run_tool

pytest.importorskip('mmdet')

COMPILED_DEMO = str(ROOT / 'configs/retinanet_soft_tiny_compiled_demo.py')
ONE_EPOCH = ['train_cfg.max_epochs=1', 'train_cfg.val_interval=1', 'default_hooks.logger.interval=50',
             'train_dataloader.num_workers=0', 'val_dataloader.num_workers=0',
             'train_dataloader.persistent_workers=False', 'val_dataloader.persistent_workers=False']


def _train(folder, name, *options):
    proc = run_tool(['tools/train.py', COMPILED_DEMO, '--work-dir', str(folder / name), '--cfg-options',
                     *ONE_EPOCH, *options], folder, timeout=1800)
    return proc.stdout + proc.stderr


@pytest.mark.slow  # two one-epoch trainings of the demo, about 3 minutes on one core
def test_the_demo_with_compiled_stages_trains_to_the_eager_map(tmp_path):
    compiled = _train(tmp_path, 'compiled', 'model.backbone.compile_stages.backend=aot_eager')
    eager = _train(tmp_path, 'eager', 'model.backbone.compile_stages=None')
    # each of the four stages compiled once (training and evaluation share the callable)
    assert compiled.count('soft_mm: a backbone stage') == 4, compiled[-3000:]
    assert 'soft_mm: a backbone stage' not in eager
    compiled_map, eager_map = (logged_metrics(out)['coco/bbox_mAP'] for out in (compiled, eager))
    assert eager_map > 0.05 and abs(compiled_map - eager_map) <= 0.03, (compiled_map, eager_map)
