"""Detect objects in one image and write the image with the detections drawn by mmdet's visualizer.

    python tools/infer.py IMAGE CONFIG CHECKPOINT [--out detections.png] [--score-thr 0.3] [--device cpu]

Prints the output path and one line per drawn detection (class, score, box).
"""
from __future__ import annotations

import argparse
import os.path as osp
import sys

import mmcv
import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))  # soft_mm from a plain checkout too
from soft_mm.utils import allow_mmengine_checkpoint_globals


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Draw a detector\'s predictions on an image.')
    parser.add_argument('image', help='input image file')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out', default=None, help='output image (default: <image name>_det.png next to the input)')
    parser.add_argument('--score-thr', type=float, default=0.3, help='draw detections scoring at least this')
    parser.add_argument('--device', default='cuda:0' if torch.cuda.is_available() else 'cpu')
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    for path in (args.image, args.config, args.checkpoint):
        if not osp.isfile(path):
            raise SystemExit(f'{path} not found: pass an existing image, config and checkpoint.')
    allow_mmengine_checkpoint_globals()
    from mmdet.apis import inference_detector, init_detector
    from mmdet.registry import VISUALIZERS

    model = init_detector(args.config, args.checkpoint, device=args.device)
    result = inference_detector(model, args.image)
    visualizer = VISUALIZERS.build(model.cfg.visualizer)
    visualizer.dataset_meta = model.dataset_meta
    out = args.out or osp.splitext(args.image)[0] + '_det.png'
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


if __name__ == '__main__':
    main()
