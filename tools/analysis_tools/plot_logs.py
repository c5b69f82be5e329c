"""Draw the loss and the validation metric (mAP / mIoU) curves of an mmengine run as one PNG.

    python tools/analysis_tools/plot_logs.py work_dirs/retinanet_soft_tiny_demo       # newest run under the work dir
    python tools/analysis_tools/plot_logs.py \
        work_dirs/upernet_soft_tiny_demo/20261130_141500/vis_data/scalars.json --out miou.png
    python tools/analysis_tools/plot_logs.py work_dirs/run_a work_dirs/run_b --labels A B --out compare.png  # 2 runs

mmengine's ``LocalVisBackend`` writes one JSON object per line to ``<work_dir>/<timestamp>/vis_data/scalars.json``:
training lines carry ``loss`` (and ``loss_*`` parts) with ``iter`` / ``step``, validation lines the metrics
(``coco/bbox_mAP``, ``mIoU``, ...) with ``step`` = the epoch or iteration of that evaluation. The left panel draws every
``loss*`` key against the iteration, the right one every metric (``--metrics`` picks them; default: keys containing
``mAP`` or ``IoU``). A run with soft_mm's ``AttentionHealthHook`` gets a third panel: the Newton residual of every SOFT
layer (``attn_health/<layer>/residual``) against the iteration.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

DEFAULT_METRIC_MARKERS = ('mAP', 'IoU')
HEALTH_PREFIX = 'attn_health/'  # soft_mm.engine.hooks.AttentionHealthHook


def find_scalars(path: str | Path) -> Path:
    """``path`` itself if it is a file, else the newest ``*/vis_data/scalars.json`` under the work dir ``path``."""
    path = Path(path)
    if path.is_file():
        return path
    found = sorted(path.glob('*/vis_data/scalars.json')) + sorted(path.glob('vis_data/scalars.json'))
    if not found:
        raise FileNotFoundError(f'{path} holds no */vis_data/scalars.json: pass a work dir of a finished or running '
                                'training, or the scalars.json file itself')
    return found[-1]


def read_scalars(path: str | Path) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[tuple[float, float]]]]:
    """``(losses, metrics)``: for each key the ``(step, value)`` points of the training and the validation lines."""
    losses: dict[str, list[tuple[float, float]]] = defaultdict(list)
    metrics: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f'{path} line {number} is not JSON ({error.msg}): is it an mmengine scalars.json?') \
                from None
        is_train = any(key.startswith('loss') for key in record)
        step = record.get('iter', record.get('step')) if is_train else record.get('step')
        if step is None:
            continue
        for key, value in record.items():
            if not isinstance(value, (int, float)) or key in ('iter', 'step', 'epoch'):
                continue
            if is_train and key.startswith('loss'):
                losses[key].append((float(step), float(value)))
            elif not is_train:
                metrics[key].append((float(step), float(value)))
    return dict(losses), dict(metrics)


def plot(path: str | Path, out: str | Path, metric_keys: list[str] | None = None) -> tuple[list[str], list[str]]:
    """Write the PNG; returns the loss keys and the metric keys drawn."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    losses, metrics = read_scalars(path)
    if not losses:
        raise ValueError(f'{path} has no loss values: no training iteration was logged yet')
    if metric_keys is None:
        metric_keys = sorted(k for k in metrics if any(marker in k for marker in DEFAULT_METRIC_MARKERS))
    missing = [k for k in metric_keys if k not in metrics]
    if missing:
        raise ValueError(f'--metrics {missing} not in {path}; logged metrics: {", ".join(sorted(metrics)) or "none"}')
    health_keys = sorted(k for k in metrics if k.startswith(HEALTH_PREFIX) and k.endswith('/residual'))
    fig, axes = plt.subplots(1, 3 if health_keys else 2, figsize=(16 if health_keys else 11, 4))
    loss_ax, metric_ax = axes[:2]
    for key in sorted(losses):
        steps, values = zip(*losses[key])
        loss_ax.plot(steps, values, label=key, linewidth=1.5 if key == 'loss' else 0.8)
    loss_ax.set(xlabel='iteration', ylabel='loss', title='training loss')
    loss_ax.legend(fontsize=8)
    for key in metric_keys:
        steps, values = zip(*metrics[key])
        metric_ax.plot(steps, values, marker='o', label=key)
    metric_ax.set(xlabel='evaluation step (epoch or iteration)', title='validation')
    if metric_keys:
        metric_ax.legend(fontsize=8)
    else:
        metric_ax.text(0.5, 0.5, 'no mAP / IoU logged', ha='center', va='center', transform=metric_ax.transAxes)
    if health_keys:
        health_ax = axes[2]
        for key in health_keys:
            steps, values = zip(*metrics[key])
            health_ax.semilogy(steps, [max(v, 1e-17) for v in values], label=key[len(HEALTH_PREFIX):-len('/residual')])
        health_ax.set(xlabel='iteration', ylabel='||P X - I||_F / sqrt(m)', title='Newton residual per SOFT layer')
        health_ax.legend(fontsize=7)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return sorted(losses), metric_keys


def _smoothed(points: list[tuple[float, float]], window: int) -> tuple[list[float], list[float]]:
    """Running mean over ``window`` consecutive points (the log's own window is per logging interval)."""
    steps, values = zip(*points)
    means = [sum(values[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]
    return list(steps), means


def compare_runs(paths: list[str | Path], out: str | Path, labels: list[str] | None = None, metric: str | None = None,
                 smooth: int = 5) -> list[tuple[str, float | None]]:
    """One PNG comparing runs: each run's total ``loss`` (running mean over ``smooth`` logged points) against the
    iteration, and its validation ``metric`` (default: the first key with mAP or IoU) against the evaluation step.
    Returns each run's label and final metric value (None when it logged none)."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    labels = labels or [Path(path).name for path in paths]
    if len(labels) != len(paths):
        raise ValueError(f'--labels: {len(labels)} labels for {len(paths)} runs; give one per run')
    fig, (loss_ax, metric_ax) = plt.subplots(1, 2, figsize=(11, 4))
    finals = []
    for path, label in zip(paths, labels):
        scalars = find_scalars(path)
        losses, metrics = read_scalars(scalars)
        if 'loss' not in losses:
            raise ValueError(f'{scalars} has no loss values: no training iteration was logged yet')
        loss_ax.plot(*_smoothed(losses['loss'], smooth), label=label)
        key = metric or next((k for k in sorted(metrics) if any(m in k for m in DEFAULT_METRIC_MARKERS)), None)
        if key in metrics:
            steps, values = zip(*metrics[key])
            metric_ax.plot(steps, values, marker='o', label=label)
            finals.append((label, values[-1]))
        else:
            finals.append((label, None))
    loss_ax.set(xlabel='iteration', ylabel=f'loss (running mean of {smooth})', title='training loss')
    metric_ax.set(xlabel='evaluation step (epoch or iteration)', title=metric or 'validation (first mAP / IoU key)')
    loss_ax.legend(fontsize=8)
    metric_ax.legend(fontsize=8)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return finals


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('runs', nargs='+', metavar='run',
                        help='a work dir (newest run) or a vis_data/scalars.json file; several runs are compared in '
                             'one figure (loss and one metric per run)')
    parser.add_argument('--out', help='PNG path (default: curves.png next to scalars.json; required for several runs)')
    parser.add_argument('--metrics', nargs='+', help='validation keys to draw (default: those with mAP or IoU; with '
                                                     'several runs the first one given)')
    parser.add_argument('--labels', nargs='+', help='legend labels of the runs (default: their folder names)')
    args = parser.parse_args(argv)
    if len(args.runs) > 1:
        if not args.out:
            parser.error('--out is required when comparing several runs')
        finals = compare_runs(args.runs, args.out, args.labels, args.metrics[0] if args.metrics else None)
        print(f'wrote {args.out}: ' + ', '.join(f'{label} {"-" if value is None else f"{value:.4g}"}'
                                                 for label, value in finals))
        return
    scalars = find_scalars(args.runs[0])
    out = args.out or scalars.parent / 'curves.png'
    loss_keys, metric_keys = plot(scalars, out, args.metrics)
    print(f'wrote {out}: {", ".join(loss_keys)} | {", ".join(metric_keys) or "no metric"}')


if __name__ == '__main__':
    main()
