"""The command-line arguments the runner tools share: config, work dir, config options, launcher, precision."""
from __future__ import annotations

import argparse
import os

from mmengine.config import DictAction

from .errors import DEBUG_HELP
from .runtime import AMP_DTYPES, COMPILE_BACKENDS, LAUNCHERS


def base_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every runner tool takes: config, --work-dir, --cfg-options, --launcher, --local-rank, --debug."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='where logs and checkpoints go (default: work_dirs/<config name>)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. train_cfg.max_epochs=2 model.backbone.init_cfg=None')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none', help='job launcher')
    parser.add_argument('--local-rank', '--local_rank', type=int, default=0)  # set by torch.distributed.launch
    parser.add_argument('--debug', action='store_true', help=DEBUG_HELP)
    return parser


def add_precision_args(parser: argparse.ArgumentParser, amp_help: str, compile: bool = True) -> None:
    """``--amp`` (its help ``amp_help``), ``--amp-dtype`` and, with ``compile``, ``--compile [BACKEND]``: the
    precision and compilation arguments of train.py (no ``--compile``), test.py and infer.py."""
    parser.add_argument('--amp', action='store_true', help=amp_help)
    parser.add_argument('--amp-dtype', choices=AMP_DTYPES, default=None,
                        help='with --amp on a GPU: float16 (default) or bfloat16; on CPU only bfloat16')
    if compile:
        parser.add_argument('--compile', nargs='?', const='inductor', default=None, choices=COMPILE_BACKENDS,
                            metavar='BACKEND',
                            help='compile the backbone with torch.compile for inference (default backend inductor, '
                                 'weights frozen into the graph; pays under --amp on CPU, see README); the first '
                                 'forward compiles')


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, exporting ``LOCAL_RANK`` for mmengine as torch.distributed.launch expects."""
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args

