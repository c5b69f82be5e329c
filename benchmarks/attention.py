"""Time, peak memory and FLOP rate of SOFT attention against softmax attentions as the token count grows.

    python benchmarks/attention.py                  # 3k .. 267k tokens, all methods, CPU (<= 10 min on 2 cores)
    python benchmarks/attention.py --sizes 56 200x334 --methods soft_op plain_math --repeats 5
    python benchmarks/attention.py --device cuda --out work_dirs/bench_attention_cuda

Methods (stage-1 setting of SOFT-Small: ``--dim`` 64 channels, ``--heads`` 2 of 32 dims, 7x7 = 49 landmarks):

* ``soft_op``: ``soft_mm.ops.soft_attention`` on given q, landmarks (49, pooled from q) and v: the op alone.
* ``plain_math``: the same math written plainly in PyTorch (``soft_mm.ops.naive_soft_attention``: the N×m kernel in
  full, Newton-Schulz, three products), the baseline the op's speed-up is measured against in the same run.
* ``soft_conv``, ``soft_avg``, ``soft_norm_conv``, ``soft_norm_avg``: the whole ``soft_mm.models.SoftAttention`` layer
  (projections, landmark sampler, value conv), plain and SOFT-Norm, conv and avg landmarks.
* ``sdpa``: exact softmax attention, ``F.scaled_dot_product_attention`` on (1, heads, N, 32).
* ``nystrom_softmax``: Nyströmformer-style softmax Nyström attention (49 pooled landmarks, iterative pseudo-inverse).
* ``pvt_sra``: PVT's spatial-reduction attention (keys/values from a stride-8 conv + LayerNorm: N x N/64 softmax).

Each (method, size) runs in a fresh subprocess: peak memory is the rise of its peak RSS (``VmHWM``, reset after the
inputs are built) over the resident size before the first call, on CUDA ``max_memory_allocated``; times are the median
of ``--repeats`` runs after a warm-up (forward under ``no_grad``; forward+backward = forward, then backward of a
random projection of the output into every input). A case whose first forward+backward run exceeded
``--max-case-s`` is timed once, and a quadratic method is then not run at larger sizes: its time there is estimated
as ``t * (N / N_measured)^2`` and marked ``est.`` in the table and dashed in the plot.

FLOP count (multiply-adds count 2), per head, of the SOFT math with d = head dim, m = landmarks, i = Newton
iterations: forward ``2 (3 N m d + 2 i m^3)``, forward+backward ``2 (9 N m d + 2 i m^3)`` (the kernel matmul and the two
products; the backward doubles them); softmax attention ``4 N S d`` forward and ``12 N S d`` forward+backward with S
keys. Achieved GFLOP/s are divided by the rate of a 1024^3 float32 matmul timed in the same subprocess, just before
the case, so the fraction of sgemm is measured under the same load. The time and memory exponents are least-squares
slopes of log(value) against log(N) over the measured sizes.

Writes ``attention_benchmark.md`` (the tables), ``attention_benchmark.png`` and ``attention_benchmark.json`` to
``--out``. Compare ratios measured in one run; the machine's other load moves absolute numbers.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from harness import (
    PeakMemory,
    add_case_arguments,
    add_sizes_argument,
    figure,
    gemm_gflops,
    glibc_malloc_note,
    run_in_fresh_process,
    save_figure,
    timed,
    write_results,
)
from torch import nn

from soft_mm.ops import naive_soft_attention

SOFT_LAYERS = {'soft_conv': ('conv', False), 'soft_avg': ('avg', False), 'soft_norm_conv': ('conv', True),
               'soft_norm_avg': ('avg', True)}
QUADRATIC = ('sdpa', 'pvt_sra')
METHODS = ('soft_op', 'plain_math', *SOFT_LAYERS, 'sdpa', 'nystrom_softmax', 'pvt_sra')
# Tokens of the stage-1 map (stride 4) of 224^2, 448^2, 512x512, 1333x800 (800x1336 -> 200x334), 2x and 4x its pixels.
DEFAULT_SIZES = ('56', '112', '128', '200x334', '283x472', '400x668')
LANDMARK_GRID = 7
NEWTON_ITERS = 20
SR_RATIO = 8  # PVT's stage-1 spatial reduction
SGEMM_SIZE = 1024


def nystrom_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw_shape: tuple[int, int],
                    grid: int = LANDMARK_GRID, pinv_iters: int = 6) -> torch.Tensor:
    """Nyströmformer-style attention: ``softmax(Q Lk^T) pinv(softmax(Lq Lk^T)) softmax(Lq K^T) V``, landmarks by
    average pooling of the q and k maps to ``grid x grid``, pseudo-inverse by its cubic iteration. (B,h,N,d) each."""
    b, h, _, d = q.shape
    scale = d ** -0.5

    def pool(x: torch.Tensor) -> torch.Tensor:
        x_map = x.reshape(b * h, *hw_shape, d).permute(0, 3, 1, 2)
        pooled = F.adaptive_avg_pool2d(x_map, [min(grid, s) for s in hw_shape])
        return pooled.flatten(2).transpose(1, 2).reshape(b, h, -1, d)

    q_land, k_land = pool(q), pool(k)
    kernel_1 = torch.softmax(scale * q @ k_land.transpose(-2, -1), -1)  # (B, h, N, m)
    kernel_2 = torch.softmax(scale * q_land @ k_land.transpose(-2, -1), -1)  # (B, h, m, m)
    kernel_3 = torch.softmax(scale * q_land @ k.transpose(-2, -1), -1)  # (B, h, m, N)
    eye = torch.eye(kernel_2.shape[-1], dtype=q.dtype, device=q.device)
    inv = kernel_2.transpose(-2, -1) / (kernel_2.abs().sum(-2).amax(-1) * kernel_2.abs().sum(-1).amax(-1))[
        ..., None, None]
    for _ in range(pinv_iters):
        kv = kernel_2 @ inv
        inv = 0.25 * inv @ (13 * eye - kv @ (15 * eye - kv @ (7 * eye - kv)))
    return kernel_1 @ (inv @ (kernel_3 @ v))


class SpatialReductionAttention(nn.Module):
    """PVT's attention: keys and values from the map reduced by a stride-``sr_ratio`` conv and a LayerNorm."""

    def __init__(self, dim: int, num_heads: int, sr_ratio: int = SR_RATIO) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.sr = nn.Conv2d(dim, dim, sr_ratio, sr_ratio)
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, hw_shape: tuple[int, int]) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.num_heads, -1).transpose(1, 2)
        reduced = self.sr(x.transpose(1, 2).reshape(b, c, *hw_shape)).flatten(2).transpose(1, 2)
        k, v = self.kv(self.norm(reduced)).reshape(b, -1, 2, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


def num_landmarks(hw_shape: tuple[int, int]) -> int:
    return min(LANDMARK_GRID, hw_shape[0]) * min(LANDMARK_GRID, hw_shape[1])


def case_flops(method: str, hw_shape: tuple[int, int], dim: int, heads: int) -> tuple[float, float]:
    """(forward, forward+backward) FLOPs of the attention core of ``method`` (see the module docstring)."""
    n, d = hw_shape[0] * hw_shape[1], dim // heads
    if method in ('sdpa', 'pvt_sra'):
        keys = n if method == 'sdpa' else math.ceil(hw_shape[0] / SR_RATIO) * math.ceil(hw_shape[1] / SR_RATIO)
        return 4.0 * heads * n * keys * d, 12.0 * heads * n * keys * d
    m = num_landmarks(hw_shape)
    newton = 2 * NEWTON_ITERS * m ** 3
    return 2.0 * heads * (3 * n * m * d + newton), 2.0 * heads * (9 * n * m * d + newton)


def build_case(method: str, hw_shape: tuple[int, int], dim: int, heads: int,
               device: torch.device) -> tuple[Callable[[], torch.Tensor], list[torch.Tensor]]:
    """A closure running the method once and the tensors that receive gradients."""
    torch.manual_seed(0)
    n, d = hw_shape[0] * hw_shape[1], dim // heads
    if method in SOFT_LAYERS or method == 'pvt_sra':
        if method == 'pvt_sra':
            layer = SpatialReductionAttention(dim, heads)
        else:
            from soft_mm.models import SoftAttention
            mode, soft_norm = SOFT_LAYERS[method]
            layer = SoftAttention(dim, heads, landmark_mode=mode, landmark_stride=8, landmark_grid=LANDMARK_GRID,
                                  v_conv_kernel=9, soft_norm=soft_norm)
        layer = layer.to(device)
        x = torch.randn(1, n, dim, device=device)
        return (lambda: layer(x, hw_shape)), [x, *layer.parameters()]
    q, k, v = (torch.randn(1, heads, n, d, device=device) for _ in range(3))
    q = q * d ** -0.25
    if method == 'sdpa':
        return (lambda: F.scaled_dot_product_attention(q, k, v)), [q, k, v]
    if method == 'nystrom_softmax':
        return (lambda: nystrom_softmax(q, k, v, hw_shape)), [q, k, v]
    q_map = q.reshape(heads, *hw_shape, d).permute(0, 3, 1, 2)
    landmarks = F.adaptive_avg_pool2d(q_map, [min(LANDMARK_GRID, s) for s in hw_shape])
    landmarks = landmarks.flatten(2).transpose(1, 2).reshape(1, heads, -1, d).contiguous()
    if method == 'soft_op':
        from soft_mm.ops import soft_attention
        return (lambda: soft_attention(q, landmarks, v)), [q, landmarks, v]
    return (lambda: naive_soft_attention(q, landmarks, v)), [q, landmarks, v]


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One (method, size) case in this process: memory first (one call each), then the timings."""
    device = torch.device(spec['device'])
    hw_shape = tuple(spec['hw_shape'])
    fn, leaves = build_case(spec['method'], hw_shape, spec['dim'], spec['heads'], device)
    probe = fn().detach()
    grad_out = torch.randn_like(probe)
    for leaf in leaves:
        leaf.requires_grad_(True)
    del probe

    def forward() -> None:
        with torch.no_grad():
            fn()

    def forward_backward() -> None:
        out = fn()
        torch.autograd.backward(out, grad_out)
        for leaf in leaves:
            leaf.grad = None

    memory = PeakMemory(device)
    memory.start()
    forward()
    fwd_mib = memory.peak_mib()
    first_fwd_bwd = timed(forward_backward, device)  # also the warm-up
    fwd_bwd_mib = memory.peak_mib()
    sgemm = gemm_gflops(device, size=SGEMM_SIZE)
    slow = first_fwd_bwd > spec['max_case_s']  # timed once (forward, and the forward+backward above)
    fwd_times = [timed(forward, device) for _ in range(1 if slow else spec['repeats'])]
    fwd_bwd_times = [first_fwd_bwd] if slow else [timed(forward_backward, device) for _ in range(spec['repeats'])]
    return dict(fwd_ms=statistics.median(fwd_times) * 1e3, fwd_bwd_ms=statistics.median(fwd_bwd_times) * 1e3,
                fwd_peak_mib=fwd_mib, fwd_bwd_peak_mib=fwd_bwd_mib, sgemm_gflops=sgemm,
                slow=slow)


def run_case(spec: dict[str, Any], glibc_malloc: str) -> dict[str, Any]:
    """Run one case in a fresh interpreter (same environment) and return its json result."""
    result, stderr = run_in_fresh_process(__file__, spec, glibc_malloc)
    if result is None:
        raise RuntimeError(f"case {spec['method']} {spec['hw_shape']} failed:\n{stderr[-3000:]}")
    return result


def fit_exponent(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y against log x (None with fewer than two positive points)."""
    pairs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y is not None and y > 0]
    if len(pairs) < 2:
        return None
    mean_x = sum(p[0] for p in pairs) / len(pairs)
    mean_y = sum(p[1] for p in pairs) / len(pairs)
    var = sum((p[0] - mean_x) ** 2 for p in pairs)
    return None if var == 0 else sum((p[0] - mean_x) * (p[1] - mean_y) for p in pairs) / var


def _fmt(value: float | None, spec: str = '.1f') -> str:
    return '–' if value is None else format(value, spec)


def markdown_tables(rows: list[dict[str, Any]], methods: list[str], fits: dict[str, dict[str, Any]],
                    header: str) -> str:
    lines = [header, '', '| method | map | tokens | fwd ms | fwd+bwd ms | fwd MiB | fwd+bwd MiB | fwd+bwd GFLOP/s '
             '| of sgemm |', '|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        est = ' (est.)' if r['estimated'] else ''
        frac = None if r['sgemm_gflops'] is None or r['gflops'] is None else r['gflops'] / r['sgemm_gflops']
        lines.append(f"| {r['method']} | {r['hw_shape'][0]}x{r['hw_shape'][1]} | {r['tokens']} | "
                     f"{_fmt(r['fwd_ms'])}{est} | {_fmt(r['fwd_bwd_ms'])}{est} | {_fmt(r['fwd_peak_mib'])} | "
                     f"{_fmt(r['fwd_bwd_peak_mib'])} | {_fmt(r['gflops'])} | {_fmt(frac, '.0%')} |")
    lines += ['', '| method | time exponent fwd | fwd+bwd | memory exponent fwd | fwd+bwd |', '|---|---|---|---|---|']
    for method in methods:
        f = fits[method]
        lines.append(f"| {method} | {_fmt(f['fwd_ms'], '.2f')} | {_fmt(f['fwd_bwd_ms'], '.2f')} | "
                     f"{_fmt(f['fwd_peak_mib'], '.2f')} | {_fmt(f['fwd_bwd_peak_mib'], '.2f')} |")
    ratio_lines = []
    by_key = {(r['method'], r['tokens']): r for r in rows}
    for r in rows:
        if r['method'] != 'soft_op' or r['fwd_bwd_ms'] is None:
            continue
        parts = []
        for other in ('plain_math', 'sdpa', 'pvt_sra', 'nystrom_softmax'):
            o = by_key.get((other, r['tokens']))
            if o is not None and o['fwd_bwd_ms'] is not None:
                est = ' est.' if o['estimated'] else ''
                parts.append(f"{o['fwd_bwd_ms'] / r['fwd_bwd_ms']:.2f}x vs {other}{est}")
        if parts:
            ratio_lines.append(f"- {r['tokens']} tokens, soft_op forward+backward: " + ', '.join(parts))
    if ratio_lines:
        lines += ['', 'Speed-up of `soft_op` (time of the other method / time of soft_op):', '', *ratio_lines]
    return '\n'.join(lines) + '\n'


def plot(rows: list[dict[str, Any]], methods: list[str], title: str, path: Path) -> None:
    fig, axes = figure(3, (15, 4.5))
    keys = (('fwd_ms', 'forward time (ms)'), ('fwd_bwd_ms', 'forward+backward time (ms)'),
            ('fwd_bwd_peak_mib', 'forward+backward peak memory (MiB)'))
    for ax, (key, label) in zip(axes, keys):
        for i, method in enumerate(methods):
            pts = [r for r in rows if r['method'] == method and r[key] is not None and r[key] > 0]
            measured = [r for r in pts if not r['estimated']]
            color = f'C{i % 10}'
            if measured:
                ax.loglog([r['tokens'] for r in measured], [r[key] for r in measured], 'o-', color=color,
                          label=method, ms=4)
            estimated = [r for r in pts if r['estimated']]
            if estimated:
                link = measured[-1:] + estimated
                ax.loglog([r['tokens'] for r in link], [r[key] for r in link], 'x--', color=color, ms=4,
                          label=None if measured else method)
        ax.set_xlabel('tokens N')
        ax.set_ylabel(label)
        ax.grid(True, which='both', alpha=0.3)
    axes[0].legend(fontsize=7)
    save_figure(fig, title, path, fontsize=9)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sizes_argument(parser, DEFAULT_SIZES, 'token maps')
    parser.add_argument('--methods', nargs='+', default=list(METHODS), choices=METHODS, metavar='METHOD',
                        help=f'methods to run (default: all of {", ".join(METHODS)})')
    parser.add_argument('--dim', type=int, default=64, help='channels (default: 64, SOFT stage 1)')
    parser.add_argument('--heads', type=int, default=2, help='heads (default: 2)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--threads', type=int, default=None, help='torch threads (default: torch default)')
    parser.add_argument('--repeats', type=int, default=3, help='timed runs per case (median; default 3)')
    parser.add_argument('--max-case-s', type=float, default=4.0,
                        help='a quadratic method whose forward+backward took longer is estimated at larger sizes')
    parser.add_argument('--out', default='work_dirs/benchmark_attention', help='folder for the table, plot and json')
    add_case_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker:
        return args
    if args.dim % args.heads:
        parser.error(f'--dim ({args.dim}) must be divisible by --heads ({args.heads})')
    if args.repeats < 1:
        parser.error(f'--repeats must be >= 1, got {args.repeats}')
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))))
        return 0
    if args.threads:
        os.environ['OMP_NUM_THREADS'] = str(args.threads)
    device = torch.device(args.device)
    rows = []
    slow: dict[str, dict[str, Any]] = {}  # quadratic methods past --max-case-s: their last measured row
    print(f'device={device} threads={torch.get_num_threads()} dim={args.dim} heads={args.heads} '
          f'landmarks<={LANDMARK_GRID ** 2}; median of {args.repeats}')
    print(f"{'method':>16} {'map':>9} {'tokens':>7} {'fwd ms':>9} {'fwd+bwd ms':>11} {'fwd MiB':>8} "
          f"{'f+b MiB':>8} {'GFLOP/s':>8} {'sgemm':>7}")
    for hw_shape in sorted(args.sizes, key=lambda s: s[0] * s[1]):
        tokens = hw_shape[0] * hw_shape[1]
        for method in args.methods:
            flops_fwd, flops_fwd_bwd = case_flops(method, hw_shape, args.dim, args.heads)
            row = dict(method=method, hw_shape=list(hw_shape), tokens=tokens, flops_fwd=flops_fwd,
                       flops_fwd_bwd=flops_fwd_bwd, estimated=False)
            if method in slow:
                scale = (tokens / slow[method]['tokens']) ** 2
                row.update(fwd_ms=slow[method]['fwd_ms'] * scale, fwd_bwd_ms=slow[method]['fwd_bwd_ms'] * scale,
                           fwd_peak_mib=None, fwd_bwd_peak_mib=None, sgemm_gflops=None, gflops=None,
                           estimated=True)
            else:
                spec = dict(method=method, hw_shape=list(hw_shape), dim=args.dim, heads=args.heads,
                            device=args.device, repeats=args.repeats, max_case_s=args.max_case_s)
                result = run_case(spec, args.glibc_malloc)
                row.update(result)
                row['gflops'] = flops_fwd_bwd / row['fwd_bwd_ms'] / 1e6
                if result['slow'] and method in QUADRATIC:
                    slow[method] = row
            rows.append(row)
            est = ' est.' if row['estimated'] else ''
            print(f"{method:>16} {f'{hw_shape[0]}x{hw_shape[1]}':>9} {tokens:>7} {row['fwd_ms']:>9.1f} "
                  f"{row['fwd_bwd_ms']:>11.1f}{est} {_fmt(row['fwd_peak_mib']):>8} "
                  f"{_fmt(row['fwd_bwd_peak_mib']):>8} {_fmt(row['gflops']):>8} {_fmt(row['sgemm_gflops']):>7}",
                  flush=True)
    fits = {}
    for method in args.methods:
        measured = [r for r in rows if r['method'] == method and not r['estimated']]
        fits[method] = {key: fit_exponent([r['tokens'] for r in measured], [r[key] for r in measured])
                        for key in ('fwd_ms', 'fwd_bwd_ms', 'fwd_peak_mib', 'fwd_bwd_peak_mib')}
    header = (f'Attention benchmark: device {device}, {torch.get_num_threads()} threads, dim {args.dim}, '
              f'{args.heads} heads, <= {LANDMARK_GRID ** 2} landmarks, median of {args.repeats}; '
              f'{glibc_malloc_note(args.glibc_malloc)}; '
              'est. = estimated from the largest measured size by N^2 scaling (not run).')
    table = markdown_tables(rows, args.methods, fits, header)
    out = write_results(args.out, 'attention_benchmark', table, args, rows=rows, exponents=fits)
    plot(rows, args.methods, header, out / 'attention_benchmark.png')
    print(f'saved attention_benchmark.md, .png and .json in {out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
