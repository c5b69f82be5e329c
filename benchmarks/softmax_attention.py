"""Stage 4's softmax attention in bfloat16 CPU inference: PyTorch's bfloat16 kernel against the float32 core of
``soft_mm.ops.functional.sdpa`` (the casts included), at the stage-4 token counts of detection inputs, side by side in
one process, with each one's error against float64.

    python benchmarks/softmax_attention.py                     # SOFT-Small's stage 4 at 800x1344 and 1600x2688
    python benchmarks/softmax_attention.py --sizes 512x512 --heads 16 --head-dim 32 --rounds 3

Cases, on the same bfloat16 ``(1, heads, N, head_dim)`` operands, forward under ``no_grad``: ``bfloat16`` (PyTorch's
kernel on them, ``F.scaled_dot_product_attention`` called directly) and ``float32_core`` (``softmax_attention``: float32
copies attended, the result cast back), interleaved per round. Errors against the float64 attention of the same
operands: the mean absolute error and the fraction of outputs equal to the float64 result rounded to bfloat16. Run it
under the allocator setting the other benchmarks use (``MALLOC_MMAP_THRESHOLD_=4294967296
MALLOC_TRIM_THRESHOLD_=68719476736``, benchmarks/harness.py); the table's header says which one it ran under.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from harness import (
    add_rounds_arguments,
    add_sizes_argument,
    check_positive,
    cpu_model,
    glibc_malloc_note,
    interleaved_medians,
    write_results,
)

from soft_mm.ops.functional.sdpa import softmax_attention

CPU = torch.device('cpu')
CASES = ('bfloat16', 'float32_core')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_sizes_argument(parser, ['800x1344', '1600x2688'], 'input sizes (stage 4 has ceil(H/32) x ceil(W/32) tokens)')
    parser.add_argument('--heads', type=int, default=16, help="heads (default: 16, SOFT-Small's stage 4)")
    parser.add_argument('--head-dim', type=int, default=32, help='dims per head (default: 32)')
    add_rounds_arguments(parser, 'work_dirs/softmax_attention')
    args = parser.parse_args(argv)
    check_positive(parser, args, 'heads', 'head_dim')
    return args


def run_case(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The case ``name`` of :data:`CASES` on the operands, without gradients."""
    attend = softmax_attention if name == 'float32_core' else F.scaled_dot_product_attention
    with torch.no_grad():
        return attend(q, k, v)


def measure(tokens: int, heads: int, head_dim: int, rounds: int, repeats: int) -> dict[str, dict[str, float]]:
    """Per case: forward milliseconds (median over rounds), mean absolute error against float64 and the fraction of
    outputs equal to the float64 result rounded to bfloat16."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, tokens, head_dim, generator=gen).to(torch.bfloat16) for _ in range(3))
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    rounded = exact.to(torch.bfloat16)
    results: dict[str, dict[str, float]] = {}
    for name in CASES:
        out = run_case(name, q, k, v)
        results[name] = dict(mean_error=(out.double() - exact).abs().mean().item(),
                             correctly_rounded=(out == rounded).double().mean().item())
    times = interleaved_medians({name: lambda name=name: run_case(name, q, k, v) for name in CASES}, rounds, repeats,
                                CPU)
    for name in CASES:
        results[name]['ms'] = 1000 * times[name]
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    allocator = 'tuned' if os.environ.get('MALLOC_MMAP_THRESHOLD_') else 'default'
    header = (f'CPU bfloat16 inference, {torch.get_num_threads()} threads, {cpu_model()}, '
              f'{glibc_malloc_note(allocator)}; {args.heads} heads of {args.head_dim}; median of {args.repeats} calls '
              f'per round, median of {args.rounds} interleaved rounds')
    rows = []
    for h, w in args.sizes:
        tokens = -(-h // 32) * -(-w // 32)
        rows.append(dict(hw=[h, w], tokens=tokens,
                         **measure(tokens, args.heads, args.head_dim, args.rounds, args.repeats)))
    lines = [header, '', '| input | stage-4 tokens | bfloat16 kernel ms | float32 core ms | bfloat16 / float32 core | '
             'mean error vs float64: bfloat16 kernel | float32 core | correctly rounded: bfloat16 kernel | '
             'float32 core |', '|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        b, f = r['bfloat16'], r['float32_core']
        lines.append(f"| {r['hw'][0]}x{r['hw'][1]} | {r['tokens']} | {b['ms']:.2f} | {f['ms']:.2f} | "
                     f"{b['ms'] / f['ms']:.2f}x | {b['mean_error']:.2e} | {f['mean_error']:.2e} | "
                     f"{100 * b['correctly_rounded']:.1f}% | {100 * f['correctly_rounded']:.2f}% |")
    write_results(args.out, 'softmax_attention', '\n'.join(lines) + '\n', args, header=header, rows=rows)
    return 0


if __name__ == '__main__':
    sys.exit(main())
