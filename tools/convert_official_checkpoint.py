"""Convert the SOFT authors' ImageNet checkpoint (fudan-zvg/SOFT layout) to soft_mm's layout.

    python tools/convert_official_checkpoint.py SRC DST [--soft-norm] [--key auto|state_dict|state_dict_ema|model]

DST holds ``{'state_dict', 'meta'}`` and loads into ``SoftVisionTransformer`` (see
``soft_mm.converters.build_classifier_from_checkpoint``) and, through ``init_cfg=dict(type='Pretrained',
checkpoint=DST)``, into the ``SOFT`` backbone. The weights do not say whether they are SOFT-Norm: pass ``--soft-norm``
for the ``*_norm`` checkpoints. The mapping and the arch inference are in ``soft_mm/converters/official.py``.
"""
from __future__ import annotations

import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))  # soft_mm from a plain checkout too
from soft_mm.converters.official import (
    AUTHORS_SETTINGS,
    CHECKPOINT_KEYS,
    convert_official_state_dict,
    describe_arch,
    load_official_checkpoint,
    make_meta,
    num_classes_of,
    save_converted_checkpoint,
    verify_converted,
)
from soft_mm.models import resolve_arch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Convert an official SOFT checkpoint to soft_mm's layout.")
    parser.add_argument('src', help="the authors' checkpoint (timm/DeiT-style dict or bare state dict)")
    parser.add_argument('dst', help='output file')
    parser.add_argument('--soft-norm', action='store_true',
                        help='the checkpoint is SOFT-Norm (the *_norm releases); not readable from the weights')
    parser.add_argument('--key', default='auto', choices=('auto',) + CHECKPOINT_KEYS,
                        help='where the weights are; auto takes state_dict or model, EMA weights only if alone')
    parser.add_argument('--no-verify', action='store_true',
                        help='skip the strict load into SoftVisionTransformer (it builds the model)')
    parser.add_argument('--safe-only', action='store_true',
                        help='never fall back to torch.load(weights_only=False) for files with pickled objects')
    return parser.parse_args(argv)


def _settings_line(arch: str | dict) -> str:
    settings = resolve_arch(arch)
    return ', '.join(f'{k}={settings[k]}' for k in ('embed_dims', 'num_heads', 'depths'))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        official, key = load_official_checkpoint(args.src, args.key, allow_pickle=not args.safe_only)
        converted, arch, unmapped = convert_official_state_dict(official)
        num_params = None if args.no_verify else verify_converted(converted, arch)
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f'error: cannot convert {args.src}: {error}', file=sys.stderr)
        return 1
    print(f'read    {args.src} [{key or "bare state dict"}]: {len(official)} tensors')
    print(f'arch    {describe_arch(arch)}: {_settings_line(arch)}')
    if not isinstance(arch, str):
        print('        -> NOT a table arch: saved as a plain arch dict (use meta["arch"] to build the model)')
        if arch['depths'] == [1, 3, 20, 4] and resolve_arch(arch)['embed_dims'] == resolve_arch('small')['embed_dims']:
            print("        -> this is the authors' code's 'small' (depths 1,3,20,4; 38.9M parameters), not the "
                  "published 24M SOFT-Small that soft_mm's 'small' is (depths 1,3,7,4)")
    print(f'norm    soft_norm={args.soft_norm} (from --soft-norm; not stored in the weights)')
    if 'norm' in osp.basename(args.src).lower() and not args.soft_norm:
        print('warning: the file name suggests a SOFT-Norm checkpoint; pass --soft-norm if it is one', file=sys.stderr)
    if unmapped:
        print(f'unmapped {len(unmapped)} key(s), dropped: {", ".join(unmapped)}')
    else:
        print('unmapped none')
    if num_params is not None:
        print(f'verified strict load into SoftVisionTransformer: {num_params:,} parameters')
    meta = make_meta(arch, args.soft_norm, source=osp.basename(args.src), source_key=key,
                     num_classes=num_classes_of(converted))
    save_converted_checkpoint(args.dst, converted, meta)
    print(f'wrote   {args.dst}')
    backbone = {'type': 'SOFT', 'arch': meta['arch'], 'soft_norm': args.soft_norm, **AUTHORS_SETTINGS,
                'init_cfg': {'type': 'Pretrained', 'checkpoint': args.dst}}
    print(f'backbone config: {backbone}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
