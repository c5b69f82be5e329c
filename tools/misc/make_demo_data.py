"""Write the synthetic data of the demo configs: the shapes dataset with the label maps of the segmentation demo, and
the class-folder data of the ImageNet demo (the demo configs also write whatever is missing themselves).

    python tools/misc/make_demo_data.py [--root data/shapes] [--num-train N] [--num-val N] [--seed S] [--force]
                                   [--classes-root data/synthetic_classes]
"""
from __future__ import annotations

import argparse
import os.path as osp
import shutil

from soft_mm.datasets.synthetic_classes import ensure_classes_dataset
from soft_mm.datasets.synthetic_shapes import ensure_semantic_labels, ensure_shapes_dataset


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description='Write the synthetic shapes dataset (COCO format).')
    parser.add_argument('--root', default='data/shapes', help='dataset folder (the demo configs read data/shapes)')
    # unset options keep write_shapes_dataset's defaults, which are the demo configs' settings
    for option in ('--num-train', '--num-val', '--image-size', '--max-objects', '--seed'):
        parser.add_argument(option, type=int)
    parser.add_argument('--classes-root', default='data/synthetic_classes',
                        help='the class-folder data of configs/soft_tiny_in1k_demo.py (written with its defaults)')
    parser.add_argument('--force', action='store_true', help='replace existing dataset folders')
    args = parser.parse_args(argv)
    for root in (args.root, args.classes_root) if args.force else ():
        if osp.isdir(root):
            shutil.rmtree(root)
    options = ('num_train', 'num_val', 'image_size', 'max_objects', 'seed')
    # each writer says what it writes and when it is done
    if not ensure_shapes_dataset(args.root, **{k: getattr(args, k) for k in options if getattr(args, k) is not None}):
        print(f'{args.root} exists; kept it (use --force to rewrite)')
    ensure_semantic_labels(args.root)  # the segmentation demo's label maps, drawn from the COCO polygons
    if not ensure_classes_dataset(args.classes_root):
        print(f'{args.classes_root} exists; kept it (use --force to rewrite)')


if __name__ == '__main__':
    main()
