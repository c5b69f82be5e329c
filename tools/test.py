"""Evaluate a checkpoint of any mmengine config (mmdet, mmseg) on its test split, on GPUs or CPUs.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out results.pkl] [--show-dir DIR] [--cfg-options ...]
    bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [same options]
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import sys

from mmengine.config import Config, DictAction
from mmengine.evaluator import DumpResults
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))  # soft_mm from a plain checkout too
from soft_mm.utils import (
    adapt_config_to_device,
    allow_mmengine_checkpoint_globals,
    check_checkpoint_paths,
    check_data_paths,
)
from soft_mm.utils.launch import LAUNCHERS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Test (and evaluate) a checkpoint.')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='where the evaluation log goes (default: work_dirs/<config name>)')
    parser.add_argument('--out', help='also dump the raw predictions to this .pkl file')
    parser.add_argument('--show-dir', help='draw the predictions on every test image into WORK_DIR/TIMESTAMP/SHOW_DIR')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none', help='job launcher')
    parser.add_argument('--local-rank', '--local_rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def enable_show_dir(cfg: Config, show_dir: str) -> None:
    """Let the config's visualization hook (mmdet's DetVisualizationHook, mmseg's SegVisualizationHook) draw."""
    hook = cfg.get('default_hooks', {}).get('visualization')
    if hook is None:
        raise ValueError('--show-dir needs a visualization hook in default_hooks (mmdet and mmseg runtimes have one)')
    hook.draw = True
    if 'Det' in hook.type:
        hook.test_out_dir = show_dir
    else:
        cfg.visualizer.save_dir = show_dir


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    allow_mmengine_checkpoint_globals()
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    cfg.work_dir = args.work_dir or cfg.get('work_dir') or osp.join(
        'work_dirs', osp.splitext(osp.basename(args.config))[0])
    cfg.load_from = args.checkpoint
    if args.show_dir:
        enable_show_dir(cfg, args.show_dir)
    check_data_paths(cfg, ('test',))
    check_checkpoint_paths(cfg, pretrained=False)
    adapt_config_to_device(cfg, args.launcher)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    if args.out:
        if not args.out.endswith(('.pkl', '.pickle')):
            raise ValueError(f'--out must be a .pkl or .pickle file, got {args.out}')
        runner.test_evaluator.metrics.append(DumpResults(out_file_path=args.out))
    runner.test()


if __name__ == '__main__':
    main()
