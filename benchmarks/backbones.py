"""Backbones at detection and segmentation resolutions: SOFT against mmdet's PVT and PVTv2 and timm's Swin,
ConvNeXt and EfficientViT (:func:`harness.build_backbone`), in float32 or under bfloat16 autocast.

    python benchmarks/backbones.py           # SOFT-Norm-Small, Swin-T, PVT-Small at 512^2, 1333x800, 2x, 4x
    python benchmarks/backbones.py --full    # all eleven backbones
    python benchmarks/backbones.py --models soft_norm_small swin_t convnext_t efficientvit_b2 \
        --sizes 800x1344 1600x2688 --dtype bfloat16 --rounds 3

Sizes are H x W of the (padded) input: 1333x800 images are padded to 800x1344 (divisible by 32, as mmdet's
``pad_size_divisor=32``), and the 2x / 4x rows scale both sides by sqrt(2) / 2 and pad again (1152x1920,
1600x2688). Each (model, size) runs in a fresh subprocess (batch 1, eval mode for the forward, train mode for
forward+backward, which backpropagates a random projection of every output map; ``--dtype bfloat16`` runs both under
``torch.autocast``), ``--rounds`` times with the rounds interleaved across models so that drift hits every model
alike (medians over rounds): parameters, multiply-accumulates (mmengine's ``FlopAnalyzer`` with soft_mm's op
handles, as ``tools/analysis_tools/get_flops.py`` counts them: a multiply-add once; up to ``--flops-max-pixels``
because tracing large inputs is slow), median forward and forward+backward time, the achieved GFLOP/s of the forward
(2 x MACs / time) and its fraction of the machine's GEMM rate in that dtype (a 4096^2 matmul timed in the same
process), the rise of the peak RSS (CUDA: allocator peak) during forward+backward, and, for SOFT, the forward time of
each stage (from pre-hooks on the stages' downsampling layers). Forward+backward is measured up to
``--train-max-pixels``; a model whose forward took longer than ``--max-case-s`` is not run at larger sizes (noted).
Growth ratios compare the largest size with 800x1344.

``--dtype float32 bfloat16`` runs both dtypes in one run (the rounds interleaved across models and dtypes) and then
also prints the SOFT-Norm-Small targets (:data:`TARGETS`: its speed against Swin-T and ConvNeXt-T, against its own
float32 forward, and its share of the GEMM rate) with each measured figure, the target and whether it is met.

Writes ``backbone_benchmark.md``, ``backbone_benchmark.png`` and ``backbone_benchmark.json`` to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import backbone_modes
import harness
import torch
from torch import nn

from soft_mm.utils.flops import analyze

MODELS = harness.BACKBONES
DTYPES = ('float32', 'bfloat16')
GEMM_SIZE = 4096
DEFAULT_MODELS = ('soft_norm_small', 'swin_t', 'pvt_s')
BASE_SIZE = (800, 1344)
DEFAULT_SIZES = ('512x512', '800x1344', '1152x1920', '1600x2688')
LARGE_SIZE = (1600, 2688)
# SOFT-Norm-Small's targets: (dtype, size, measure, against, at least). Measures: 'fwd' / 'fwd_bwd' (the other
# model's time over SOFT's, or SOFT's float32 forward over its own forward for against='own float32'), 'gemm' (% of
# the GEMM rate in that dtype), 'memory' (the other model's forward+backward peak over SOFT's: above 1 = SOFT lower).
TARGET_MODEL = 'soft_norm_small'
TARGETS = (
    ('bfloat16', BASE_SIZE, 'fwd', 'swin_t', 1.5), ('bfloat16', BASE_SIZE, 'fwd', 'convnext_t', 1.25),
    ('bfloat16', BASE_SIZE, 'fwd', 'own float32', 1.8), ('bfloat16', BASE_SIZE, 'gemm', None, 60),
    ('float32', BASE_SIZE, 'fwd', 'swin_t', 1.4), ('float32', BASE_SIZE, 'gemm', None, 85),
    ('float32', LARGE_SIZE, 'fwd', 'swin_t', 1.2), ('bfloat16', LARGE_SIZE, 'fwd', 'swin_t', 1.2),
    ('bfloat16', BASE_SIZE, 'fwd_bwd', 'swin_t', 1.3), ('bfloat16', BASE_SIZE, 'memory', 'swin_t', 1.0),
)


def stage_timer(model: nn.Module, device: torch.device) -> tuple[list[float], Any] | None:
    """Pre-hooks on the SOFT stages' downsampling layers and a hook on the model: per-stage times of the last call."""
    stages = getattr(model, 'stages', None)
    # SOFT stages all start with a downsampling module (Swin's last stage has downsample=None: not timed per stage)
    if stages is None or not all(isinstance(getattr(s, 'downsample', None), nn.Module) for s in stages):
        return None
    marks: list[float] = []

    def mark(*_: Any) -> None:
        harness.sync(device)
        marks.append(time.perf_counter())

    handles = [s.downsample.register_forward_pre_hook(mark) for s in stages]
    handles.append(model.register_forward_hook(mark))

    def stage_times() -> list[float]:
        last = marks[-(len(stages) + 1):]
        return [b - a for a, b in zip(last, last[1:])]

    return marks, stage_times


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    device = torch.device(spec['device'])
    dtype = getattr(torch, spec.get('dtype', 'float32'))
    torch.manual_seed(0)
    h, w = spec['hw']
    model = harness.build_backbone(spec['model'], (h, w)).to(device)
    x = torch.randn(1, 3, h, w, device=device)
    result: dict[str, Any] = dict(params=sum(p.numel() for p in model.parameters()))
    if spec['flops']:
        model.eval()
        result['gmacs'] = analyze(model, (x,))['flops'] / 1e9
    gemm_size = spec.get('gemm_size', GEMM_SIZE)
    result['gemm_gflops'] = harness.gemm_gflops(device, dtype, gemm_size)
    result['gemm_size'] = gemm_size
    autocast = harness.autocast_to(device.type, dtype)
    timer = stage_timer(model, device)
    model.eval()
    with torch.no_grad(), autocast:
        outs = model(x)  # warm-up
    result['out_dtype'] = str(outs[0].dtype).replace('torch.', '')  # what the forward ran in, read back
    grads = [torch.randn_like(o) for o in outs]
    fwd_times, stage_rows = [], []
    for _ in range(spec['repeats']):
        with torch.no_grad(), autocast:
            fwd_times.append(harness.timed(lambda: model(x), device))
        if timer is not None:
            stage_rows.append(timer[1]())
    result['fwd_s'] = statistics.median(fwd_times)
    if stage_rows:
        result['stage_s'] = [statistics.median(col) for col in zip(*stage_rows)]
    if spec['train']:
        model.train()

        def forward_backward() -> None:
            with autocast:
                outs = model(x)
            torch.autograd.backward(outs, grads)
            model.zero_grad(set_to_none=True)

        memory = harness.PeakMemory(device)
        memory.start()
        first = harness.timed(forward_backward, device)
        result['fwd_bwd_peak_mib'] = memory.peak_mib()
        times = [harness.timed(forward_backward, device) for _ in range(spec['repeats'] - 1)] or [first]
        result['fwd_bwd_s'] = statistics.median(times)
    return result


def merge_rounds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the rounds of a case: medians of the times and rates, the largest peak memory, the stage times of
    the round with the median forward, and the first round's counts."""
    merged = dict(runs[0])
    for key in ('fwd_s', 'fwd_bwd_s', 'gemm_gflops'):
        values = [r[key] for r in runs if key in r]
        if values:
            merged[key] = statistics.median(values)
    peaks = [r['fwd_bwd_peak_mib'] for r in runs if 'fwd_bwd_peak_mib' in r]
    if peaks:
        merged['fwd_bwd_peak_mib'] = max(peaks)
    middle = sorted(runs, key=lambda r: r['fwd_s'])[len(runs) // 2]
    if 'stage_s' in middle:
        merged['stage_s'] = middle['stage_s']
    merged['rounds'] = len(runs)
    return merged


def run_case(spec: dict[str, Any], glibc_malloc: str) -> dict[str, Any]:
    result, stderr = harness.run_in_fresh_process(__file__, spec, glibc_malloc)
    if result is None:
        return dict(error=stderr.strip().splitlines()[-1] if stderr.strip() else 'failed')
    return result


def _fmt(value: float | None, spec: str = '.2f') -> str:
    return '–' if value is None else format(value, spec)


def markdown(rows: list[dict[str, Any]], models: list[str], sizes: list[tuple[int, int]], header: str,
             notes: list[str]) -> str:
    lines = [header, '', '| backbone | input | params | GMACs | fwd s | fwd GFLOP/s | % of GEMM rate | fwd+bwd s | '
             'fwd+bwd peak MiB |', '|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        achieved = 2 * r['gmacs'] / r['fwd_s'] if r.get('gmacs') else None
        share = gemm_share(r)
        lines.append(f"| {r['model']} | {r['hw'][0]}x{r['hw'][1]} | {r['params'] / 1e6:.1f}M | "
                     f"{_fmt(r.get('gmacs'), '.1f')} | {_fmt(r.get('fwd_s'))} | {_fmt(achieved, '.0f')} | "
                     f"{_fmt(share, '.0f')} | {_fmt(r.get('fwd_bwd_s'))} | {_fmt(r.get('fwd_bwd_peak_mib'), '.0f')} |")
    rates = [r['gemm_gflops'] for r in rows if r.get('gemm_gflops')]
    if rates:
        gemm_size = rows[0].get('gemm_size', GEMM_SIZE)
        lines += ['', f'GEMM rate ({gemm_size}^2 matmul in the same dtype, timed in every case process): median '
                  f'{statistics.median(rates):.0f} GFLOP/s (range {min(rates):.0f}-{max(rates):.0f}).']
    soft_rows = [r for r in rows if 'stage_s' in r]
    if soft_rows:
        lines += ['', '| SOFT backbone | input | stage 1 s | stage 2 s | stage 3 s | stage 4 s |',
                  '|---|---|---|---|---|---|']
        for r in soft_rows:
            lines.append(f"| {r['model']} | {r['hw'][0]}x{r['hw'][1]} | " + ' | '.join(f'{t:.3f}' for t in r['stage_s'])
                         + ' |')
    by_key = {(r['model'], tuple(r['hw'])): r for r in rows}
    largest = max(sizes, key=lambda s: s[0] * s[1])
    if BASE_SIZE in sizes and largest != BASE_SIZE:
        pixel_ratio = largest[0] * largest[1] / (BASE_SIZE[0] * BASE_SIZE[1])
        lines += ['', f'Growth from {BASE_SIZE[0]}x{BASE_SIZE[1]} to {largest[0]}x{largest[1]} '
                  f'({pixel_ratio:.2f}x pixels), forward time:', '']
        for model in models:
            base, big = by_key.get((model, BASE_SIZE)), by_key.get((model, largest))
            if not base or not big or 'fwd_s' not in base or 'fwd_s' not in big:
                continue
            text = f"- {model}: whole backbone {big['fwd_s'] / base['fwd_s']:.2f}x"
            if 'stage_s' in base and 'stage_s' in big:
                text += ', stages ' + ', '.join(f'{b / a:.2f}x' for a, b in zip(base['stage_s'], big['stage_s']))
                text += (f", stages 1-3 together {sum(big['stage_s'][:3]) / sum(base['stage_s'][:3]):.2f}x")
            lines.append(text)
    reference = [m for m in models if m.startswith('soft_norm_small')] or [m for m in models if m.startswith('soft')]
    if reference and BASE_SIZE in sizes:
        ref = by_key.get((reference[0], BASE_SIZE))
        others = [m for m in models if m != reference[0] and 'fwd_s' in by_key.get((m, BASE_SIZE), {})]
        if ref and 'fwd_s' in ref and others:
            lines += ['', f'{reference[0]} at {BASE_SIZE[0]}x{BASE_SIZE[1]} against the others '
                      '(their time / its time; their peak memory / its peak memory):', '']
            for model in others:
                other = by_key[(model, BASE_SIZE)]
                parts = [f"forward {other['fwd_s'] / ref['fwd_s']:.2f}x"]
                if other.get('fwd_bwd_s') and ref.get('fwd_bwd_s'):
                    parts.append(f"forward+backward {other['fwd_bwd_s'] / ref['fwd_bwd_s']:.2f}x")
                if other.get('fwd_bwd_peak_mib') and ref.get('fwd_bwd_peak_mib'):
                    parts.append(f"peak memory {other['fwd_bwd_peak_mib'] / ref['fwd_bwd_peak_mib']:.2f}x")
                lines.append(f'- vs {model}: ' + ', '.join(parts))
    if notes:
        lines += ['', 'Notes:', '', *[f'- {n}' for n in notes]]
    return '\n'.join(lines) + '\n'


def gemm_share(row: dict[str, Any]) -> float | None:
    """Percent of the GEMM rate the forward achieved (2 x MACs / time), or None without a MAC count."""
    if not row.get('gmacs') or not row.get('gemm_gflops'):
        return None
    return 100 * 2 * row['gmacs'] / row['fwd_s'] / row['gemm_gflops']


def target_rows(rows: list[dict[str, Any]]) -> list[tuple[str, float | None, float]]:
    """``(what, measured figure or None, target)`` for each of :data:`TARGETS` (None: a case it needs was not run)."""
    by_key = {(r['model'], r['dtype'], tuple(r['hw'])): r for r in rows}
    out = []
    for dtype, hw, measure, against, least in TARGETS:
        soft = by_key.get((TARGET_MODEL, dtype, hw), {})
        size = f'{hw[0]}x{hw[1]}'
        if measure == 'gemm':
            out.append((f'{dtype} {size} forward, % of the {dtype} GEMM rate', gemm_share(soft) if soft else None,
                        least))
            continue
        key = {'fwd': 'fwd_s', 'fwd_bwd': 'fwd_bwd_s', 'memory': 'fwd_bwd_peak_mib'}[measure]
        other = by_key.get((TARGET_MODEL, 'float32', hw) if against == 'own float32' else (against, dtype, hw), {})
        what = {'fwd': 'forward', 'fwd_bwd': 'forward+backward', 'memory': 'forward+backward peak memory'}[measure]
        figure = other[key] / soft[key] if soft.get(key) and other.get(key) else None
        out.append((f'{dtype} {size} {what}, x {against}', figure, least))
    return out


def targets_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [f'{TARGET_MODEL} targets (ratios: the other time / its time; memory: the other peak / its peak)', '',
             '| target | measured | at least | met |', '|---|---|---|---|']
    for what, figure, least in target_rows(rows):
        met = '–' if figure is None else ('yes' if figure >= least else 'no')
        lines.append(f'| {what} | {_fmt(figure)} | {least:g} | {met} |')
    return '\n'.join(lines) + '\n'


def plot(rows: list[dict[str, Any]], models: list[str], header: str, path: Path) -> None:
    fig, axes = harness.figure(2, (11, 4.5))
    for i, model in enumerate(models):
        pts = [r for r in rows if r['model'] == model and 'fwd_s' in r]
        if pts:
            axes[0].loglog([r['hw'][0] * r['hw'][1] / 1e6 for r in pts], [r['fwd_s'] for r in pts], 'o-',
                           color=f'C{i % 10}', label=model, ms=4)
    axes[0].set_xlabel('input megapixels')
    axes[0].set_ylabel('forward time (s)')
    axes[0].grid(True, which='both', alpha=0.3)
    axes[0].legend(fontsize=7)
    first_soft = next((m for m in models if m in harness.SOFT_BACKBONES), None)
    soft = [r for r in rows if 'stage_s' in r and r['model'] == first_soft]
    if soft:
        labels = [f"{r['hw'][0]}x{r['hw'][1]}" for r in soft]
        bottom = [0.0] * len(soft)
        for stage in range(4):
            values = [r['stage_s'][stage] for r in soft]
            axes[1].bar(labels, values, bottom=bottom, label=f'stage {stage + 1}')
            bottom = [b + v for b, v in zip(bottom, values)]
        axes[1].set_ylabel(f"{soft[0]['model']} forward time per stage (s)")
        axes[1].legend(fontsize=7)
    harness.save_figure(fig, header, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', nargs='+', choices=MODELS, metavar='MODEL', default=None,
                        help=f'backbones (default: {" ".join(DEFAULT_MODELS)}; choices: {" ".join(MODELS)})')
    parser.add_argument('--full', action='store_true', help='all eleven backbones (not the _unfused A/B variants)')
    parser.add_argument('--dtype', nargs='+', choices=DTYPES, default=['float32'],
                        help='float32 and/or bfloat16 autocast for forward and forward+backward; both: one run, '
                             'interleaved, and the targets table (default: float32)')
    parser.add_argument('--rounds', type=int, default=1,
                        help='runs of every case, interleaved across models (medians over rounds; default 1)')
    harness.add_sizes_argument(parser, DEFAULT_SIZES, 'inputs')
    parser.add_argument('--repeats', type=int, default=2, help='timed runs (median; default 2, after a warm-up)')
    parser.add_argument('--train-max-pixels', type=int, default=BASE_SIZE[0] * BASE_SIZE[1],
                        help='forward+backward only up to this many pixels (default: 800x1344)')
    parser.add_argument('--flops-max-pixels', type=int, default=BASE_SIZE[0] * BASE_SIZE[1],
                        help='MACs only up to this many pixels (JIT tracing is slow; default 800x1344)')
    parser.add_argument('--max-case-s', type=float, default=10.0,
                        help='a model whose forward took longer is not run at larger sizes (default 10: PVT-Small '
                             'stops after 2x the pixels, so the default run fits in 10 minutes)')
    parser.add_argument('--gemm-size', type=int, default=GEMM_SIZE,
                        help='side of the square matmul that measures the GEMM rate (default %(default)s)')
    parser.add_argument('--modes', nargs='+', choices=backbone_modes.MODES, default=None,
                        help='instead of the table above: forward times side by side in each of these ways of '
                             'running (CPU; eager float32, eager bfloat16, torch.compile, torch.compile with '
                             'mode=max-autotune, onnxruntime), one process '
                             'per mode and size (benchmarks/backbone_modes.py)')
    parser.add_argument('--profile', action='store_true',
                        help='with --modes: also profile the SOFT model\'s forward in each mode')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default='work_dirs/benchmark_backbone')
    harness.add_case_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker:
        return args
    if args.repeats < 1:
        parser.error(f'--repeats must be >= 1, got {args.repeats}')
    if args.rounds < 1:
        parser.error(f'--rounds must be >= 1, got {args.rounds}')
    if args.gemm_size < 1:
        parser.error(f'--gemm-size must be >= 1, got {args.gemm_size}')
    full = [m for m in MODELS if not m.endswith(harness.UNFUSED_SUFFIX)]
    args.models = list(full if args.full else args.models or DEFAULT_MODELS)
    args.dtype = list(dict.fromkeys(args.dtype))
    if args.modes:
        args.modes = list(dict.fromkeys(args.modes))
        if args.device != 'cpu':
            parser.error(f'--modes measures the CPU modes; --device must be cpu, got {args.device}')
    return args


def _print_row(where: str, round_index: int, result: dict[str, Any]) -> None:
    stages = ' '.join(f'{t:.3f}' for t in result.get('stage_s', []))
    print(f"{where} {round_index + 1:>5} {result['params'] / 1e6:>6.1f}M {_fmt(result.get('gmacs'), '.1f'):>7} "
          f"{result['fwd_s']:>7.2f} {_fmt(result.get('fwd_bwd_s')):>7} {_fmt(result.get('fwd_bwd_peak_mib'), '.0f'):>8}"
          f"  {stages}", flush=True)


def measure(args: argparse.Namespace, sizes: list[tuple[int, int]], notes: list[str],
            ) -> dict[tuple[str, str, tuple[int, int]], list[dict[str, Any]]]:
    """Every (model, dtype) at every size, smallest size first, rounds interleaved across the cases, each case in a
    fresh process; a case whose forward took more than ``--max-case-s`` is not run at the larger sizes (a note says
    so, as it says of a failed case). Returns the results per case and size, one per round."""
    too_slow: set[tuple[str, str]] = set()
    results: dict[tuple[str, str, tuple[int, int]], list[dict[str, Any]]] = {}
    cases = [(model, dtype) for model in args.models for dtype in args.dtype]
    for hw in sizes:
        pixels = hw[0] * hw[1]
        for round_index in range(args.rounds):
            for model, dtype in cases:
                if (model, dtype) in too_slow:
                    if round_index == 0:
                        notes.append(f'{model} ({dtype}) at {hw[0]}x{hw[1]} not run: its forward took > '
                                     f'{args.max_case_s:g} s at a smaller size')
                    continue
                spec = dict(model=model, hw=list(hw), device=args.device, repeats=args.repeats, dtype=dtype,
                            gemm_size=args.gemm_size, train=pixels <= args.train_max_pixels,
                            flops=pixels <= args.flops_max_pixels and round_index == 0)
                result = run_case(spec, args.glibc_malloc)
                where = f"{model:>16} {dtype:>8} {f'{hw[0]}x{hw[1]}':>10}"
                if 'error' in result:
                    notes.append(f"{model} ({dtype}) at {hw[0]}x{hw[1]} (round {round_index + 1}) failed: "
                                 f"{result['error']}")
                    print(f"{where} failed: {result['error']}", flush=True)
                    continue
                results.setdefault((model, dtype, hw), []).append(result)
                _print_row(where, round_index, result)
        for model, dtype in cases:
            runs = results.get((model, dtype, hw), [])
            if runs and statistics.median(r['fwd_s'] for r in runs) > args.max_case_s:
                too_slow.add((model, dtype))
    return results


def report(args: argparse.Namespace, sizes: list[tuple[int, int]], rows: list[dict[str, Any]], notes: list[str]
           ) -> Path:
    """The tables (one per dtype, and the targets' when SOFT-Norm-Small ran), the JSON and the plot, written to
    ``--out``; returns the folder."""
    if args.flops_max_pixels < max(h * w for h, w in sizes):
        notes.append(f'MACs counted up to {args.flops_max_pixels} pixels only (--flops-max-pixels).')
    if args.train_max_pixels < max(h * w for h, w in sizes):
        notes.append(f'forward+backward measured up to {args.train_max_pixels} pixels only (--train-max-pixels).')
    headers, tables = {}, []
    for dtype in args.dtype:
        dtype_text = 'float32' if dtype == 'float32' else 'bfloat16 autocast'
        headers[dtype] = (f'Backbones, device {args.device}, {torch.get_num_threads()} threads, {dtype_text}, batch 1, '
                          f'median of {args.repeats} x {args.rounds} round(s) interleaved across models'
                          f'{" and dtypes" if len(args.dtype) > 1 else ""}; '
                          f'{harness.glibc_malloc_note(args.glibc_malloc)}')
        tables.append(markdown([r for r in rows if r['dtype'] == dtype], args.models, sizes, headers[dtype],
                               notes if dtype == args.dtype[-1] else []))
    if TARGET_MODEL in args.models:
        tables.append(targets_markdown(rows))
    out = harness.write_results(args.out, 'backbone_benchmark', '\n'.join(tables), args, rows=rows, notes=notes)
    plot([r for r in rows if r['dtype'] == args.dtype[0]], args.models, headers[args.dtype[0]],
         out / 'backbone_benchmark.png')
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(backbone_modes.run_worker(spec) if spec.get('modes_worker') else run_worker(spec)))
        return 0
    if args.modes:
        return backbone_modes.run(args, __file__)
    sizes = sorted(args.sizes, key=lambda s: s[0] * s[1])
    print(f'device={args.device} threads={torch.get_num_threads()} {" and ".join(args.dtype)} batch 1; median of '
          f'{args.repeats}, {args.rounds} round(s) interleaved across models and dtypes')
    print(f"{'backbone':>16} {'dtype':>8} {'input':>10} {'round':>5} {'params':>7} {'GMACs':>7} {'fwd s':>7} "
          f"{'f+b s':>7} {'f+b MiB':>8}  stages s")
    notes: list[str] = []
    results = measure(args, sizes, notes)
    rows = [dict(model=model, dtype=dtype, hw=list(hw), **merge_rounds(runs)) for dtype in args.dtype
            for hw in sizes for model in args.models if (runs := results.get((model, dtype, hw)))]
    out = report(args, sizes, rows, notes)
    print(f'saved {out / "backbone_benchmark.md"}, {out / "backbone_benchmark.png"}, {out / "backbone_benchmark.json"}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
