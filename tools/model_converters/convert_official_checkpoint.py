"""Convert the SOFT authors' ImageNet checkpoint (fudan-zvg/SOFT layout) to soft_mm's layout.

    python tools/model_converters/convert_official_checkpoint.py SRC DST [--soft-norm]
        [--key auto|state_dict|state_dict_ema|model] [--allow-unsafe-load] [--debug]

DST holds ``{'state_dict', 'meta'}`` and loads into ``SoftVisionTransformer`` (see
``soft_mm.models.checkpoint_conversion.build_classifier_from_checkpoint``) and, through
``init_cfg=dict(type='Pretrained', checkpoint=DST)``, into the ``SOFT`` backbone. The weights do not say whether they
are SOFT-Norm: pass ``--soft-norm`` for the ``*_norm`` checkpoints. The mapping and the arch inference are in
``soft_mm/models/official/layout.py``.

SRC is read by soft_mm's one checkpoint reader (``soft_mm.utils.checkpoint.reader.read_checkpoint``:
``torch.load(weights_only=True)``, ``argparse.Namespace`` allow-listed for timm's files); a file that holds other
pickled objects is refused unless ``--allow-unsafe-load`` is given, which unpickles it fully and can run code stored
in it. DST is written atomically (a temporary file renamed into place). A file that cannot be read or
converted stops with one sentence (``--debug``: the traceback).
"""
from __future__ import annotations

import argparse
import os.path as osp
import sys
from collections.abc import Mapping
from typing import Any

from soft_mm.models import ARCH_SETTINGS, resolve_arch
from soft_mm.models.arch import ARCH_KEYS
from soft_mm.models.checkpoint_conversion import (
    CHECKPOINT_KEYS,
    OFFICIAL_FILE_HINT,
    convert_official_checkpoint,
    save_converted_checkpoint,
)
from soft_mm.models.official.layout import match_arch
from soft_mm.utils.checkpoint.reader import CheckpointFileError, UnsafeCheckpointError

UNSAFE_LOAD_HINT = 'only if you trust the file, pass --allow-unsafe-load (full unpickling can run code stored in it)'


def describe_arch(arch: str | Mapping[str, Any]) -> str:
    """One line: the table name, or the custom settings and how they differ from the closest table entry."""
    if isinstance(arch, str):
        return f'{arch!r} (the table entry)'
    settings = resolve_arch(dict(arch))
    name = match_arch(settings)
    if name is not None:
        return f'{name!r} (the table entry)'
    diffs = {n: [k for k in ARCH_KEYS if resolve_arch(n)[k] != settings[k]] for n in ARCH_SETTINGS}

    def distance(name: str) -> tuple[int, float]:  # differing settings, then how far apart they are
        table = resolve_arch(name)
        gap = sum(abs(a - b) for k in diffs[name] for a, b in zip(*(
            v if isinstance(v, tuple) else (v,) for v in (table[k], settings[k]))))
        return len(diffs[name]), gap

    closest = min(diffs, key=distance)
    table = resolve_arch(closest)
    changes = ', '.join(f'{k} {settings[k]} (table: {table[k]})' for k in diffs[closest])
    return f'a custom arch, not in the table: closest is {closest!r}, but {changes}'


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Convert an official SOFT checkpoint to soft_mm's layout.")
    parser.add_argument('src', help="the authors' checkpoint (timm/DeiT-style dict or bare state dict)")
    parser.add_argument('dst', help='output file')
    parser.add_argument('--soft-norm', action='store_true',
                        help='the checkpoint is SOFT-Norm (the *_norm releases); not readable from the weights')
    parser.add_argument('--key', default='auto', choices=('auto', *CHECKPOINT_KEYS),
                        help='where the weights are; auto takes state_dict or model, EMA weights only if alone')
    parser.add_argument('--no-verify', action='store_true',
                        help='skip the strict load into SoftVisionTransformer (it builds the model)')
    parser.add_argument('--allow-unsafe-load', action='store_true',
                        help='if the safe loader refuses SRC (pickled objects other than tensors and '
                             'argparse.Namespace), read it with torch.load(weights_only=False), which can run code: '
                             'trusted files only')
    parser.add_argument('--debug', action='store_true', help='show the traceback of an error')
    return parser.parse_args(argv)


def _reading_error(error: Exception) -> str | None:
    """The one sentence for an unusable SRC (this command line's advice for a refused pickle), or None if reading SRC
    was not the problem."""
    if isinstance(error, UnsafeCheckpointError):
        return str(CheckpointFileError(error.path, error.problem, UNSAFE_LOAD_HINT))
    return str(error) if isinstance(error, CheckpointFileError) else None


def _settings_line(arch: str | dict) -> str:
    settings = resolve_arch(arch)
    return ', '.join(f'{k}={settings[k]}' for k in ('embed_dims', 'num_heads', 'depths'))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        converted = convert_official_checkpoint(args.src, soft_norm=args.soft_norm, key=args.key,
                                                allow_pickle=args.allow_unsafe_load, verify=not args.no_verify)
    except (ValueError, TypeError) as error:  # the file's (or an argument's) fault; bugs keep their traceback
        if args.debug:
            raise
        message = _reading_error(error) or f'cannot convert {args.src}: {error}; {OFFICIAL_FILE_HINT}.'
        print(f'error: {message}', file=sys.stderr)
        return 1
    arch = converted.arch
    print(f'read    {args.src} [{converted.source_key or "bare state dict"}]: {converted.num_source_tensors} tensors')
    print(f'arch    {describe_arch(arch)}: {_settings_line(arch)}')
    if not isinstance(arch, str):
        print('        -> NOT a table arch: saved as a plain arch dict (use meta["arch"] to build the model)')
        if arch['depths'] == [1, 3, 20, 4] and resolve_arch(arch)['embed_dims'] == resolve_arch('small')['embed_dims']:
            print("        -> this is the authors' code's 'small' (depths 1,3,20,4; 38.9M parameters), not the "
                  "published 24M SOFT-Small that soft_mm's 'small' is (depths 1,3,7,4)")
    print(f'norm    soft_norm={args.soft_norm} (from --soft-norm; not stored in the weights)')
    if 'norm' in osp.basename(args.src).lower() and not args.soft_norm:
        print('warning: the file name suggests a SOFT-Norm checkpoint; pass --soft-norm if it is one', file=sys.stderr)
    print(f'unmapped {len(converted.unmapped)} key(s), dropped: {", ".join(converted.unmapped)}' if converted.unmapped
          else 'unmapped none')
    if converted.num_params is not None:
        print(f'verified strict load into SoftVisionTransformer: {converted.num_params:,} parameters')
    try:
        save_converted_checkpoint(args.dst, converted.state_dict, converted.meta)
    except OSError as error:
        if args.debug:
            raise
        print(f'error: {args.dst} cannot be written ({error.strerror or error}): pass a file path in a folder you can '
              'write to.', file=sys.stderr)
        return 1
    print(f'wrote   {args.dst}')
    backbone = {'type': 'SOFT', 'arch': converted.meta['arch'], 'soft_norm': args.soft_norm,
                'init_cfg': {'type': 'Pretrained', 'checkpoint': args.dst}}
    print(f'backbone config: {backbone}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
