"""Export the SOFT backbone or the SOFT classifier to ONNX with dynamic batch, height and width, and check it.

    python tools/deployment/export_onnx.py backbone --arch tiny --soft-norm --out work_dirs/onnx/soft_norm_tiny.onnx
    python tools/deployment/export_onnx.py backbone --config configs/retinanet_soft_tiny_demo.py \\
        --checkpoint work_dirs/retinanet_soft_tiny_demo/epoch_4.pth --out work_dirs/onnx/retinanet_backbone.onnx
    python tools/deployment/export_onnx.py classifier --model soft_norm_tiny --checkpoint soft_norm_tiny_in1k.pth

The graph is recorded by ``torch.onnx.export(..., dynamo=True)`` (on torch < 2.7 by its TorchScript-based exporter)
at ``--size`` (default 224x224) with the batch, height and width symbolic, then onnxruntime runs it at every
``--check`` size and the largest absolute difference to PyTorch is printed per output (exit status 1 above
``--atol``). The backbone's outputs are the NCHW maps of its ``out_indices`` (``out0`` ... at strides 4/8/16/32), the
classifier's the logits.

Valid sizes: height and width of at least :func:`min_side` (193 px for the default 7x7 landmark grid with conv
landmarks), where every SOFT stage has its full landmark grid, so the number of landmarks is the same at every size
the graph accepts. Below that the landmark count itself depends on the size; export such a model with a smaller
``landmark_grid`` instead.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from soft_mm.cli.config_loading import load_config
from soft_mm.cli.errors import DEBUG_HELP, ConfigError, one_sentence_errors
from soft_mm.ops.compat import HAS_IS_EXPORTING
from soft_mm.utils.checkpoint.reader import CheckpointFileError, read_checkpoint, state_dict_of
from soft_mm.utils.sizes import size_arg

MAX_SIDE = 8192
DEFAULT_EXPORT_SIZE = (224, 224)
DEFAULT_CHECK_SIZES = ((257, 193), (320, 448))
# float32 outputs of the whole pyramid: onnxruntime and PyTorch order their sums differently
DEFAULT_ATOL = 1e-3


def min_side(model: nn.Module) -> int:
    """Smallest input height/width at which every SOFT attention layer of ``model`` has its full landmark grid.

    A SOFT layer at stride ``s`` (4, 8, 16 for stages 1-3) sees ``ceil(side / s)`` tokens per side and has
    ``min(grid, ceil(tokens / landmark_stride))`` landmarks per side in conv mode (``min(grid, tokens)`` in avg mode),
    so the grid is full once ``side > (grid - 1) * s * landmark_stride``.
    """
    from soft_mm.models import SoftAttention

    side = 1
    for stage_index, stage in enumerate(model.stages):
        stride = 4 * 2 ** stage_index
        for module in stage.modules():
            if isinstance(module, SoftAttention):
                sampler_stride = module.landmark_stride if module.landmark_mode == 'conv' else 1
                side = max(side, (module.landmark_grid - 1) * stride * sampler_stride + 1)
    return side


class _TupleOutputs(nn.Module):
    """Wraps the backbone so that its outputs are a plain tuple (named ``out0``, ``out1``, ... in the graph)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(x)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)


def build_backbone(arch: str = 'tiny', soft_norm: bool = False, config: str | None = None,
                   checkpoint: str | None = None) -> nn.Module:
    """The ``SOFT`` backbone in eval mode: from ``config``'s ``model.backbone`` if given, else from ``arch`` /
    ``soft_norm``; ``checkpoint`` (a backbone, classifier or detector/segmenter checkpoint) is loaded into it."""
    from soft_mm.models import SOFT

    if config is not None:
        cfg = load_config(config)
        backbone_cfg = dict(cfg.model.backbone)
        if backbone_cfg.pop('type') not in ('SOFT', 'soft_mm.SOFT'):
            raise ConfigError(f"{config} has a model.backbone that is not SOFT: this tool exports type='SOFT' "
                              'backbones (pass a config with a SOFT backbone, or --arch)')
        backbone_cfg.pop('init_cfg', None)
        model = SOFT(**backbone_cfg)
    else:
        model = SOFT(arch, soft_norm=soft_norm)
    if checkpoint is not None:
        _load_weights(model, checkpoint, prefix='backbone.')
    return model.eval()


def build_classifier(name: str = 'soft_tiny', checkpoint: str | None = None, num_classes: int | None = None,
                     ) -> nn.Module:
    """A timm SOFT classifier (``soft_tiny`` ... ``soft_norm_huge``) in eval mode, ``checkpoint`` loaded into it."""
    import timm

    import soft_mm  # noqa: F401  (registers the timm entrypoints)

    if name not in timm.list_models('soft_*'):
        raise ValueError(f'--model {name!r} is not a SOFT timm model; allowed: {", ".join(timm.list_models("soft_*"))}')
    kwargs = {} if num_classes is None else {'num_classes': num_classes}
    model = timm.create_model(name, **kwargs)
    if checkpoint is not None:
        _load_weights(model, checkpoint, prefix='')
    return model.eval()


def _load_weights(model: nn.Module, path: str, prefix: str) -> None:
    """Load ``path`` (read by soft_mm's one checkpoint reader) into ``model``: every weight of the model must be in it,
    or a :class:`CheckpointFileError` names the file and the first missing weight."""
    state = state_dict_of(read_checkpoint(path), path)
    if prefix and any(key.startswith(prefix) for key in state):
        state = {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    if missing:
        raise CheckpointFileError(path, f'lacks {len(missing)} of the model\'s {len(own)} weights (e.g. '
                                  f'{missing[0]!r})', 'pass a checkpoint of the same arch')
    model.load_state_dict({key: value for key, value in state.items() if key in own})


def export(model: nn.Module, out: str | Path, size: Sequence[int] = DEFAULT_EXPORT_SIZE, max_side: int = MAX_SIDE,
           ) -> Path:
    """Record ``model`` on a ``(1, C, *size)`` input and write an ONNX file with symbolic batch, height and width
    (each side in ``min_side(model) .. max_side``). Tuple outputs are named ``out0``, ``out1``, ..."""
    low = min_side(model)
    if min(size) < low or max(size) > max_side:
        raise ValueError(f'--size {tuple(size)} must have both sides in {low}..{max_side} for this model')
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    x = torch.randn(1, model.in_channels, *size)
    with torch.no_grad():
        sample = model(x)
    is_tuple = isinstance(sample, (tuple, list))
    wrapped = _TupleOutputs(model) if is_tuple else model
    names = [f'out{i}' for i in range(len(sample))] if is_tuple else ['logits']
    if not HAS_IS_EXPORTING:
        # torch < 2.7 cannot tell torch.export from torch.compile (the model would keep soft_mm's custom ops, which
        # have no ONNX translation): the TorchScript-based exporter, whose trace the model recognises as an export
        with torch.no_grad():
            torch.onnx.export(wrapped.eval(), (x,), str(out), input_names=['input'], output_names=names,
                              dynamic_axes={'input': {0: 'batch', 2: 'height', 3: 'width'}}, opset_version=17)
        return out
    dims = {0: torch.export.Dim('batch', min=1, max=1024), 2: torch.export.Dim('height', min=low, max=max_side),
            3: torch.export.Dim('width', min=low, max=max_side)}
    with torch.no_grad():
        torch.onnx.export(wrapped.eval(), (x,), str(out), input_names=['input'], output_names=names,
                          dynamic_shapes={'x': dims}, dynamo=True, verbose=False)
    return out


def check(model: nn.Module, onnx_path: str | Path, sizes: Sequence[Sequence[int]], batch: int = 2,
          seed: int = 0) -> list[tuple[tuple[int, int], list[float]]]:
    """Largest absolute difference between onnxruntime and PyTorch for each output, at each ``(height, width)``."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=['CPUExecutionProvider'])
    input_name = session.get_inputs()[0].name
    generator = torch.Generator().manual_seed(seed)
    results = []
    for height, width in sizes:
        x = torch.randn(batch, model.in_channels, height, width, generator=generator)
        with torch.no_grad():
            expected = model(x)
        expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
        got = session.run(None, {input_name: x.numpy()})
        if [tuple(g.shape) for g in got] != [tuple(e.shape) for e in expected]:
            raise RuntimeError(f'onnxruntime output shapes {[g.shape for g in got]} differ from PyTorch '
                               f'{[tuple(e.shape) for e in expected]} at {height}x{width}')
        errors = [float((torch.from_numpy(g) - e).abs().max()) for g, e in zip(got, expected)]
        results.append(((height, width), errors))
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('target', choices=('backbone', 'classifier'), help='what to export')
    parser.add_argument('--arch', default='tiny', help='backbone arch (tiny, small, medium, large, huge)')
    parser.add_argument('--soft-norm', action='store_true', help='SOFT-Norm backbone')
    parser.add_argument('--config', help='take the backbone from this mmdet/mmseg config (model.backbone)')
    parser.add_argument('--model', default='soft_tiny', help='timm classifier name (soft_tiny ... soft_norm_huge)')
    parser.add_argument('--num-classes', type=int, help='classifier classes (default: the timm default, 1000)')
    parser.add_argument('--checkpoint', help='weights to load (backbone, classifier or detector/segmenter checkpoint)')
    parser.add_argument('--out', help='ONNX file (default: work_dirs/onnx/<target>.onnx)')
    parser.add_argument('--size', type=size_arg, default=DEFAULT_EXPORT_SIZE, help='export size HxW (default 224x224)')
    parser.add_argument('--max-side', type=int, default=MAX_SIDE, help='largest height/width the graph accepts')
    parser.add_argument('--check', type=size_arg, nargs='*', default=list(DEFAULT_CHECK_SIZES),
                        help='sizes HxW at which onnxruntime is compared with PyTorch (none: skip)')
    parser.add_argument('--atol', type=float, default=DEFAULT_ATOL, help='largest accepted absolute difference')
    parser.add_argument('--debug', action='store_true', help=DEBUG_HELP)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with one_sentence_errors(args.debug):  # a bad config or checkpoint: one sentence (--debug: the traceback)
        if args.target == 'backbone':
            model = build_backbone(args.arch, args.soft_norm, args.config, args.checkpoint)
        else:
            model = build_classifier(args.model, args.checkpoint, args.num_classes)
    out = export(model, args.out or f'work_dirs/onnx/{args.target}.onnx', args.size, args.max_side)
    print(f'wrote {out} (batch, height, width dynamic; sides {min_side(model)}..{args.max_side})')
    worst = 0.0
    for (height, width), errors in check(model, out, args.check):
        worst = max([worst, *errors])
        print(f'{height}x{width}: max |onnxruntime - torch| per output: ' + ', '.join(f'{e:.2e}' for e in errors))
    if worst > args.atol:
        print(f'difference {worst:.2e} exceeds --atol {args.atol:.0e}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
