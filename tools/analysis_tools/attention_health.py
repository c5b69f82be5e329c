"""Attention health of a SOFT model on some images: per SOFT layer, how well-conditioned its landmark kernel is and
whether its Newton–Schulz iterations invert it.

    python tools/analysis_tools/attention_health.py CONFIG [CHECKPOINT] IMAGE [IMAGE ...] [--out health.png]
    python tools/analysis_tools/attention_health.py configs/retinanet_soft_tiny_demo.py \
        work_dirs/retinanet_soft_tiny_demo/epoch_4.pth data/shapes/val/000001.png

Detection, segmentation and classification configs alike (their ``default_scope`` picks mmdet's, mmseg's or
mmpretrain's inference pipeline). Without a checkpoint the model is measured as training starts (``init_weights`` with
seed 0). Prints one row per SOFT layer (see ``soft_mm.models.attention_health``; docs/advanced/attention_health.md says
what the numbers mean and what to do about them) and draws the condition number and the Newton residual per layer into
``--out``.
"""
from __future__ import annotations

import argparse
import os.path as osp
from collections.abc import Callable
from typing import Any

import torch
from mmengine.config import Config, DictAction
from mmengine.registry import DefaultScope

from soft_mm.cli.config_checks import check_image_files
from soft_mm.cli.config_loading import load_config
from soft_mm.cli.errors import DEBUG_HELP, one_sentence_errors
from soft_mm.cli.runner import check_model_checkpoint, read_model_checkpoint
from soft_mm.models.attention_health import (
    DEFAULT_MAX_ITERS,
    DEFAULT_TARGET_RESIDUAL,
    LandmarkRecorder,
    LayerHealth,
    attention_health,
    format_health_table,
)

CHECKPOINT_SUFFIXES = ('.pth', '.pt', '.ckpt', '.bin')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', help='a detection, segmentation or classification config with a SOFT backbone')
    parser.add_argument('inputs', nargs='+', metavar='[CHECKPOINT] IMAGE',
                        help=f'an optional checkpoint (a file ending in {", ".join(CHECKPOINT_SUFFIXES)}) followed by '
                             'one or more images')
    parser.add_argument('--out', help='PNG of condition number and residual per layer (default: no plot)')
    parser.add_argument('--target-residual', type=float, default=DEFAULT_TARGET_RESIDUAL,
                        help='the Newton residual the "iters to" column asks for (default %(default)g)')
    parser.add_argument('--max-iters', type=int, default=DEFAULT_MAX_ITERS,
                        help='the most Newton–Schulz iterations tried for it (default %(default)d)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. model.backbone.landmark_mode=conv')
    parser.add_argument('--device', default='cuda:0' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--debug', action='store_true', help=DEBUG_HELP)
    args = parser.parse_args(argv)
    first = args.inputs[0]
    args.checkpoint = first if first.lower().endswith(CHECKPOINT_SUFFIXES) else None
    args.images = args.inputs[1:] if args.checkpoint else args.inputs
    if not args.images:
        parser.error('pass at least one IMAGE after the checkpoint')
    if not args.target_residual > 0:
        parser.error(f'--target-residual must be > 0, got {args.target_residual}')
    if args.max_iters < 1:
        parser.error(f'--max-iters must be >= 1, got {args.max_iters}')
    return args


def _init_if_untrained(model: torch.nn.Module, checkpoint: str | None) -> torch.nn.Module:
    if checkpoint is None:  # the inference helpers build without init_weights: measure what training starts from
        torch.manual_seed(0)
        model.init_weights()
    return model.eval()


def detection_runner(cfg: Config, checkpoint: str | None, images: list[str], device: str
                     ) -> tuple[torch.nn.Module, Callable[[], Any]]:
    from mmdet.apis import inference_detector, init_detector

    model = _init_if_untrained(init_detector(cfg, checkpoint, device=device), checkpoint)
    return model, lambda: inference_detector(model, images)


def segmentation_runner(cfg: Config, checkpoint: str | None, images: list[str], device: str
                        ) -> tuple[torch.nn.Module, Callable[[], Any]]:
    from mmseg.apis import inference_model, init_model

    model = _init_if_untrained(init_model(cfg, checkpoint, device=device), checkpoint)
    return model, lambda: [inference_model(model, image) for image in images]


def classification_runner(cfg: Config, checkpoint: str | None, images: list[str], device: str
                          ) -> tuple[torch.nn.Module, Callable[[], Any]]:
    from mmpretrain.apis import ImageClassificationInferencer

    inferencer = ImageClassificationInferencer(cfg, pretrained=checkpoint, device=device)
    model = _init_if_untrained(inferencer.model, checkpoint)
    return model, lambda: inferencer(images)


RUNNERS = {'mmdet': detection_runner, 'mmseg': segmentation_runner, 'mmpretrain': classification_runner}


def plot_health(report: list[LayerHealth], out: str, title: str) -> None:
    """Two panels per layer: cond(A + ridge I) (max over samples and heads, with its coincident-landmark ceiling)
    and the Newton residual after the layer's iterations (max and median, with the target)."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    names = [layer.short_name for layer in report]
    x = range(len(report))
    fig, (cond_ax, resid_ax) = plt.subplots(1, 2, figsize=(11, 4))
    cond_ax.semilogy(x, [layer.condition_max for layer in report], 'o-', label='cond(A + ridge I), max')
    cond_ax.semilogy(x, [(layer.num_landmarks + layer.ridge) / layer.ridge if layer.ridge else float('nan')
                         for layer in report], 'k--', label='ceiling (m + ridge) / ridge: coincident landmarks')
    cond_ax.set(title='landmark kernel conditioning', ylabel='condition number')
    floor = 1e-17  # a converged float64 residual can be exactly 0 on a log axis
    resid_ax.semilogy(x, [max(layer.residual_max, floor) for layer in report], 'o-', label='max')
    resid_ax.semilogy(x, [max(layer.residual_median, floor) for layer in report], 's:', label='median')
    resid_ax.axhline(report[0].target_residual, color='k', linestyle='--', label='target')
    resid_ax.set(title=f'Newton residual after {report[0].newton_iters} iterations', ylabel='||P X - I||_F / sqrt(m)')
    for ax in (cond_ax, resid_ax):
        ax.set_xticks(list(x), names, rotation=45)
        ax.set_xlabel('SOFT layer (stage.block)')
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[LayerHealth]:
    args = parse_args(argv)
    with one_sentence_errors(args.debug):  # a bad image, config or checkpoint: one sentence (--debug: the traceback)
        check_image_files(args.images)
        cfg = load_config(args.config, args.cfg_options)
        state_dict = read_model_checkpoint(args.checkpoint) if args.checkpoint else None  # before a model is built
        scope = cfg.get('default_scope')
        if scope not in RUNNERS:
            raise SystemExit(f'{args.config} has default_scope={scope!r}; tools/analysis_tools/attention_health.py '
                             f'handles the scopes {", ".join(RUNNERS)} (detection, segmentation, classification).')
        with DefaultScope.overwrite_default_scope(scope):  # the pipelines' transforms resolve in the config's scope
            model, run = RUNNERS[scope](cfg, args.checkpoint, args.images, args.device)
            if state_dict is not None:  # another model's checkpoint would be measured as random weights
                check_model_checkpoint(model, state_dict, args.checkpoint)
            if not LandmarkRecorder(model).layers:
                raise SystemExit(f'{args.config} builds a model without SOFT attention layers: attention health is '
                                 "measured on SOFT backbones (type='SOFT') only.")
            with torch.no_grad():
                report = attention_health(model, run, args.target_residual, args.max_iters)
    weights = args.checkpoint or 'initialisation (seed 0)'
    print(f'attention health of {args.config} ({weights}) on {len(args.images)} image(s):')
    print(format_health_table(report))
    if args.out:
        plot_health(report, args.out, f'{osp.basename(args.config)}, {osp.basename(weights)}')
        print(f'wrote {args.out}')
    return report


if __name__ == '__main__':
    main()
