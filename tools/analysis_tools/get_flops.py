"""Parameters and FLOPs of SOFT models, counted by mmengine's ``FlopAnalyzer`` (JIT trace, fvcore rules).

    python tools/analysis_tools/get_flops.py                  # all ten classifiers at 224x224 vs the published table
    python tools/analysis_tools/get_flops.py --arch tiny [--soft-norm] [--shape H W]
    python tools/analysis_tools/get_flops.py --config CONFIG [--shape H W]  # an mmdet/mmseg config: backbone, model
    python tools/analysis_tools/get_flops.py --checkpoint CONVERTED         # the classifier of a converted checkpoint
                                                            # (tools/model_converters/convert_official_checkpoint.py)

FLOPs are multiply-accumulates (one fused multiply-add = 1), the convention of the published table, which is read from
the ImageNet metafile (configs/metafiles/soft_imagenet.yml). mmengine counts
conv, linear, matmul/bmm, norms, upsampling and pooling; one handle is added through ``set_op_handle``, for PyTorch's
``scaled_dot_product_attention`` (stage 4). The trace records soft_mm's Newton-Schulz inverse as plain matmuls; the
tool shows their share as its own ``newton_inverse`` operator (counted by ``soft_mm.utils.flops.newton_macs``).
Element-wise ops (add, mul, exp, GELU,
softmax, ...) are left out, as in fvcore; the tool lists the ones it met.
"""
from __future__ import annotations

import argparse
import os.path as osp
import sys
from pathlib import Path
from typing import Any

import torch
import yaml
from mmengine.analysis import parameter_count
from torch import nn

from soft_mm.cli.config_loading import load_config
from soft_mm.cli.errors import DEBUG_HELP, one_sentence_errors
from soft_mm.models import ARCH_SETTINGS, AUTHORS_SETTINGS, SoftVisionTransformer, variant_name
from soft_mm.models.checkpoint_conversion import build_classifier_from_checkpoint
from soft_mm.models.official.layout import match_arch
from soft_mm.utils.flops import analyze

DEFAULT_SHAPES = {'mmdet': (800, 1333), 'mmseg': (512, 512)}
# configs/ two folders up: beside tools/ in the checkout and in an installed soft_mm/.mim
IMAGENET_METAFILE = Path(__file__).resolve().parents[2] / 'configs' / 'metafiles' / 'soft_imagenet.yml'


def published_figures() -> dict[str, dict[str, Any]]:
    """``{timm model name: {'params_m': ..., 'gflops': ...}}``: the published parameters (millions) and GFLOPs at
    224x224 of each classifier, as the ImageNet metafile states them."""
    figures = {}
    for model in yaml.safe_load(IMAGENET_METAFILE.read_text())['Models']:
        meta = model['Metadata']
        if 'FLOPs (billions)' in meta:  # the published classifiers (the demo has none)
            figures[meta['Backbone Model']] = {'params_m': meta['Parameters (millions)'],
                                               'gflops': meta['FLOPs (billions)']}
    return figures


def classifier(arch: str, soft_norm: bool) -> SoftVisionTransformer:
    """A 1000-class classifier with the authors' attention settings (the defaults)."""
    return SoftVisionTransformer(arch, soft_norm=soft_norm, num_classes=1000).eval()


def _gmacs(value: float) -> str:
    return f'{value / 1e9:.2f}'


def _counted_line(by_operator: dict[str, int], skipped: list[str]) -> str:
    elementwise = [op.removeprefix('aten::') for op in skipped]
    added = [op for op in ('newton_inverse', 'scaled_dot_product_attention') if op in by_operator]
    line = f'counted: {", ".join(sorted(by_operator))}'
    line += f' ({" and ".join(added)} through handles added here)' if added else ''
    line += f'; not counted (no mmengine handle: element-wise and other cheap ops): {", ".join(elementwise)}'
    return line


def classifier_table(shape: tuple[int, int]) -> list[dict[str, Any]]:
    rows = []
    for arch in ARCH_SETTINGS:
        for soft_norm in (False, True):
            stats = analyze(classifier(arch, soft_norm), (torch.randn(1, 3, *shape),))
            rows.append({'variant': variant_name(arch, soft_norm), 'arch': arch, **stats})
    return rows


def print_table(rows: list[dict[str, Any]], shape: tuple[int, int]) -> None:
    settings = AUTHORS_SETTINGS
    print(f'SOFT classifiers (1000 classes, {settings.landmark_mode} landmarks, {settings.newton_iters} Newton '
          f'iterations) at {shape[0]}x{shape[1]}; '
          'FLOPs in GMACs')
    header = (f"{'variant':<18}{'params':>13}{'M':>8}{'published M':>13}{'GMACs':>8}{'w/o Newton':>12}"
              f"{'published G':>13}")
    print(header)
    print('-' * len(header))
    figures = published_figures()
    for row in rows:
        published = figures[row['variant']]
        newton = row['by_operator'].get('newton_inverse', 0)
        print(f"{row['variant']:<18}{row['params']:>13,}{row['params'] / 1e6:>8.2f}{published['params_m']:>13}"
              f"{_gmacs(row['flops']):>8}{_gmacs(row['flops'] - newton):>12}{published['gflops']:>13}")
    skipped = sorted({op for row in rows for op in row['skipped']})
    print(_counted_line(rows[0]['by_operator'], skipped))
    print(f'"w/o Newton" leaves out the Newton-Schulz iterations (2 * {settings.newton_iters} * 49^3 MACs per head '
          'and SOFT block), '
          'which the published FLOPs appear not to include.')


def print_single(name: str, stats: dict[str, Any], shape: tuple[int, int], published: dict | None = None) -> None:
    params = f"{stats['params']:,} ({stats['params'] / 1e6:.2f}M"
    params += f"; published {published['params_m']}M)" if published else ')'
    flops = f"{_gmacs(stats['flops'])} GMACs"
    newton = stats['by_operator'].get('newton_inverse', 0)
    if newton:
        flops += f' ({_gmacs(stats["flops"] - newton)} without the Newton-Schulz iterations'
        flops += f"; published {published['gflops']}G)" if published else ')'
    print(f'{name} at {shape[0]}x{shape[1]}: params {params}, FLOPs {flops}')
    print('by operator (GMACs): ' + ', '.join(f'{op} {_gmacs(v)}' for op, v in sorted(stats['by_operator'].items())))
    print(_counted_line(stats['by_operator'], stats['skipped']))


# ---------------------------------------------------------------------------------------------------------------------
# mmdet / mmseg configs


class _TensorForward(nn.Module):
    """``model(inputs, data_samples, mode='tensor')`` of an OpenMMLab model as a one-argument module."""

    def __init__(self, model: nn.Module, data_samples: list | None) -> None:
        super().__init__()
        self.model = model
        self.data_samples = data_samples

    def forward(self, inputs: torch.Tensor) -> Any:
        return self.model(inputs, self.data_samples, mode='tensor')


def _data_samples(scope: str, shape: tuple[int, int]) -> list | None:
    """One data sample with the image metainfo that two-stage detectors read in ``mode='tensor'``."""
    if scope != 'mmdet':
        return None
    from mmdet.structures import DetDataSample

    meta = {'img_shape': shape, 'ori_shape': shape, 'pad_shape': shape, 'batch_input_shape': shape,
            'scale_factor': (1.0, 1.0)}
    return [DetDataSample(metainfo=meta)]


def build_from_config(config: str) -> tuple[nn.Module, str]:
    """The model of an mmengine config (``custom_imports`` imported, the config's default scope)."""
    from mmengine.registry import MODELS, init_default_scope

    cfg = load_config(config)  # a missing or broken config: one sentence; runs the config's custom_imports
    scope = cfg.get('default_scope') or 'mmengine'
    init_default_scope(scope)
    return MODELS.build(cfg.model).eval(), scope


def config_report(config: str, shape: tuple[int, int] | None) -> None:
    model, scope = build_from_config(config)
    shape = tuple(shape or DEFAULT_SHAPES.get(scope, (224, 224)))
    inputs = (torch.randn(1, 3, *shape),)
    backbone = getattr(model, 'backbone', model)
    print_single(f'{osp.basename(config)}: backbone {type(backbone).__name__}', analyze(backbone, inputs), shape)
    if backbone is model:
        return
    params = parameter_count(model)['']
    try:
        stats = analyze(_TensorForward(model, _data_samples(scope, shape)), inputs)
    except Exception as error:  # a head whose forward needs real annotations: report what we have
        print(f'whole model: params {params:,} ({params / 1e6:.2f}M); FLOPs not counted '
              f"(forward(mode='tensor') failed: {type(error).__name__}: {error})")
        return
    print_single(f'{osp.basename(config)}: whole model {type(model).__name__}', stats, shape)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Params and FLOPs (MACs) of SOFT models with mmengine.analysis.')
    source = parser.add_mutually_exclusive_group()
    source.add_argument('--arch', choices=tuple(ARCH_SETTINGS), help='one classifier (default: the table of all ten)')
    source.add_argument('--config', help='an mmdet/mmseg config: counts its backbone and whole model')
    source.add_argument('--checkpoint', help='a file written by tools/model_converters/convert_official_checkpoint.py: '
                                             'its classifier')
    parser.add_argument('--soft-norm', action='store_true', help='with --arch: the SOFT-Norm classifier')
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                        help='input size (default 224 224; for configs 800 1333 (mmdet) or 512 512 (mmseg))')
    parser.add_argument('--debug', action='store_true', help=DEBUG_HELP)
    args = parser.parse_args(argv)
    if args.soft_norm and not args.arch:
        parser.error('--soft-norm needs --arch')
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with one_sentence_errors(args.debug):  # a bad config or checkpoint file: one sentence (--debug: the traceback)
        return report(args)


def report(args: argparse.Namespace) -> int:
    """Print what the arguments ask for: a config's counts, a converted checkpoint's, one arch's or the table."""
    if args.config:
        config_report(args.config, args.shape)
        return 0
    shape = tuple(args.shape or (224, 224))
    if args.checkpoint:
        model = build_classifier_from_checkpoint(args.checkpoint).eval()
        stats = analyze(model, (torch.randn(1, 3, *shape),))
        arch = match_arch(model.arch_settings)  # a zoo name, or None for a custom arch (no published numbers)
        published = published_figures().get(variant_name(arch, model.soft_norm)) if arch else None
        print_single(osp.basename(args.checkpoint), stats, shape, published if shape == (224, 224) else None)
        return 0
    if args.arch:
        stats = analyze(classifier(args.arch, args.soft_norm), (torch.randn(1, 3, *shape),))
        name = variant_name(args.arch, args.soft_norm)
        print_single(name, stats, shape, published_figures()[name] if shape == (224, 224) else None)
        return 0
    print_table(classifier_table(shape), shape)
    return 0


if __name__ == '__main__':
    sys.exit(main())
