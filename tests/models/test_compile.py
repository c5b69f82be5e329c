"""A whole SOFT model under ``torch.compile``: one graph (``fullgraph=True``) from torch 2.4, forward and backward,
with the eager results; on older torch (no custom ops) it compiles with graph breaks at the SOFT op and still gives
the eager results. Part of the torch matrix (tools/misc/torch_matrix.sh)."""
from __future__ import annotations

import pytest
import torch
from helpers.compile_recording import RecordingBackend

from soft_mm.ops.compat import HAS_CUSTOM_OP

timm = pytest.importorskip('timm')
import soft_mm.models  # noqa: F401  (registers the soft_* timm models)


def test_a_soft_model_compiles_as_one_graph_with_the_eager_outputs_and_gradients():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = timm.create_model('soft_norm_tiny', num_classes=10, drop_path_rate=0.0)
    x = torch.randn(2, 3, 64, 96)

    def step(fn):
        model.zero_grad()
        out = fn(x)
        out.square().sum().backward()
        return out.detach(), next(model.parameters()).grad.clone()  # the stem's: through every block

    recorder = RecordingBackend()
    compiled = torch.compile(model, backend=recorder, fullgraph=HAS_CUSTOM_OP)
    eager_out, eager_grad = step(model)
    graph_out, graph_grad = step(compiled)
    if HAS_CUSTOM_OP:  # torch >= 2.4: one graph holding the SOFT ops as single nodes
        assert len(recorder.graphs) == 1
        assert any('soft_mm' in str(target) for target in recorder.targets())
    else:  # graph breaks at the SOFT op, run eagerly between the graphs
        assert len(recorder.graphs) > 1
    torch.testing.assert_close(graph_out, eager_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(graph_grad, eager_grad, rtol=1e-4, atol=1e-4 * eager_grad.abs().max().item())
