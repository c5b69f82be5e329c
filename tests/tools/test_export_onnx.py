"""tools/deployment/export_onnx.py: one ONNX graph with symbolic batch, height and width reproduces PyTorch at sizes
other than the export size (pitfall 12: shape branches frozen at the export size)."""
from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType

import pytest
import torch

from soft_mm.models import SOFT

onnx = pytest.importorskip('onnx')
pytest.importorskip('onnxruntime')
pytest.importorskip('onnxscript')

# a small pyramid with every feature of the published ones (SOFT-Norm stages 1-3, softmax stage 4, conv landmarks)
SMALL_ARCH = {'embed_dims': [16, 32, 48, 64], 'num_heads': [1, 2, 3, 4], 'depths': [1, 1, 1, 1]}
EXPORT_SIZE = (224, 224)
# odd sides on both sides of the export size; 193 is the smallest side with a full landmark grid (ceil(49 / 8) = 7)
CHECK_SIZES = [(257, 193), (320, 448)]
# float32 outputs of magnitude ~5: onnxruntime and PyTorch sum in a different order
ATOL = 1e-4


@pytest.fixture(scope='module')
def tool(load_tool) -> ModuleType:
    return load_tool('deployment/export_onnx')


def _symbolic_input_dims(path: Path) -> list[str | int]:
    model = onnx.load(str(path))
    return [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]


def test_min_side(tool: ModuleType) -> None:
    # conv landmarks (stride 8 at stage 1): (7 - 1) * 4 * 8 + 1; avg landmarks: stage 3 needs 7 tokens at stride 16
    assert tool.min_side(SOFT('tiny')) == 193
    assert tool.min_side(SOFT('tiny', landmark_mode='avg')) == 97
    assert tool.min_side(SOFT('tiny', landmark_grid=4)) == 97


def test_export_rejects_size_outside_the_graph_range(tool: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r'193..8192'):
        tool.export(SOFT(SMALL_ARCH).eval(), tmp_path / 'x.onnx', size=(160, 224))


def test_backbone_onnx_matches_torch_at_other_sizes(tool: ModuleType, tmp_path: Path) -> None:
    torch.manual_seed(0)
    # 6 Newton-Schulz iterations instead of 20: a shorter unrolled graph exports faster; the shapes are the same
    model = SOFT(SMALL_ARCH, soft_norm=True, newton_iters=6)
    model.init_weights()  # the weights training starts from: outputs of magnitude ~5, as ATOL assumes
    model.eval()
    path = tool.export(model, tmp_path / 'backbone.onnx', size=EXPORT_SIZE)
    assert [isinstance(d, str) for d in _symbolic_input_dims(path)] == [True, False, True, True]
    results = tool.check(model, path, CHECK_SIZES, batch=2)
    for (height, width), errors in results:
        assert len(errors) == 4
        assert max(errors) < ATOL, (height, width, errors)


@pytest.mark.slow  # a full SOFT-Tiny export: about 100 s on 2 busy cores
def test_cli_exports_the_classifier_and_checks(tool: ModuleType, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    # the classifier graph (the backbone's plus pooling and head); status 0 means every difference <= --atol 1e-4
    out = tmp_path / 'cli.onnx'
    status = tool.main(['classifier', '--model', 'soft_tiny', '--num-classes', '5', '--out', str(out),
                        '--check', *(f'{h}x{w}' for h, w in CHECK_SIZES), '--atol', str(ATOL)])
    printed = capsys.readouterr().out
    assert status == 0 and out.is_file()
    assert all(f'{h}x{w}: max |onnxruntime - torch|' in printed for h, w in CHECK_SIZES)


def test_cli_rejects_unknown_classifier(tool: ModuleType) -> None:
    with pytest.raises(ValueError, match="'resnet50' is not a SOFT timm model"):
        tool.build_classifier('resnet50')


@pytest.mark.parametrize('landmark_mode', ['conv', 'avg'])
def test_legacy_exporter_with_dynamic_axes_matches_torch_at_other_sizes(tmp_path: Path, landmark_mode: str) -> None:
    """What mmdeploy-style pipelines call: the TorchScript exporter with ``dynamic_axes``. Exported at 224², the graph
    runs at other sizes, also below the dynamo exporter's range: no traced size may stay in a Reshape of the
    stage-1 value conv or in the landmark grid."""
    import onnxruntime as ort

    torch.manual_seed(0)
    model = SOFT(SMALL_ARCH, soft_norm=True, newton_iters=6, landmark_mode=landmark_mode)
    model.init_weights()
    model.eval()
    path = tmp_path / 'legacy.onnx'
    # dynamo=False where the exporter offers both (torch >= 2.5); older torch has only this one
    legacy = {'dynamo': False} if 'dynamo' in inspect.signature(torch.onnx.export).parameters else {}
    torch.onnx.export(model, (torch.randn(1, 3, *EXPORT_SIZE),), str(path), **legacy, input_names=['img'],
                      output_names=[f'out{i}' for i in range(4)], dynamic_axes={'img': {2: 'h', 3: 'w'}},
                      opset_version=17)
    session = ort.InferenceSession(str(path))
    for size in [*CHECK_SIZES, (96, 64)]:
        image = torch.randn(1, 3, *size)
        with torch.no_grad():
            expected = model(image)
        outputs = session.run(None, {'img': image.numpy()})
        assert [o.shape for o in outputs] == [tuple(e.shape) for e in expected], size
        assert max(float(abs(o - e.numpy()).max()) for o, e in zip(outputs, expected)) < ATOL, size
