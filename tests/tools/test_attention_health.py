"""tools/analysis_tools/attention_health.py on the detection, segmentation and classification demo configs, with and
without a checkpoint."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from helpers.repo import ROOT

pytest.importorskip('mmdet')

CONFIGS = {
    'detection': 'configs/retinanet_soft_tiny_demo.py',
    'segmentation': 'configs/upernet_soft_tiny_demo.py',
    'classification': 'configs/soft_tiny_in1k_demo.py',
}
SOFT_TINY_LAYERS = ['s1.b0', 's2.b0', 's2.b1', 's3.b0', 's3.b1', 's3.b2']


@pytest.fixture(scope='module')
def image(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp('health') / 'image.png'
    cv2.imwrite(str(path), np.random.default_rng(0).integers(0, 256, (128, 128, 3), dtype=np.uint8))
    return str(path)


@pytest.mark.parametrize('task', list(CONFIGS))
def test_table_and_plot_for_every_task(task, image, tmp_path, load_tool, capsys, monkeypatch):
    # mmpretrain's inferencer builds the config's test dataset for its class names: the classification demo's data
    # is generated in the working folder, which must not be the checkout
    monkeypatch.chdir(tmp_path)
    out = tmp_path / 'health.png'
    tool = load_tool('analysis_tools/attention_health')
    report = tool.main([str(ROOT / CONFIGS[task]), image, image, '--out', str(out)])
    assert [layer.short_name for layer in report] == SOFT_TINY_LAYERS
    assert [layer.num_sets for layer in report] == [2 * heads for heads in (2, 4, 4, 10, 10, 10)]  # both images
    printed = capsys.readouterr().out
    assert 'initialisation (seed 0)' in printed and 'on 2 image(s)' in printed
    rows = [line.split() for line in printed.splitlines() if line.split()[:1] and line.split()[0] in SOFT_TINY_LAYERS]
    assert [row[0] for row in rows] == SOFT_TINY_LAYERS
    assert [float(row[3]) for row in rows] == pytest.approx([float(f'{layer.condition_max:.3g}') for layer in report])
    assert out.stat().st_size > 10_000


def test_a_checkpoint_is_measured_not_the_initialisation(image, tmp_path, load_tool):
    from mmdet.apis import init_detector

    from soft_mm.cli.config_loading import load_config

    config = str(ROOT / CONFIGS['detection'])
    options = ['--cfg-options', 'model.backbone.landmark_mode=avg']
    tool = load_tool('analysis_tools/attention_health')
    at_init = tool.main([config, image, *options])
    cfg = load_config(config, {'model.backbone.landmark_mode': 'avg'})
    torch.manual_seed(0)
    model = init_detector(cfg, None, device='cpu')
    model.init_weights()
    with torch.no_grad():  # queries 30x wider: the landmarks spread out under the kernel's fixed bandwidth
        for name, param in model.named_parameters():
            if name.endswith('attn.qk.weight') and 'stages.3' not in name:
                param.mul_(30.0)
    checkpoint = tmp_path / 'wide_queries.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': {'dataset_meta': model.dataset_meta}}, checkpoint)
    trained = tool.main([config, str(checkpoint), image, *options])
    for before, after in zip(at_init, trained):
        assert after.condition_max < before.condition_max
        assert after.effective_rank_median > before.effective_rank_median
    assert at_init[0].uniformity > 0.99
    assert trained[0].uniformity < at_init[0].uniformity - 0.05  # the landmarks no longer alike: measured, not init


def test_bad_inputs_stop_with_one_sentence(image, tmp_path, load_tool):
    tool = load_tool('analysis_tools/attention_health')
    with pytest.raises(SystemExit, match=r'missing.png not found: pass an image file that OpenCV reads'):
        tool.main([str(ROOT / CONFIGS['detection']), str(tmp_path / 'missing.png')])
    with pytest.raises(SystemExit, match='builds a model without SOFT attention layers'):
        tool.main([str(ROOT / 'configs/peers/retinanet_r18_dense_demo.py'), image])
    with pytest.raises(SystemExit):  # argparse: a checkpoint with no image after it
        tool.main([str(ROOT / CONFIGS['detection']), str(tmp_path / 'model.pth')])
