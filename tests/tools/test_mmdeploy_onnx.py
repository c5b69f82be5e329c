"""tools/deployment/mmdeploy_onnx.py: whole detectors and segmenters through mmdeploy 1.3.1 to onnxruntime.

tools/install.sh installs mmdeploy (``SOFT_MM_WITH_MMDEPLOY=0`` skips it); without it these tests skip (and fail
under CI=true). The demos' trained scores, PyTorch against ONNX at two sizes, are in docs/user_guides/deployment.md,
with the command.
"""
from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.repo import ROOT

pytest.importorskip('mmdet')
pytest.importorskip('mmseg')
pytest.importorskip('mmdeploy', reason='mmdeploy is not installed: bash tools/install.sh installs it')

RETINANET_DEMO = str(ROOT / 'configs/retinanet_soft_tiny_demo.py')
UPERNET_DEMO = str(ROOT / 'configs/upernet_soft_tiny_demo.py')
MASK_RCNN_DEMO = str(ROOT / 'configs/mask_rcnn_soft_tiny_demo.py')
SHORT_TEST = ['test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False']


@pytest.fixture(scope='module')
def tool(load_tool):
    return load_tool('deployment/mmdeploy_onnx')


def test_deploy_config_follows_the_model_and_the_exporter_is_restored(tool):
    from soft_mm.cli.config_loading import load_config
    from soft_mm.cli.errors import ConfigError

    detector = load_config(RETINANET_DEMO, {'model.test_cfg.score_thr': 0.3, 'model.test_cfg.max_per_img': 50})
    deploy = tool.deploy_config(detector)
    assert (deploy.codebase_config.type, deploy.codebase_config.task) == ('mmdet', 'ObjectDetection')
    post = deploy.codebase_config.post_processing
    assert (post.score_threshold, post.iou_threshold, post.keep_top_k) == (0.3, 0.5, 50)
    assert deploy.onnx_config.dynamic_axes['input'] == {0: 'batch', 2: 'height', 3: 'width'}
    assert deploy.backend_config.type == 'onnxruntime'
    segmenter = tool.deploy_config(load_config(UPERNET_DEMO))
    assert segmenter.codebase_config.type == 'mmseg' and segmenter.codebase_config.with_argmax
    assert segmenter.onnx_config.output_names == ['output']
    with pytest.raises(ConfigError, match='is an instance segmenter'):
        tool.deploy_config(load_config(MASK_RCNN_DEMO), 'mask_rcnn_soft_tiny_demo.py')

    with pytest.raises(SystemExit) as exc:
        tool.main([RETINANET_DEMO, 'missing.pth'])
    assert str(exc.value).startswith('missing.pth not found') and '\n' not in str(exc.value)

    export = torch.onnx.export
    with tool.legacy_onnx_exporter():  # torch < 2.5 has only the legacy exporter, and no dynamo argument
        assert getattr(torch.onnx.export, 'keywords', None) == (
            {'dynamo': False} if 'dynamo' in inspect.signature(export).parameters else None)
    assert torch.onnx.export is export


def _random_checkpoint(tool, cfg, path: Path) -> str:
    torch.manual_seed(0)
    model = tool.task_processor(cfg).build_pytorch_model(None)
    torch.save({'meta': {}, 'state_dict': model.state_dict()}, path)
    return str(path)


@pytest.mark.slow  # two exports and four mmdeploy test runs: about 20 s on one CPU thread
def test_demos_export_and_score_as_pytorch_at_two_sizes(tmp_path, monkeypatch, tool):
    """Random-weight demo models (the trained ones take minutes to make): UperNet through the command line, scored
    by mmdeploy's evaluation at the demo's 128x128 and at 192x192; RetinaNet's detections from onnxruntime against
    PyTorch's at both sizes (with random weights the detector's scores are near-ties, among which mmdeploy's
    post-processing picks other candidates than mmdet's, so its mAP would compare noise; the trained demos' scores
    are in docs/user_guides/deployment.md)."""
    import onnxruntime as ort

    from soft_mm.cli.config_loading import load_config
    from soft_mm.datasets.synthetic_shapes import write_shapes_dataset

    monkeypatch.chdir(tmp_path)
    write_shapes_dataset('data/shapes', num_train=4, num_val=4)

    segmenter = load_config(UPERNET_DEMO)
    checkpoint = _random_checkpoint(tool, segmenter, tmp_path / 'upernet.pth')
    assert tool.main([UPERNET_DEMO, checkpoint, '--work-dir', 'upernet', '--eval', '--eval-size', '192x192',
                      '--cfg-options', *SHORT_TEST]) == 0
    scores = json.loads(Path('upernet/scores.json').read_text())
    assert [row['size'] for row in scores] == ['128x128', '192x192']
    for row in scores:
        torch_scores, onnx_scores = row['pytorch'], row['onnxruntime']
        assert {'aAcc', 'mIoU'} <= set(torch_scores) and set(torch_scores) == set(onnx_scores)
        # percent; random weights leave near-tie logits whose argmax rounding can flip (0.06 at 192x192 through
        # torch 2.1's TorchScript-based exporter, 88 of 147,456 pixels): a frozen shape would move them by far more
        for metric, value in torch_scores.items():
            assert abs(onnx_scores[metric] - value) < 0.1, (row['size'], metric)
    assert scores[0]['pytorch'] != scores[1]['pytorch']  # the second size was really run

    detector = load_config(RETINANET_DEMO, {'model.test_cfg.score_thr': 0.0})
    checkpoint = _random_checkpoint(tool, detector, tmp_path / 'retinanet.pth')
    onnx_file = tool.convert(detector, checkpoint, 'retinanet')
    session = ort.InferenceSession(str(onnx_file), providers=['CPUExecutionProvider'])
    for side in (128, 192):
        cfg = tool.with_test_size(detector, (side, side))
        processor = tool.task_processor(cfg)
        model = processor.build_pytorch_model(checkpoint)
        image = np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)
        data, inputs = processor.create_input(image, None, model.data_preprocessor)
        assert tuple(inputs.shape) == (1, 3, side, side)
        with torch.no_grad():
            expected = model.predict(inputs, data['data_samples'], rescale=False)[0].pred_instances[:10]
        dets, labels = session.run(None, {'input': inputs.numpy()})
        top = np.argsort(-dets[0, :, 4], kind='stable')[:10]
        assert np.abs(dets[0, top, 4] - expected.scores.numpy()).max() < 1e-5, side
        assert np.abs(dets[0, top, :4] - expected.bboxes.numpy()).max() < 1e-2, side  # pixels
        assert (labels[0, top] == expected.labels.numpy()).all(), side
