"""The value conv's training step on CPU: PyTorch's depthwise conv backward against ``head_conv``'s own (the filter
gradient as one more depthwise conv), per SOFT stage of a backbone at a detection size, side by side in one process.

    python benchmarks/head_conv.py                           # SOFT-Small's three value convs at 800x1344, 5 rounds
    python benchmarks/head_conv.py --arch tiny --sizes 512x512 --rounds 3

``soft_mm.ops.functional.head_conv.head_depthwise_conv`` takes its own backward on CPU for filters of at least
``CUSTOM_BACKWARD_MIN_KERNEL`` taps; this script measures that choice on the machine it runs on: forward + backward
(the gradients of the map and of the filters) of each SOFT stage's value conv (channels-last map, as the stages hand
it over) with PyTorch's backward (``pytorch``) and with the module's (``custom``), in float32 and under bfloat16
autocast, the two interleaved per round. Run it under the allocator setting the other benchmarks use
(``MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736``, benchmarks/harness.py); the table's header
says which one it ran under.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
from harness import (
    add_rounds_arguments,
    add_sizes_argument,
    check_positive,
    cpu_model,
    glibc_malloc_note,
    interleaved_medians,
    write_results,
)

from soft_mm.models.arch import resolve_arch
from soft_mm.ops.functional import head_conv
from soft_mm.ops.precision import autocast_cast

CPU = torch.device('cpu')
DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--arch', default='small', help='SOFT arch (default: small)')
    add_sizes_argument(parser, ['800x1344'], 'input size of the backbone')
    parser.add_argument('--dtypes', nargs='+', choices=tuple(DTYPES), default=list(DTYPES),
                        help='float32 and/or bfloat16 autocast (default: both)')
    add_rounds_arguments(parser, 'work_dirs/head_conv')
    args = parser.parse_args(argv)
    check_positive(parser, args)
    return args


def value_convs(arch: str, hw: tuple[int, int]) -> list[tuple[int, int, int, int, int]]:
    """``(channels, heads, height, width, kernel)`` of the value conv of each SOFT stage at input size ``hw``
    (stage ``i`` at stride ``4 * 2**i``, its map size rounded up as the stride-2 convs round it)."""
    settings = resolve_arch(arch)
    shapes, (h, w) = [], hw
    for i, attention in enumerate(settings['stage_attention']):
        stride = 4 * 2 ** i
        if attention == 'soft' and settings['v_conv_kernels'][i]:
            shapes.append((settings['embed_dims'][i], settings['num_heads'][i], -(-h // stride), -(-w // stride),
                           settings['v_conv_kernels'][i]))
    return shapes


def time_conv(channels: int, heads: int, height: int, width: int, kernel: int, dtype: torch.dtype, rounds: int,
              repeats: int) -> dict[str, float]:
    """Milliseconds of forward + backward of one value conv with PyTorch's backward and with the custom one."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, channels, height, width, generator=gen).contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    weight = (0.1 * torch.randn(heads, 1, kernel, kernel, generator=gen)).requires_grad_()
    head_dim = channels // heads

    def step(custom: bool):
        def run():
            with torch.autocast('cpu', dtype, enabled=dtype != torch.float32):
                out = (head_conv._head_conv_op(*autocast_cast(x, weight), head_dim) if custom
                       else head_conv._conv(x, weight, head_dim))
            torch.autograd.grad(out, (x, weight), torch.ones_like(out))
        return run

    times = interleaved_medians({'pytorch': step(False), 'custom': step(True)}, rounds, repeats, CPU)
    return {name: 1000 * t for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    allocator = 'tuned' if os.environ.get('MALLOC_MMAP_THRESHOLD_') else 'default'
    header = (f'CPU, {torch.get_num_threads()} threads, {cpu_model()}, {glibc_malloc_note(allocator)}; forward + '
              f'backward of each value conv, median of {args.repeats} calls per round, median of {args.rounds} '
              f'interleaved rounds; the module takes its own backward from k = '
              f'{head_conv.CUSTOM_BACKWARD_MIN_KERNEL}')
    rows = []
    for h, w in args.sizes:
        for channels, heads, height, width, kernel in value_convs(args.arch, (h, w)):
            for dtype in args.dtypes:
                times = time_conv(channels, heads, height, width, kernel, DTYPES[dtype], args.rounds, args.repeats)
                rows.append(dict(hw=[h, w], channels=channels, heads=heads, map=[height, width], kernel=kernel,
                                 dtype=dtype, takes='custom' if head_conv.uses_custom_backward('cpu', kernel)
                                 else 'pytorch', **times))
    lines = [header, '', f'SOFT-{args.arch.capitalize()}',
             '', '| input | map | channels (heads) | k | dtype | PyTorch backward ms | custom backward ms | '
                 'PyTorch / custom | the module takes |', '|---|---|---|---|---|---|---|---|---|']
    lines += [f"| {r['hw'][0]}x{r['hw'][1]} | {r['map'][0]}x{r['map'][1]} | {r['channels']} ({r['heads']}) | "
              f"{r['kernel']} | {r['dtype']} | {r['pytorch']:.2f} | {r['custom']:.2f} | "
              f"{r['pytorch'] / r['custom']:.2f}x | {r['takes']} |" for r in rows]
    write_results(args.out, 'head_conv', '\n'.join(lines) + '\n', args, header=header, rows=rows)
    return 0


if __name__ == '__main__':
    sys.exit(main())
