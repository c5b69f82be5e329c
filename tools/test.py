"""Evaluate a checkpoint of any mmengine config (mmdet, mmseg) on its test split, on GPUs or CPUs.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out results.pkl] [--amp] [--compile] [--show-dir DIR]
        [--cfg-options ...]
    bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [same options]

A bad config, dataset, image or checkpoint stops with one sentence (``--debug``: the traceback). Shared pieces:
``soft_mm/cli/``.
"""
from __future__ import annotations

import argparse

from mmengine.config import Config
from mmengine.evaluator import DumpResults

from soft_mm.cli import check_checkpoint_paths, check_data_paths, compile_backbone_for_inference, enable_test_amp
from soft_mm.cli.arguments import add_precision_args, base_parser
from soft_mm.cli.arguments import parse_args as parse_with
from soft_mm.cli.config_loading import load_config, set_work_dir, use_checked_image_loading
from soft_mm.cli.errors import ConfigError, one_sentence_errors
from soft_mm.cli.runner import build_runner, check_checkpoint_files
from soft_mm.cli.runtime import compiled_graphs_note


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = base_parser('Test (and evaluate) a checkpoint.')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out', help='also dump the raw predictions to this .pkl file')
    add_precision_args(parser, 'evaluate in mixed precision: float16 on a GPU (see --amp-dtype), bfloat16 on CPU')
    parser.add_argument('--show-dir', help='draw the predictions on every test image into WORK_DIR/TIMESTAMP/SHOW_DIR')
    return parse_with(parser, argv)


def enable_show_dir(cfg: Config, show_dir: str) -> None:
    """Let the config's visualization hook (mmdet's DetVisualizationHook, mmseg's SegVisualizationHook) draw."""
    hook = cfg.get('default_hooks', {}).get('visualization')
    if hook is None:
        raise ConfigError('--show-dir needs a visualization hook in default_hooks (mmdet and mmseg runtimes have one)')
    hook.draw = True
    if 'Det' in hook.type:
        hook.test_out_dir = show_dir
    else:
        cfg.visualizer.save_dir = show_dir


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with one_sentence_errors(args.debug):
        if args.out and not args.out.endswith(('.pkl', '.pickle')):
            raise ConfigError(f'--out must be a .pkl or .pickle file, got {args.out}')
        cfg = load_config(args.config, args.cfg_options)
        set_work_dir(cfg, args.config, args.work_dir)
        cfg.load_from = args.checkpoint
        use_checked_image_loading(cfg)
        if args.show_dir:
            enable_show_dir(cfg, args.show_dir)
        if args.amp_dtype and not args.amp:
            raise ConfigError('--amp-dtype needs --amp')
        if args.amp:
            enable_test_amp(cfg, args.amp_dtype)
        check_data_paths(cfg, ('test',))
        check_checkpoint_paths(cfg, pretrained=False)
        runner = build_runner(cfg, args.launcher)
        check_checkpoint_files(runner, cfg, train=False)
        if args.compile:
            compile_backbone_for_inference(runner.model, args.compile)
        if args.out:
            runner.test_evaluator.metrics.append(DumpResults(out_file_path=args.out))
        runner.test()
        if args.compile:
            print(compiled_graphs_note(args.compile), flush=True)


if __name__ == '__main__':
    main()
