"""``tools/train.py --tensorboard`` adds mmengine's TensorboardVisBackend, which writes event files."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.repo import ROOT

pytest.importorskip('tensorboard')


def test_flag_adds_the_backend_once_and_it_writes_events(tmp_path: Path, load_tool) -> None:
    from mmengine.registry import VISBACKENDS

    train = load_tool('train')
    config = str(ROOT / 'configs/retinanet_soft_tiny_demo.py')
    cfg = train.build_config(train.parse_args([config, '--tensorboard', '--work-dir', str(tmp_path)]))
    types = [backend['type'] for backend in cfg.visualizer.vis_backends]
    assert types == ['LocalVisBackend', 'TensorboardVisBackend']
    again = train.build_config(train.parse_args([config, '--tensorboard', '--cfg-options',
                                                 'visualizer.vis_backends.0.type=TensorboardVisBackend']))
    assert [backend['type'] for backend in again.visualizer.vis_backends] == ['TensorboardVisBackend']
    plain = train.build_config(train.parse_args([config]))
    assert [backend['type'] for backend in plain.visualizer.vis_backends] == ['LocalVisBackend']
    backend = VISBACKENDS.build({'type': 'TensorboardVisBackend', 'save_dir': str(tmp_path / 'vis')})
    backend.add_scalar('loss', 0.5, step=1)
    backend.close()
    assert list((tmp_path / 'vis').rglob('events.out.tfevents.*'))
