"""Run a trained model on one image; what it does follows the config's ``default_scope``:

    python tools/infer.py IMAGE CONFIG CHECKPOINT [--out OUT.png] [--score-thr 0.3] [--topk 5] [--device cpu] [--amp]
        [--compile]

- ``mmdet``: draws the detections with mmdet's visualizer into OUT (default
  ``work_dirs/<config name>/<image name>_det.png``, beside the run's other outputs) and prints one line per drawn
  detection (class, score, box);
- ``mmseg``: overlays the predicted segmentation with mmseg's visualizer into OUT (default
  ``work_dirs/<config name>/<image name>_seg.png``) and prints the share of the pixels of every predicted class;
- ``mmpretrain``: prints the top-k classes with their scores (mmpretrain's ``ImageClassificationInferencer``).
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
from collections.abc import Callable

import mmcv
import numpy as np
import torch
from mmengine.config import Config

from soft_mm.cli import compile_backbone_for_inference, enable_test_amp
from soft_mm.cli.arguments import add_precision_args
from soft_mm.cli.config_checks import check_image_files
from soft_mm.cli.config_loading import default_work_dir, load_config
from soft_mm.cli.errors import DEBUG_HELP, one_sentence_errors
from soft_mm.cli.runner import check_model_checkpoint, read_model_checkpoint
from soft_mm.cli.runtime import compiled_graphs_note
from soft_mm.engine import enable_cpu_bf16_ops

State = dict[str, torch.Tensor]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Run a detector, segmentor or classifier on one image.')
    parser.add_argument('image', help='input image file')
    parser.add_argument('config', help='config file; its default_scope picks detection, segmentation or classification')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out', default=None,
                        help='output image for detection / segmentation (default: work_dirs/<config name>/'
                             '<image name>_det.png / _seg.png)')
    parser.add_argument('--score-thr', type=float, default=0.3, help='detection: draw detections scoring at least this')
    parser.add_argument('--opacity', type=float, default=0.5, help='segmentation: opacity of the overlaid classes')
    parser.add_argument('--topk', type=int, default=5, help='classification: how many classes to print')
    parser.add_argument('--device', default='cuda:0' if torch.cuda.is_available() else 'cpu')
    add_precision_args(parser, 'run the model under autocast: float16 on a GPU (see --amp-dtype), bfloat16 on CPU')
    parser.add_argument('--debug', action='store_true', help=DEBUG_HELP)
    return parser.parse_args(argv)


def output_path(args: argparse.Namespace, suffix: str) -> str:
    """``--out``, else ``work_dirs/<config name>/<image name><suffix>`` (as tools/train.py's default work dir): never
    beside the image (a data set's folder) or in the folder the tool runs in. Its folder is created."""
    out = args.out or osp.join(default_work_dir(args.config), osp.splitext(osp.basename(args.image))[0] + suffix)
    os.makedirs(osp.dirname(out) or '.', exist_ok=True)
    return out


def infer_detection(args: argparse.Namespace, cfg: Config, state_dict: State) -> str:
    """Draw the detections into ``args.out``; print and return its path."""
    from mmdet.apis import inference_detector, init_detector
    from mmdet.registry import VISUALIZERS

    model = init_detector(cfg, args.checkpoint, device=args.device)
    check_model_checkpoint(model, state_dict, args.checkpoint)
    if args.compile:
        compile_backbone_for_inference(model, args.compile)
    result = inference_detector(model, args.image)
    visualizer = VISUALIZERS.build(model.cfg.visualizer)
    visualizer.dataset_meta = model.dataset_meta
    out = output_path(args, '_det.png')
    image = mmcv.imread(args.image, channel_order='rgb')
    visualizer.add_datasample('detections', image, data_sample=result, draw_gt=False, show=False,
                              pred_score_thr=args.score_thr, out_file=out)
    print(f'wrote {out}')
    instances = result.pred_instances
    classes = model.dataset_meta['classes']
    for label, score, box in zip(instances.labels.tolist(), instances.scores.tolist(), instances.bboxes.tolist()):
        if score >= args.score_thr:
            print(f'{classes[label]:>12s} {score:.3f} [{", ".join(f"{v:.1f}" for v in box)}]')
    return out


def infer_segmentation(args: argparse.Namespace, cfg: Config, state_dict: State) -> str:
    """Overlay the predicted segmentation on the image into ``args.out``; print and return its path."""
    from mmseg.apis import inference_model, init_model
    from mmseg.registry import VISUALIZERS

    if not 0.0 <= args.opacity <= 1.0:
        raise ValueError(f'--opacity must be in [0, 1], got {args.opacity}')
    model = init_model(cfg, args.checkpoint, device=args.device)
    check_model_checkpoint(model, state_dict, args.checkpoint)
    if args.compile:
        compile_backbone_for_inference(model, args.compile)
    result = inference_model(model, args.image)
    meta = dict(model.dataset_meta)
    if not meta.get('palette'):  # a checkpoint that names its classes only: one fixed random colour per class
        meta['palette'] = np.random.default_rng(0).integers(0, 256, (len(meta['classes']), 3)).tolist()
    visualizer = VISUALIZERS.build(model.cfg.visualizer)
    visualizer.dataset_meta = meta
    visualizer.alpha = args.opacity  # SegLocalVisualizer's overlay opacity
    out = output_path(args, '_seg.png')
    image = mmcv.imread(args.image, channel_order='rgb')
    visualizer.add_datasample('segmentation', image, data_sample=result, draw_gt=False, show=False,
                              with_labels=False, out_file=out)
    print(f'wrote {out}')
    labels = result.pred_sem_seg.data.flatten()
    classes = meta['classes']
    for label, count in zip(*torch.unique(labels, return_counts=True)):
        print(f'{classes[int(label)]:>12s} {int(count) / labels.numel():.3f} of the pixels')
    return out


def _dataset_classes(cfg: Config) -> tuple[str, ...] | None:
    """The class names of the config's test dataset class (its METAINFO), or None."""
    from mmpretrain.registry import DATASETS

    dataset_type = cfg.get('test_dataloader', {}).get('dataset', {}).get('type')
    dataset_cls = DATASETS.get(dataset_type) if isinstance(dataset_type, str) else None
    classes = getattr(dataset_cls, 'METAINFO', {}).get('classes')
    return tuple(classes) if classes else None


def infer_classification(args: argparse.Namespace, cfg: Config, state_dict: State) -> list[tuple[str, float]]:
    """Print and return the ``args.topk`` most likely classes with their softmax scores, best first."""
    from mmpretrain.apis import ImageClassificationInferencer

    if args.topk < 1:
        raise ValueError(f'--topk must be a positive int, got {args.topk}')
    inferencer = ImageClassificationInferencer(cfg, pretrained=args.checkpoint, device=args.device)
    check_model_checkpoint(inferencer.model, state_dict, args.checkpoint)
    if args.compile:
        compile_backbone_for_inference(inferencer.model, args.compile)
    # the checkpoint's dataset_meta (written by training) names the classes; else the config's dataset class does
    classes = inferencer.classes or _dataset_classes(cfg)
    scores = torch.as_tensor(inferencer(args.image)[0]['pred_scores'])
    top_scores, top_labels = scores.topk(min(args.topk, scores.numel()))
    ranked = [(classes[label] if classes else str(label), score)
              for label, score in zip(top_labels.tolist(), top_scores.tolist())]
    print(f'\ntop-{len(ranked)} classes of {args.image}:')  # on a line of its own after the inferencer's progress bar
    for rank, (name, score) in enumerate(ranked, start=1):
        print(f'{rank}. {name:>24s} {score:.4f}')
    return ranked


TASKS: dict[str, Callable[[argparse.Namespace, Config, State], object]] = {
    'mmdet': infer_detection, 'mmseg': infer_segmentation, 'mmpretrain': infer_classification}


def main(argv: list[str] | None = None) -> object:
    args = parse_args(argv)
    with one_sentence_errors(args.debug):  # a bad image, config or checkpoint: one sentence (--debug: the traceback)
        check_image_files([args.image])
        cfg = load_config(args.config)  # runs the config's custom_imports (import soft_mm allow-lists checkpoints)
        scope = cfg.get('default_scope')
        if scope not in TASKS:
            raise SystemExit(f'{args.config} has default_scope={scope!r}; tools/infer.py handles the scopes '
                             f'{", ".join(TASKS)} (detection, segmentation, classification).')
        if args.amp_dtype and not args.amp:
            raise SystemExit('--amp-dtype needs --amp')
        state_dict = read_model_checkpoint(args.checkpoint)  # before a model is built
        if not args.amp:
            result = TASKS[scope](args, cfg, state_dict)
        else:
            device_type = torch.device(args.device).type
            amp_dtype = enable_test_amp(cfg, args.amp_dtype)
            if device_type == 'cpu':  # also on a GPU machine told --device cpu: CPU autocast is bfloat16 only
                enable_cpu_bf16_ops()
                amp_dtype = 'bfloat16'
            with torch.autocast(device_type, dtype=getattr(torch, amp_dtype)):
                result = TASKS[scope](args, cfg, state_dict)
        if args.compile:
            print(compiled_graphs_note(args.compile), flush=True)
        return result


if __name__ == '__main__':
    main()
