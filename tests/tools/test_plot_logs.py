"""tools/analysis_tools/plot_logs.py on a synthetic mmengine scalars.json."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    lines = []
    for it in range(1, 41):  # as mmengine's LoggerHook writes them: training lines, then one validation line per epoch
        lines.append({'lr': 1e-3, 'loss': 2.0 / it, 'loss_cls': 1.5 / it, 'loss_bbox': 0.5 / it, 'epoch': 1 + it // 21,
                      'iter': it, 'memory': 100, 'step': it})
        if it % 20 == 0:
            lines.append({'coco/bbox_mAP': 0.1 * it / 20, 'coco/bbox_mAP_50': 0.2 * it / 20, 'data_time': 0.1,
                          'step': it // 20})
    scalars = tmp_path / 'work/20261130_120000/vis_data/scalars.json'
    scalars.parent.mkdir(parents=True)
    scalars.write_text('\n'.join(json.dumps(line) for line in lines) + '\n')
    return tmp_path / 'work'


def test_reads_losses_and_metrics(run_dir: Path, load_tool) -> None:
    tool = load_tool('analysis_tools/plot_logs')
    losses, metrics = tool.read_scalars(tool.find_scalars(run_dir))
    assert sorted(losses) == ['loss', 'loss_bbox', 'loss_cls']
    assert len(losses['loss']) == 40 and losses['loss'][3] == (4.0, 0.5)
    assert metrics['coco/bbox_mAP'] == [(1.0, pytest.approx(0.1)), (2.0, pytest.approx(0.2))]
    assert 'lr' not in losses and 'data_time' in metrics


def test_writes_a_png_with_both_panels(run_dir: Path, capsys: pytest.CaptureFixture, load_tool) -> None:
    tool = load_tool('analysis_tools/plot_logs')
    out = run_dir / 'curves.png'
    tool.main([str(run_dir), '--out', str(out)])
    assert 'coco/bbox_mAP, coco/bbox_mAP_50' in capsys.readouterr().out
    picture = matplotlib.image.imread(str(out))
    assert picture.shape[:2] == (400, 1100)
    # both panels hold coloured curves (not only black axes on white)
    rgb = picture[..., :3]
    coloured = (rgb.max(-1) - rgb.min(-1)) > 0.3
    assert coloured[:, :550].sum() > 200 and coloured[:, 550:].sum() > 200


def test_unknown_metric_and_missing_run_are_named(run_dir: Path, tmp_path: Path, load_tool) -> None:
    tool = load_tool('analysis_tools/plot_logs')
    with pytest.raises(ValueError, match=r"--metrics \['mIoU'\] not in .*coco/bbox_mAP"):
        tool.plot(tool.find_scalars(run_dir), tmp_path / 'x.png', ['mIoU'])
    with pytest.raises(FileNotFoundError, match=r'holds no \*/vis_data/scalars.json'):
        tool.find_scalars(tmp_path / 'nowhere')


def test_compares_runs_in_one_figure(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, load_tool) -> None:
    tool = load_tool('analysis_tools/plot_logs')
    out = tmp_path / 'compare.png'
    tool.main([str(run_dir), str(run_dir), '--labels', 'first', 'second', '--out', str(out)])
    assert capsys.readouterr().out.strip().endswith('first 0.2, second 0.2')  # the last coco/bbox_mAP of each
    steps, means = tool._smoothed([(1, 1.0), (2, 3.0), (3, 5.0)], window=2)
    assert (steps, means) == ([1, 2, 3], [1.0, 2.0, 4.0])
    assert matplotlib.image.imread(str(out)).shape[:2] == (400, 1100)
    with pytest.raises(SystemExit):  # several runs need --out
        tool.main([str(run_dir), str(run_dir)])
    with pytest.raises(ValueError, match='1 labels for 2 runs'):
        tool.compare_runs([run_dir, run_dir], out, labels=['one'])
