"""Eager runs, where a GPU waits for Python to launch its kernels: SOFT-Norm-Small's forward and training step with
the package's eager savings on and off, beside Swin-T and ConvNeXt-T, with the launches each makes; and the value
conv in its two layouts.

    python benchmarks/eager_launches.py                 # CUDA if present: batch 2 x 800x1344, bfloat16 autocast
    python benchmarks/eager_launches.py --device cpu --sizes 64x96 --batch 1 --dtype float32 --rounds 1

The savings (on in the package): the landmark sampler's pooling matrices built once per size, device and dtype
instead of by a dozen small kernels in every layer (``soft_mm.ops.functional.pooling``), and on CUDA the value conv of
large filters through PyTorch's NCHW depthwise kernel instead of cuDNN's channels-last one
(``soft_mm.ops.functional.head_conv.CUDA_NCHW_MIN_KERNEL``). ``savings off`` switches both off in the same process, so
the two are timed side by side: this script's own switch (:func:`savings`), which builds each pooling matrix on every
call, as a traced graph does, and raises the NCHW route's smallest filter above any.

1. The value convs (each SOFT stage's at the input size, SOFT-Small's filters): the channels-last map's conv as
   PyTorch routes it (cuDNN on CUDA) and through a contiguous NCHW copy (the copies in and out included), forward and
   forward + backward (the map's and the filters' gradients), in the autocast dtype.
2. The backbones: the forward (no grad) and the training step (forward + backward of the maps' means) under autocast,
   rounds interleaved; per model the launches of one forward and of one step: device kernels and their summed time
   on CUDA, on CPU the ATen operators that compute (``benchmarks/launch_counts.py``'s counter: nothing is launched
   there; the count stands for the kernels a GPU would run).

Time on a GPU is wall time (Python's launches included), synchronised after each call; on CPU run it under the
allocator setting of the other benchmarks (benchmarks/harness.py).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator

import torch
from harness import (
    add_rounds_arguments,
    add_sizes_argument,
    autocast_to,
    build_backbone,
    check_positive,
    cpu_model,
    device_kernels,
    interleaved_medians,
    patched,
    profiled_call,
    sync,
    write_results,
)
from head_conv import value_convs
from launch_counts import count

from soft_mm.ops.functional import head_conv, pooling

MODELS = ('soft_norm_small', 'swin_t', 'convnext_t')
SAVINGS_OFF = 'soft_norm_small, savings off'
DTYPES = {'bfloat16': torch.bfloat16, 'float16': torch.float16, 'float32': torch.float32}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        help='device (default: cuda if present, else cpu)')
    add_sizes_argument(parser, ['800x1344'], 'input size')
    parser.add_argument('--batch', type=int, default=2, help='images per batch (default: 2, mmdet\'s per GPU)')
    parser.add_argument('--dtype', choices=tuple(DTYPES), default='bfloat16',
                        help='autocast dtype, or float32 without autocast (default: bfloat16)')
    add_rounds_arguments(parser, 'work_dirs/eager_launches')
    args = parser.parse_args(argv)
    check_positive(parser, args, 'batch')
    try:
        device = torch.device(args.device)
    except RuntimeError as err:
        parser.error(f'--device: {err}')
    if device.type == 'cuda' and not torch.cuda.is_available():
        parser.error('--device cuda: no CUDA device is visible')
    return args


@contextlib.contextmanager
def savings(on: bool) -> Iterator[None]:
    """The package's eager savings as shipped (on) or off inside the block (patched by this benchmark, restored
    after it): off, the pooling matrices are built on every call (the eager cache's lookup replaced by the matrices'
    construction itself) and no filter takes the NCHW route."""
    if on:
        yield
        return
    built_every_call = patched(pooling, _eager_pool_matrix=lambda in_size, out_size, like, route=None:
                               pooling._pool_matrix(in_size, out_size, like))
    with built_every_call, patched(head_conv, CUDA_NCHW_MIN_KERNEL=sys.maxsize):
        yield


def with_savings(on: bool, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run inside :func:`savings` ``(on)``."""
    def run() -> object:
        with savings(on):
            return fn()
    return run


def conv_rows(args: argparse.Namespace, dtype: torch.dtype) -> list[dict]:
    """Part 1: each value conv in both layouts, forward and forward + backward, ms."""
    device, rows = torch.device(args.device), []
    for hw in args.sizes:
        for channels, heads, height, width, kernel in value_convs('small', hw):
            gen = torch.Generator().manual_seed(kernel)
            x = torch.randn(args.batch, height, width, channels, generator=gen).to(device)
            x = x.permute(0, 3, 1, 2).requires_grad_()  # channels-last, as the attention layer hands it over
            weight = (0.1 * torch.randn(heads, 1, kernel, kernel, generator=gen)).to(device).requires_grad_()
            head_dim = channels // heads
            layouts = {'channels_last': lambda x=x, w=weight, d=head_dim: head_conv._conv(x, w, d),
                       'nchw': lambda x=x, w=weight, d=head_dim: head_conv.nchw_conv(x, w, d)}
            cases: dict[str, Callable[[], object]] = {}
            for name, conv in layouts.items():
                cases[f'{name} fwd'] = _no_grad(conv)
                cases[f'{name} fwd+bwd'] = _with_grads(conv, (x, weight))
            with autocast_to(device.type, dtype):
                times = interleaved_medians(cases, args.rounds, args.repeats, device)
            rows.append(dict(hw=list(hw), map=[height, width], channels=channels, heads=heads, kernel=kernel,
                             takes='nchw' if head_conv.uses_nchw_route(device.type, kernel) else 'channels_last',
                             **{name: 1e3 * t for name, t in times.items()}))
    return rows


def _no_grad(fn: Callable[[], object]) -> Callable[[], object]:
    def run():
        with torch.no_grad():
            return fn()
    return run


def _with_grads(fn: Callable[[], torch.Tensor], leaves: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    def run():
        out = fn()
        return torch.autograd.grad(out, leaves, torch.ones_like(out))
    return run


def launches(fn: Callable[[], object], model: torch.nn.Module, device: torch.device) -> dict:
    """What one call of ``fn`` (running ``model``) launches: ``{'launches': n, 'device_ms': summed kernel time}`` on
    CUDA (the profiler's kernels), ``{'launches': n}`` on CPU (where nothing is launched: the ATen operators that
    compute, as ``benchmarks/launch_counts.py`` counts them, which stand for the kernels a GPU would run)."""
    if device.type != 'cuda':
        return dict(launches=len(count(fn, model)))
    fn()
    sync(device)
    kernels, device_ms = device_kernels(profiled_call(fn, device))
    return dict(launches=kernels, device_ms=device_ms)


def backbone_rows(args: argparse.Namespace, dtype: torch.dtype, hw: tuple[int, int]) -> list[dict]:
    """Part 2 at one input size: forward and training-step ms, and the launches of each, per model."""
    device = torch.device(args.device)
    x = torch.randn(args.batch, 3, *hw, generator=torch.Generator().manual_seed(0)).to(device)
    models = {name: build_backbone(name, hw).to(device) for name in MODELS}
    models[SAVINGS_OFF] = models['soft_norm_small']

    def forward(model):
        def run():
            with torch.no_grad(), autocast_to(device.type, dtype):
                return model.eval()(x)
        return run

    def step(model):
        def run():
            model.train()
            with autocast_to(device.type, dtype):
                maps = model(x)
            torch.autograd.backward([m.float().mean() for m in maps])
            model.zero_grad(set_to_none=True)
        return run

    cases = {f'{name} {kind}': with_savings(name != SAVINGS_OFF, make(model))
             for name, model in models.items() for kind, make in (('forward', forward), ('step', step))}
    times = interleaved_medians(cases, args.rounds, args.repeats, device)
    rows = []
    for name, model in models.items():
        with savings(name != SAVINGS_OFF):
            counts = {kind: launches(make(model), model, device)
                      for kind, make in (('forward', forward), ('step', step))}
        rows.append(dict(hw=list(hw), model=name, forward_ms=1e3 * times[f'{name} forward'],
                         step_ms=1e3 * times[f'{name} step'], forward_launches=counts['forward'],
                         step_launches=counts['step']))
    return rows


def tables(args: argparse.Namespace, convs: list[dict], backbones: list[dict]) -> str:
    device = torch.device(args.device)
    what = 'kernels' if device.type == 'cuda' else 'ATen operators'
    lines = ['## The value convs (SOFT-Small), ms', '',
             '| input | map | channels (heads) | k | channels-last fwd | NCHW fwd | channels-last fwd+bwd | '
             'NCHW fwd+bwd | the package takes |', '|---|---|---|---|---|---|---|---|---|']
    lines += [f"| {r['hw'][0]}x{r['hw'][1]} | {r['map'][0]}x{r['map'][1]} | {r['channels']} ({r['heads']}) | "
              f"{r['kernel']} | {r['channels_last fwd']:.3f} | {r['nchw fwd']:.3f} | {r['channels_last fwd+bwd']:.3f} "
              f"| {r['nchw fwd+bwd']:.3f} | {r['takes']} |" for r in convs]
    lines += ['', f'## The backbones, batch {args.batch}', '',
              f'| input | model | forward ms | training step ms | SOFT forward × | SOFT step × | {what} a forward '
              f'/ a step |' + (' their time, ms |' if device.type == 'cuda' else ''),
              '|---|---|---|---|---|---|---|' + ('---|' if device.type == 'cuda' else '')]
    for r in backbones:
        soft = next(s for s in backbones if s['hw'] == r['hw'] and s['model'] == 'soft_norm_small')
        fwd, stp = r['forward_launches'], r['step_launches']
        line = (f"| {r['hw'][0]}x{r['hw'][1]} | {r['model']} | {r['forward_ms']:.2f} | {r['step_ms']:.2f} | "
                f"{r['forward_ms'] / soft['forward_ms']:.2f}× | {r['step_ms'] / soft['step_ms']:.2f}× | "
                f"{fwd['launches']} / {stp['launches']} |")
        if device.type == 'cuda':
            line += f" {fwd['device_ms']:.2f} / {stp['device_ms']:.2f} |"
        lines.append(line)
    lines += ['', '(SOFT forward ×, SOFT step ×: the model\'s time over SOFT-Norm-Small\'s with the savings on, '
              'measured in the same rounds.)']
    return '\n'.join(lines) + '\n'


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    device_name = (torch.cuda.get_device_name(device) if device.type == 'cuda'
                   else f'CPU, {torch.get_num_threads()} threads, {cpu_model()}')
    header = (f'{device_name}; torch {torch.__version__}; '
              f'{"autocast " + args.dtype if dtype != torch.float32 else "float32"}; median of {args.repeats} calls '
              f'per round, median of {args.rounds} interleaved rounds')
    convs = conv_rows(args, dtype)
    backbones = [row for hw in args.sizes for row in backbone_rows(args, dtype, hw)]
    write_results(args.out, 'eager_launches', header + '\n\n' + tables(args, convs, backbones), args, header=header,
                  convs=convs, backbones=backbones)
    return 0


if __name__ == '__main__':
    sys.exit(main())
