"""AttentionHealthHook in a short run of the dense RetinaNet demo: the figures reach the log and scalars.json (and so
plot_logs), and the training itself is unchanged by them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.repo import ROOT
from helpers.tool_process import tool_output

from soft_mm.engine.hooks import AttentionHealthHook

pytest.importorskip('mmdet')

DENSE_DEMO = str(ROOT / 'configs/retinanet_soft_tiny_dense_demo.py')
# 16 train images of batch 8: 2 iterations; the hook is the config's second custom hook
SHORT_RUN = ['train_cfg.max_epochs=1', 'default_hooks.logger.interval=1', 'model.test_cfg.score_thr=0.0']


@pytest.fixture(scope='module')
def dense_dir(tmp_path_factory) -> Path:
    from mmengine.config import Config

    from soft_mm.datasets.synthetic_shapes import write_shapes_dataset

    generator = Config.fromfile(DENSE_DEMO).generator
    folder = tmp_path_factory.mktemp('dense_demo')
    write_shapes_dataset(folder / 'data/dense', **dict(generator, num_train=16, num_val=8))
    return folder


def _train(folder: Path, name: str, interval: int) -> tuple[str, list[dict]]:
    output = tool_output(['tools/train.py', DENSE_DEMO, '--work-dir', name, '--cfg-options', *SHORT_RUN,
                          f'custom_hooks.1.interval={interval}'], folder)
    (scalars,) = (folder / name).glob('*/vis_data/scalars.json')
    return output, [json.loads(line) for line in scalars.read_text().splitlines()]


@pytest.mark.slow
def test_hook_logs_the_figures_and_leaves_training_unchanged(dense_dir, load_tool):
    output, records = _train(dense_dir, 'with_hook', interval=1)
    health = [r for r in records if 'attn_health/max_residual' in r]
    assert [r['step'] for r in health] == [1, 2]
    layers = ('s1.b0', 's2.b0', 's2.b1', 's3.b0', 's3.b1', 's3.b2')  # SOFT-Tiny's SOFT layers
    for record in health:
        for layer in layers:
            assert 1.0 <= record[f'attn_health/{layer}/condition'] <= (49 + 0.01) / 0.01 * (1 + 1e-9)
            assert 1 <= record[f'attn_health/{layer}/effective_rank'] <= 49
            assert 0.0 <= record[f'attn_health/{layer}/residual'] <= record['attn_health/max_residual']
    assert output.count('attention health at iteration') == 2
    assert 's3.b2' in output.split('attention health at iteration 2')[1]

    _, plain = _train(dense_dir, 'without_hook', interval=1000)
    assert not any('attn_health/max_residual' in r for r in plain)
    losses = [{k: v for k, v in r.items() if k.startswith('loss')} for r in records if 'loss' in r]
    assert losses and losses == [{k: v for k, v in r.items() if k.startswith('loss')} for r in plain if 'loss' in r]

    plot_logs = load_tool('analysis_tools/plot_logs')
    out = dense_dir / 'curves.png'
    plot_logs.plot(next((dense_dir / 'with_hook').glob('*/vis_data/scalars.json')), out)
    assert out.stat().st_size > 10_000


@pytest.mark.parametrize(('kwargs', 'message'), [
    ({'interval': 0}, 'interval must be an int >= 1'),
    ({'target_residual': -1.0}, 'target_residual must be a number > 0'),
    ({'max_iters': 1.5}, 'max_iters must be an int >= 1'),
])
def test_bad_settings_name_themselves(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AttentionHealthHook(**kwargs)
