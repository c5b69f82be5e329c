"""Backbones at detection and segmentation resolutions: SOFT against mmdet's PVT, PVTv2 and Swin.

    python tools/benchmark_backbone.py           # SOFT-Norm-Small, Swin-T, PVT-Small at 512^2, 1333x800, 2x, 4x
    python tools/benchmark_backbone.py --full    # all nine backbones
    python tools/benchmark_backbone.py --models soft_small swin_t --sizes 512x512 800x1344 --repeats 3

Sizes are H x W of the (padded) input: 1333x800 images are padded to 800x1344 (divisible by 32, as mmdet's
``pad_size_divisor=32``), and the 2x / 4x rows scale both sides by sqrt(2) / 2 and pad again (1152x1920,
1600x2688). Each (model, size) runs in a fresh subprocess (float32, batch 1, eval mode for the forward, train mode
for forward+backward, which backpropagates a random projection of every output map): parameters, FLOPs (mmengine's
``FlopAnalyzer`` through ``tools/get_flops.py``, up to ``--flops-max-pixels`` because tracing large inputs is slow),
median forward and forward+backward time, the rise of the peak RSS (CUDA: allocator peak) during forward+backward,
and, for SOFT, the forward time of each stage (from pre-hooks on the stages' downsampling layers). Forward+backward
is measured up to ``--train-max-pixels``; a model whose forward took longer than ``--max-case-s`` is not run at larger
sizes (noted). Growth ratios compare the largest size with 800x1344.

Writes ``backbone_benchmark.md``, ``backbone_benchmark.png`` and ``backbone_benchmark.json`` to ``--out``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from soft_mm.utils.bench_process import add_glibc_malloc_argument, glibc_malloc_note, run_in_fresh_process

TOOLS = Path(__file__).resolve().parent


def _load_sibling(name: str):
    spec = importlib.util.spec_from_file_location(f'soft_mm_tool_{name}', TOOLS / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load_sibling('benchmark_attention')

# mmdet registry configs with the published arch settings; SOFT models come from soft_mm.
MMDET_MODELS: dict[str, dict[str, Any]] = {
    'pvt_t': dict(type='PyramidVisionTransformer', num_layers=[2, 2, 2, 2]),
    'pvt_s': dict(type='PyramidVisionTransformer', num_layers=[3, 4, 6, 3]),
    'pvtv2_b1': dict(type='PyramidVisionTransformerV2', embed_dims=64, num_layers=[2, 2, 2, 2]),
    'pvtv2_b2': dict(type='PyramidVisionTransformerV2', embed_dims=64, num_layers=[3, 4, 6, 3]),
    'swin_t': dict(type='SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                   window_size=7, out_indices=(0, 1, 2, 3)),
}
SOFT_MODELS = {'soft_tiny': ('tiny', False), 'soft_small': ('small', False), 'soft_norm_tiny': ('tiny', True),
               'soft_norm_small': ('small', True)}
MODELS = (*SOFT_MODELS, *MMDET_MODELS)
DEFAULT_MODELS = ('soft_norm_small', 'swin_t', 'pvt_s')
BASE_SIZE = (800, 1344)
DEFAULT_SIZES = ('512x512', '800x1344', '1152x1920', '1600x2688')


def build_model(name: str) -> nn.Module:
    if name in SOFT_MODELS:
        from soft_mm.models import SOFT
        arch, soft_norm = SOFT_MODELS[name]
        return SOFT(arch=arch, soft_norm=soft_norm, drop_path_rate=0.0)
    from mmdet.registry import MODELS as MMDET_REGISTRY
    from mmdet.utils import register_all_modules
    register_all_modules()
    return MMDET_REGISTRY.build(dict(MMDET_MODELS[name]))


def stage_timer(model: nn.Module, device: torch.device) -> tuple[list[float], Any] | None:
    """Pre-hooks on the SOFT stages' downsampling layers and a hook on the model: per-stage times of the last call."""
    stages = getattr(model, 'stages', None)
    # SOFT stages all start with a downsampling module (Swin's last stage has downsample=None: not timed per stage)
    if stages is None or not all(isinstance(getattr(s, 'downsample', None), nn.Module) for s in stages):
        return None
    marks: list[float] = []

    def mark(*_: Any) -> None:
        bench._sync(device)
        marks.append(bench.time.perf_counter())

    handles = [s.downsample.register_forward_pre_hook(mark) for s in stages]
    handles.append(model.register_forward_hook(mark))

    def stage_times() -> list[float]:
        last = marks[-(len(stages) + 1):]
        return [b - a for a, b in zip(last, last[1:])]

    return marks, stage_times


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    device = torch.device(spec['device'])
    torch.manual_seed(0)
    model = build_model(spec['model']).to(device)
    h, w = spec['hw']
    x = torch.randn(1, 3, h, w, device=device)
    result: dict[str, Any] = dict(params=sum(p.numel() for p in model.parameters()))
    if spec['flops']:
        flops_tool = _load_sibling('get_flops')
        model.eval()
        result['gflops'] = flops_tool.analyze(model, (x,))['flops'] / 1e9
    timer = stage_timer(model, device)
    model.eval()
    with torch.no_grad():
        outs = model(x)  # warm-up
    grads = [torch.randn_like(o) for o in outs]
    fwd_times, stage_rows = [], []
    for _ in range(spec['repeats']):
        with torch.no_grad():
            fwd_times.append(bench._timed(lambda: model(x), device))
        if timer is not None:
            stage_rows.append(timer[1]())
    result['fwd_s'] = statistics.median(fwd_times)
    if stage_rows:
        result['stage_s'] = [statistics.median(col) for col in zip(*stage_rows)]
    if spec['train']:
        model.train()

        def forward_backward() -> None:
            torch.autograd.backward(model(x), grads)
            model.zero_grad(set_to_none=True)

        memory = bench.PeakMemory(device)
        memory.start()
        first = bench._timed(forward_backward, device)
        result['fwd_bwd_peak_mib'] = memory.peak_mib()
        times = [bench._timed(forward_backward, device) for _ in range(spec['repeats'] - 1)] or [first]
        result['fwd_bwd_s'] = statistics.median(times)
    return result


def run_case(spec: dict[str, Any], glibc_malloc: str) -> dict[str, Any]:
    result, stderr = run_in_fresh_process(__file__, spec, glibc_malloc)
    if result is None:
        return dict(error=stderr.strip().splitlines()[-1] if stderr.strip() else 'failed')
    return result


def _fmt(value: float | None, spec: str = '.2f') -> str:
    return '–' if value is None else format(value, spec)


def markdown(rows: list[dict[str, Any]], models: list[str], sizes: list[tuple[int, int]], header: str,
             notes: list[str]) -> str:
    lines = [header, '', '| backbone | input | params | GFLOPs | fwd s | fwd+bwd s | fwd+bwd peak MiB |',
             '|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append(f"| {r['model']} | {r['hw'][0]}x{r['hw'][1]} | {r['params'] / 1e6:.1f}M | "
                     f"{_fmt(r.get('gflops'), '.1f')} | {_fmt(r.get('fwd_s'))} | {_fmt(r.get('fwd_bwd_s'))} | "
                     f"{_fmt(r.get('fwd_bwd_peak_mib'), '.0f')} |")
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


def plot(rows: list[dict[str, Any]], models: list[str], header: str, path: Path) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for i, model in enumerate(models):
        pts = [r for r in rows if r['model'] == model and 'fwd_s' in r]
        if pts:
            axes[0].loglog([r['hw'][0] * r['hw'][1] / 1e6 for r in pts], [r['fwd_s'] for r in pts], 'o-',
                           color=f'C{i % 10}', label=model, ms=4)
    axes[0].set_xlabel('input megapixels')
    axes[0].set_ylabel('forward time (s)')
    axes[0].grid(True, which='both', alpha=0.3)
    axes[0].legend(fontsize=7)
    soft = [r for r in rows if 'stage_s' in r and r['model'] == next((m for m in models if m in SOFT_MODELS), None)]
    if soft:
        labels = [f"{r['hw'][0]}x{r['hw'][1]}" for r in soft]
        bottom = [0.0] * len(soft)
        for stage in range(4):
            values = [r['stage_s'][stage] for r in soft]
            axes[1].bar(labels, values, bottom=bottom, label=f'stage {stage + 1}')
            bottom = [b + v for b, v in zip(bottom, values)]
        axes[1].set_ylabel(f"{soft[0]['model']} forward time per stage (s)")
        axes[1].legend(fontsize=7)
    fig.suptitle(header, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', nargs='+', choices=MODELS, metavar='MODEL', default=None,
                        help=f'backbones (default: {" ".join(DEFAULT_MODELS)}; choices: {" ".join(MODELS)})')
    parser.add_argument('--full', action='store_true', help='all nine backbones')
    parser.add_argument('--sizes', nargs='+', default=list(DEFAULT_SIZES), help='inputs HxW (default: %(default)s)')
    parser.add_argument('--repeats', type=int, default=2, help='timed runs (median; default 2, after a warm-up)')
    parser.add_argument('--train-max-pixels', type=int, default=BASE_SIZE[0] * BASE_SIZE[1],
                        help='forward+backward only up to this many pixels (default: 800x1344)')
    parser.add_argument('--flops-max-pixels', type=int, default=512 * 512,
                        help='FLOPs only up to this many pixels (JIT tracing is slow; default 512x512)')
    parser.add_argument('--max-case-s', type=float, default=10.0,
                        help='a model whose forward took longer is not run at larger sizes (default 10: PVT-Small '
                             'stops after 2x the pixels, so the default run fits in 10 minutes)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default='work_dirs/benchmark_backbone')
    add_glibc_malloc_argument(parser)
    parser.add_argument('--worker', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return args
    try:
        args.hw_sizes = [bench.parse_size(s) for s in args.sizes]
    except ValueError as err:
        parser.error(f'--sizes must be positive integers H or HxW, got {err}')
    if args.repeats < 1:
        parser.error(f'--repeats must be >= 1, got {args.repeats}')
    args.models = list(MODELS if args.full else args.models or DEFAULT_MODELS)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))))
        return 0
    rows, notes, too_slow = [], [], set()
    sizes = sorted(args.hw_sizes, key=lambda s: s[0] * s[1])
    print(f'device={args.device} threads={torch.get_num_threads()} float32 batch 1; median of {args.repeats}')
    print(f"{'backbone':>16} {'input':>10} {'params':>7} {'GFLOPs':>7} {'fwd s':>7} {'f+b s':>7} {'f+b MiB':>8}  "
          'stages s')
    for hw in sizes:
        pixels = hw[0] * hw[1]
        for model in args.models:
            if model in too_slow:
                notes.append(f'{model} at {hw[0]}x{hw[1]} not run: its forward took > {args.max_case_s:g} s at a '
                             'smaller size')
                continue
            spec = dict(model=model, hw=list(hw), device=args.device, repeats=args.repeats,
                        train=pixels <= args.train_max_pixels, flops=pixels <= args.flops_max_pixels)
            result = run_case(spec, args.glibc_malloc)
            if 'error' in result:
                notes.append(f"{model} at {hw[0]}x{hw[1]} failed: {result['error']}")
                print(f"{model:>16} {f'{hw[0]}x{hw[1]}':>10} failed: {result['error']}", flush=True)
                continue
            row = dict(model=model, hw=list(hw), **result)
            rows.append(row)
            if row['fwd_s'] > args.max_case_s:
                too_slow.add(model)
            stages = ' '.join(f'{t:.3f}' for t in row.get('stage_s', []))
            print(f"{model:>16} {f'{hw[0]}x{hw[1]}':>10} {row['params'] / 1e6:>6.1f}M "
                  f"{_fmt(row.get('gflops'), '.1f'):>7} "
                  f"{row['fwd_s']:>7.2f} {_fmt(row.get('fwd_bwd_s')):>7} {_fmt(row.get('fwd_bwd_peak_mib'), '.0f'):>8}"
                  f"  {stages}", flush=True)
    if args.flops_max_pixels < max(h * w for h, w in sizes):
        notes.append(f'FLOPs counted up to {args.flops_max_pixels} pixels only (--flops-max-pixels).')
    if args.train_max_pixels < max(h * w for h, w in sizes):
        notes.append(f'forward+backward measured up to {args.train_max_pixels} pixels only (--train-max-pixels).')
    header = (f'Backbones, device {args.device}, {torch.get_num_threads()} threads, float32, batch 1, '
              f'median of {args.repeats}; {glibc_malloc_note(args.glibc_malloc)}')
    table = markdown(rows, args.models, sizes, header, notes)
    print()
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / 'backbone_benchmark.md').write_text(table)
    (out / 'backbone_benchmark.json').write_text(json.dumps(
        {'args': {k: v for k, v in vars(args).items() if k != 'worker'}, 'rows': rows, 'notes': notes}, indent=2))
    plot(rows, args.models, header, out / 'backbone_benchmark.png')
    print(f'saved {out / "backbone_benchmark.md"}, {out / "backbone_benchmark.png"}, {out / "backbone_benchmark.json"}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
