"""Runs that several tool tests share, made once per test session.

The README's main job (the RetinaNet demo, about 5 minutes on one core) is trained once; the tests that evaluate,
infer or compile its checkpoint take it from :func:`retinanet_main_job`. Under pytest-xdist a session fixture is made
once per worker, so every test that uses it carries ``@pytest.mark.xdist_group('retinanet_main_job')``: with
``--dist loadgroup`` (the README's test command) they all run on one worker, after one training.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers.repo import ROOT
from helpers.tool_process import logged_metrics, run_tool

RETINANET_DEMO = str(ROOT / 'configs/retinanet_soft_tiny_demo.py')


@dataclasses.dataclass(frozen=True)
class TrainedDemo:
    folder: Path  # where tools/train.py ran (holds the data it wrote, data/shapes)
    work_dir: Path
    checkpoint: Path  # the last checkpoint (work_dir/last_checkpoint)
    metrics: dict[str, float]  # the coco/... metrics of the final evaluation


@pytest.fixture(scope='session')
def retinanet_main_job(tmp_path_factory: pytest.TempPathFactory) -> TrainedDemo:
    """``python tools/train.py configs/retinanet_soft_tiny_demo.py`` from an empty folder: writes the demo data,
    trains its 4 epochs, evaluates."""
    folder = tmp_path_factory.mktemp('retinanet_main_job')
    work_dir = folder / 'work_retinanet'
    proc = run_tool(['tools/train.py', RETINANET_DEMO, '--work-dir', str(work_dir)], folder, timeout=2400)
    checkpoint = Path((work_dir / 'last_checkpoint').read_text().strip())
    return TrainedDemo(folder, work_dir, checkpoint, logged_metrics(proc.stdout + proc.stderr))
