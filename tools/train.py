"""Train any mmengine config (mmdet, mmseg, soft_mm's own) on GPUs or CPUs, alone or distributed.

    python tools/train.py CONFIG [--work-dir DIR] [--resume [auto|CKPT]] [--amp] [--cfg-options k=v ...]
    bash tools/dist_train.sh CONFIG NUM_PROCS [same options]     # torchrun; gloo on CPU

The registry scope comes from the config's ``default_scope``. Without a GPU the run uses the CPU (gloo for
distributed runs); ``--amp`` (float16) needs a GPU.
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import sys

from mmengine.config import Config, DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))  # soft_mm from a plain checkout too
from soft_mm.utils import (
    adapt_config_to_device,
    allow_mmengine_checkpoint_globals,
    check_checkpoint_paths,
    check_data_paths,
    enable_amp,
)
from soft_mm.utils.launch import LAUNCHERS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Train a detector or segmentor.')
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='where logs and checkpoints go (default: work_dirs/<config name>)')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from CKPT, or with no value from the latest checkpoint in the work dir')
    parser.add_argument('--amp', action='store_true',
                        help='float16 mixed precision (GPU only)')
    parser.add_argument('--auto-scale-lr', action='store_true', help='scale the lr by the actual batch size')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. train_cfg.max_epochs=2 model.backbone.init_cfg=None')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none', help='job launcher')
    parser.add_argument('--local-rank', '--local_rank', type=int, default=0)  # set by torch.distributed.launch
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def build_config(args: argparse.Namespace) -> Config:
    cfg = Config.fromfile(args.config)  # runs the config's custom_imports
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('work_dirs', osp.splitext(osp.basename(args.config))[0])
    if args.amp:
        enable_amp(cfg)
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            raise ValueError('--auto-scale-lr needs auto_scale_lr.base_batch_size in the config')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume
    return cfg


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    allow_mmengine_checkpoint_globals()
    cfg = build_config(args)
    check_data_paths(cfg, ('train', 'val') if cfg.get('val_cfg') else ('train',))
    check_checkpoint_paths(cfg)
    adapt_config_to_device(cfg, args.launcher)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    runner.train()


if __name__ == '__main__':
    main()
