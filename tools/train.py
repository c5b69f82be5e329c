"""Train any mmengine config (mmdet, mmseg, soft_mm's own) on GPUs or CPUs, alone or distributed.

    python tools/train.py CONFIG [--work-dir DIR] [--resume [auto|CKPT]] [--amp [--amp-dtype float16|bfloat16]]
        [--tensorboard] [--cfg-options k=v ...] [--debug]
    bash tools/dist_train.sh CONFIG NUM_PROCS [same options]     # torchrun; gloo on CPU

The registry scope comes from the config's ``default_scope``. Without a GPU the run uses the CPU (gloo for
distributed runs); ``--amp`` is float16 mixed precision on a GPU (``--amp-dtype bfloat16``: bfloat16) and
bfloat16 autocast on CPU. A bad config, dataset, image or checkpoint stops with one sentence
(``--debug``: the traceback); an unreadable image also saves the training so far (``unreadable_images = 'skip'`` in
the config skips such training images with a warning instead). Shared pieces: ``soft_mm/cli/``.
"""
from __future__ import annotations

import argparse

from mmengine.config import Config

from soft_mm.cli import check_checkpoint_paths, check_data_paths, enable_amp
from soft_mm.cli.arguments import add_precision_args, base_parser
from soft_mm.cli.arguments import parse_args as parse_with
from soft_mm.cli.config_loading import enable_tensorboard, load_config, set_work_dir, use_checked_image_loading
from soft_mm.cli.errors import ConfigError, one_sentence_errors
from soft_mm.cli.runner import build_runner, check_checkpoint_files, train_keeping_progress


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = base_parser('Train a detector or segmentor.')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from CKPT, or with no value from the latest checkpoint in the work dir')
    add_precision_args(parser, 'mixed precision: float16 on a GPU (see --amp-dtype), bfloat16 autocast on CPU',
                       compile=False)
    parser.add_argument('--auto-scale-lr', action='store_true', help='scale the lr by the actual batch size')
    parser.add_argument('--tensorboard', action='store_true',
                        help='also log to TensorBoard (tensorboard --logdir WORK_DIR)')
    return parse_with(parser, argv)


def build_config(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config, args.cfg_options)
    set_work_dir(cfg, args.config, args.work_dir)
    if args.amp_dtype and not args.amp:
        raise ConfigError('--amp-dtype needs --amp')
    if args.amp:
        enable_amp(cfg, args.amp_dtype)
    if args.tensorboard:
        enable_tensorboard(cfg)
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            raise ConfigError(f'{args.config} has no auto_scale_lr.base_batch_size: --auto-scale-lr needs it')
        cfg.auto_scale_lr.enable = True
    use_checked_image_loading(cfg)
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume
    return cfg


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with one_sentence_errors(args.debug):
        cfg = build_config(args)
        check_data_paths(cfg, ('train', 'val') if cfg.get('val_cfg') else ('train',))
        check_checkpoint_paths(cfg)
        runner = build_runner(cfg, args.launcher)
        check_checkpoint_files(runner, cfg, train=True)
        train_keeping_progress(runner)


if __name__ == '__main__':
    main()
