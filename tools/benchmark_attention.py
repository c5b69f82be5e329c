"""Time (and, on CUDA, peak memory) of SOFT attention vs softmax attention as the token count grows.

    python tools/benchmark_attention.py                      # stage-1 of SOFT-Tiny (dim 64, 2 heads), CPU
    python tools/benchmark_attention.py --sizes 56 112 224 --device cuda --out work_dirs/bench_attention

Prints a table and saves ``attention_scaling.png`` and ``attention_scaling.json`` in ``--out``. Each row is one
square H x W map (N = H*W tokens, 56x56 = a 224 input at stride 4, 200x334 = a 1333x800 COCO image). Softmax
attention is skipped where its N x N matrix for all heads would exceed ``--max-full-gib``. Timings are the median
of ``--repeats`` runs after a warm-up; compare ratios measured in the same run, not absolute numbers across runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from soft_mm.models import SoftAttention


def _time(fn, repeats: int, device: torch.device) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.type == 'cuda':
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == 'cuda':
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _peak_mib(fn, device: torch.device) -> float | None:
    if device.type != 'cuda':
        return None
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(device) / 2 ** 20


def _fmt(value: float | None, spec: str, missing: str) -> str:
    return missing if value is None else format(value, spec)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--sizes', type=int, nargs='+', default=[28, 56, 112, 160],
                        help='square map sides H = W (default: 28 56 112 160)')
    parser.add_argument('--dim', type=int, default=64, help='channels (default: 64, SOFT stage 1)')
    parser.add_argument('--heads', type=int, default=2, help='heads (default: 2)')
    parser.add_argument('--landmark-mode', choices=('conv', 'avg'), default='conv')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--max-full-gib', type=float, default=2.0,
                        help='skip softmax attention when its N x N matrices would exceed this (GiB)')
    parser.add_argument('--out', default='work_dirs/benchmark_attention', help='folder for the plot and json')
    args = parser.parse_args()
    if any(s < 1 for s in args.sizes):
        parser.error(f'--sizes must be positive integers, got {args.sizes}')
    if args.dim % args.heads:
        parser.error(f'--dim ({args.dim}) must be divisible by --heads ({args.heads})')
    if args.repeats < 1:
        parser.error(f'--repeats must be >= 1, got {args.repeats}')
    return args


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    soft = SoftAttention(args.dim, args.heads, landmark_mode=args.landmark_mode, landmark_stride=8,
                         v_conv_kernel=9).to(device).eval()
    head_dim = args.dim // args.heads
    rows = []
    print(f'device={device} dim={args.dim} heads={args.heads} landmarks={args.landmark_mode} '
          f'(grid {soft.landmark_grid}), forward only, median of {args.repeats}; '
          'peak memory is measured on CUDA only')
    print(f"{'map':>9} {'tokens':>8} {'m':>4} {'SOFT ms':>9} {'softmax ms':>11} {'ratio':>7} "
          f"{'N*N GiB':>8} {'SOFT MiB':>9} {'softmax MiB':>12}")
    for side in args.sizes:
        n = side * side
        x = torch.randn(1, n, args.dim, device=device)
        m = int(torch.tensor(soft.landmark_shape((side, side))).prod())
        full_gib = args.heads * n * n * 4 / 2 ** 30
        qkv = torch.randn(3, 1, args.heads, n, head_dim, device=device)

        @torch.no_grad()
        def run_soft(x: torch.Tensor = x, side: int = side) -> None:
            soft(x, (side, side))

        @torch.no_grad()
        def run_softmax(qkv: torch.Tensor = qkv) -> None:
            # the math kernel materialises the N x N matrix, as softmax attention in a PVT-style stage does
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])

        soft_ms = _time(run_soft, args.repeats, device) * 1e3
        soft_mib = _peak_mib(run_soft, device)
        if full_gib <= args.max_full_gib:
            softmax_ms = _time(run_softmax, args.repeats, device) * 1e3
            softmax_mib = _peak_mib(run_softmax, device)
        else:
            softmax_ms = softmax_mib = None
        rows.append(dict(side=side, tokens=n, landmarks=m, soft_ms=soft_ms, softmax_ms=softmax_ms,
                         full_matrix_gib=full_gib, soft_peak_mib=soft_mib, softmax_peak_mib=softmax_mib))
        ratio = None if softmax_ms is None else softmax_ms / soft_ms
        print(f"{f'{side}x{side}':>9} {n:>8} {m:>4} {soft_ms:>9.1f} {_fmt(softmax_ms, '.1f', 'skipped'):>11} "
              f"{_fmt(ratio, '.2f', '-'):>7} {full_gib:>8.2f} {_fmt(soft_mib, '.0f', '-'):>9} "
              f"{_fmt(softmax_mib, '.0f', '-'):>12}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / 'attention_scaling.json').write_text(json.dumps({'args': vars(args), 'rows': rows}, indent=2))
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog([r['tokens'] for r in rows], [r['soft_ms'] for r in rows], 'o-', label='SOFT (Nyström, m bounded)')
    full = [r for r in rows if r['softmax_ms'] is not None]
    if full:
        ax.loglog([r['tokens'] for r in full], [r['softmax_ms'] for r in full], 's-', label='softmax (N x N)')
    ax.set_xlabel('tokens N')
    ax.set_ylabel('forward time (ms)')
    ax.set_title(f'attention, dim {args.dim}, {args.heads} heads, {device.type}')
    ax.grid(True, which='both', alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / 'attention_scaling.png', dpi=120)
    print(f'saved {out / "attention_scaling.png"} and {out / "attention_scaling.json"}')


if __name__ == '__main__':
    main()
