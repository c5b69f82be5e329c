"""A few training steps of a demo config on one batch of the synthetic shapes, through mmengine's Runner (the
mixed-precision tests of tests/engine)."""
from __future__ import annotations

from pathlib import Path

import torch
from mmengine.config import Config
from mmengine.optim import OptimWrapper
from mmengine.runner import Runner

from soft_mm.datasets.synthetic_shapes import write_shapes_dataset

from .repo import ROOT


def demo_config(config: str, work: Path, options: dict) -> Config:
    """The demo ``config`` (a path from the repository's root) set up for a few steps on one batch: the shapes data
    written to ``work/data/shapes`` (the configs' ``data_root`` is relative: the caller works in ``work``),
    ``options`` merged (``Config.merge_from_dict`` keys), no DataLoader workers, no evaluation, no LR schedule."""
    write_shapes_dataset(work / 'data/shapes', num_train=8, num_val=2)
    cfg = Config.fromfile(str(ROOT / config))
    cfg.merge_from_dict(options)
    cfg.work_dir = str(work / 'work')
    cfg.train_dataloader.num_workers, cfg.train_dataloader.persistent_workers = 0, False
    for key in ('val_dataloader', 'val_cfg', 'val_evaluator', 'test_dataloader', 'test_cfg', 'test_evaluator'):
        cfg.pop(key, None)
    cfg.param_scheduler = []
    return cfg


def demo_runner(cfg: Config) -> tuple[Runner, dict]:
    """The runner of ``cfg``, its model initialised (seed 0) and in training mode, and its first training batch."""
    torch.manual_seed(0)
    runner = Runner.from_cfg(cfg)
    runner.model.init_weights()
    runner.model.train()
    return runner, next(iter(runner.train_dataloader))


def train_steps(runner: Runner, optim_wrapper: OptimWrapper, batch: dict, steps: int) -> list[float]:
    """The loss of each of ``steps`` training steps on ``batch``."""
    return [runner.model.train_step(batch, optim_wrapper)['loss'].item() for _ in range(steps)]
