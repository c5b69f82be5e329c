"""Full-resolution segmentation on CPU with a SOFT UperNet: time and peak memory of slide and whole-image inference.

    python benchmarks/seg_full_res.py                     # configs/upernet_soft_small_ade20k.py, random weights
    python benchmarks/seg_full_res.py --mode slide --size 512x2048        # one mode, one size (HEIGHTxWIDTH)
    python benchmarks/seg_full_res.py --checkpoint work_dirs/.../iter_160000.pth

Runs ``model.inference`` (mmseg's ``EncoderDecoder``) on one random image per row: ``slide`` uses the config's
``test_cfg`` (512x512 windows, stride 341 for the ADE20K configs), ``whole`` the full image in one pass. Each row runs
in a fresh process (:func:`harness.run_in_fresh_process`, in this process's environment), so "peak MiB" is the rise of
that process's peak resident memory above the memory it held after building the model (:class:`harness.PeakMemory`):
what the inference itself needed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from harness import PeakMemory, add_case_arguments, run_in_fresh_process

DEFAULT_CONFIG = 'configs/upernet_soft_small_ade20k.py'
DEFAULT_ROWS = (('slide', (512, 2048)), ('whole', (1024, 2048)))
MODES = ('slide', 'whole')


def run_one(config: str, mode: str, size: tuple[int, int], checkpoint: str | None = None,
            crop: int | None = None, stride: int | None = None, return_logits: bool = False) -> dict:
    """Build the segmenter of ``config`` and run one ``size`` image through ``model.inference`` in ``mode``.

    Returns mode, size, test_cfg, ``logits_shape`` (1, classes, H, W), seconds, ``peak_mib`` and ``finite``; with
    ``return_logits`` also the logits tensor.
    """
    import torch
    from mmengine.registry import init_default_scope

    import soft_mm  # noqa: F401
    from soft_mm.cli.config_loading import load_config

    if mode not in MODES:
        raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
    cfg = load_config(config)
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    from mmseg.registry import MODELS

    cfg.model.backbone.init_cfg = None
    test_cfg = {'mode': mode}
    if mode == 'slide':
        crop_size = (crop, crop) if crop else tuple(cfg.model.test_cfg.get('crop_size', (512, 512)))
        stride_hw = (stride, stride) if stride else tuple(cfg.model.test_cfg.get('stride', (341, 341)))
        test_cfg.update(crop_size=crop_size, stride=stride_hw)
    cfg.model.test_cfg = test_cfg
    cfg.model.data_preprocessor.size = None
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    if checkpoint:
        from mmengine.runner import load_checkpoint
        load_checkpoint(model, checkpoint, map_location='cpu')
    height, width = size
    image = torch.randn(1, 3, height, width)
    meta = [{'img_shape': (height, width), 'ori_shape': (height, width), 'pad_shape': (height, width),
             'padding_size': [0, 0, 0, 0]}]
    memory = PeakMemory(torch.device('cpu'))
    memory.start()
    start = time.perf_counter()
    with torch.no_grad():
        logits = model.inference(image, meta)
    seconds = time.perf_counter() - start
    row = {'mode': mode, 'size': [height, width],
           'test_cfg': {k: list(v) if isinstance(v, tuple) else v for k, v in test_cfg.items()},
           'logits_shape': list(logits.shape), 'seconds': seconds, 'peak_mib': memory.peak_mib(),
           'finite': bool(torch.isfinite(logits).all())}
    if return_logits:
        row['logits'] = logits
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    from soft_mm.utils.sizes import size_arg

    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--config', default=DEFAULT_CONFIG)
    parser.add_argument('--checkpoint')
    parser.add_argument('--mode', choices=MODES, help='one mode (default: slide 512x2048 and whole 1024x2048)')
    parser.add_argument('--size', type=size_arg, help='HEIGHTxWIDTH of the one row (with --mode)')
    parser.add_argument('--crop', type=int, help='slide window side (default: the config test_cfg.crop_size)')
    parser.add_argument('--stride', type=int, help='slide stride (default: the config test_cfg.stride)')
    parser.add_argument('--threads', type=int, help='torch.set_num_threads in each run')
    add_case_arguments(parser, glibc_malloc=False)  # the rows run in this process's environment
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        if spec['threads']:
            import torch
            torch.set_num_threads(spec['threads'])
        print(json.dumps(run_one(spec['config'], spec['mode'], tuple(spec['size']), spec['checkpoint'], spec['crop'],
                                 spec['stride'])))
        return []
    rows_to_run = [(args.mode, args.size or dict(DEFAULT_ROWS)[args.mode])] if args.mode else list(DEFAULT_ROWS)
    rows = []
    for mode, (height, width) in rows_to_run:
        spec = dict(config=args.config, mode=mode, size=[height, width], checkpoint=args.checkpoint, crop=args.crop,
                    stride=args.stride, threads=args.threads)
        row, stderr = run_in_fresh_process(__file__, spec, glibc_malloc=None)
        if row is None:
            sys.exit(f'{mode} {height}x{width} failed:\n{stderr[-2000:]}')
        rows.append(row)
    print(f'{args.config} on CPU ({"random weights" if not args.checkpoint else args.checkpoint})')
    print(f'{"mode":>6} {"H x W":>11} {"test_cfg":>34} {"seconds":>8} {"peak MiB":>9}')
    for row in rows:
        cfg_text = ', '.join(f'{k}={v}' for k, v in row['test_cfg'].items() if k != 'mode') or '-'
        print(f'{row["mode"]:>6} {"x".join(map(str, row["size"])):>11} {cfg_text:>34} {row["seconds"]:8.1f} '
              f'{row["peak_mib"]:9.0f}')
    return rows


if __name__ == '__main__':
    main()
