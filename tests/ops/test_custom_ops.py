"""The SOFT op's hand-written kernels as ``torch.library`` custom ops
(soft_mm.ops.soft.products_op): the fake kernels agree
with the real ones (``torch.library.opcheck``: schema, shapes, dtypes, memory layouts, autograd registration, a
dynamic-shape AOT trace), ``torch.compile`` records each as one node and gives the eager outputs and gradients, and
export keeps plain ATen operators."""
from __future__ import annotations

import re

import pytest
import torch
from helpers.compile_recording import RecordingBackend
from helpers.op_checks import check_custom_op
from helpers.repo import ROOT

from soft_mm.ops import NEWTON_OP, newton_inverse, soft_attention
from soft_mm.ops.compat import HAS_CUSTOM_OP, HAS_IS_EXPORTING
from soft_mm.ops.custom_ops import recorded_calls
from soft_mm.ops.soft.backends.tiled import AUTO_TILING_MIN_TOKENS, _tiled_products
from soft_mm.ops.soft.backends.triton.nystrom_launch import _triton_products
from soft_mm.ops.soft.dispatch import DispatchError
from soft_mm.ops.triton_route import TRITON_VERSION


def token_major_inputs(dtype=torch.float64, batch=2, heads=3, num_tokens=45, head_dim=8, num_landmarks=5, seed=0):
    """q and v as the attention layer makes them (head-split views of token-major projections), float32 or float64
    landmarks and middle matrix."""
    gen = torch.Generator().manual_seed(seed)
    q = 0.4 * torch.randn(batch, num_tokens, heads, head_dim, generator=gen, dtype=torch.float64).transpose(1, 2)
    v = torch.randn(batch, num_tokens, heads, head_dim, generator=gen, dtype=torch.float64).transpose(1, 2)
    landmarks = q[:, :, :num_landmarks].clone() + 0.05
    middle = torch.randn(batch, heads, num_landmarks, num_landmarks, generator=gen, dtype=torch.float64)
    work = torch.promote_types(dtype, torch.float32)
    return q.to(dtype), landmarks.to(work), v.to(dtype), middle.to(work)


def requiring_grad(tensors):
    return tuple(t.detach().clone().requires_grad_() for t in tensors)


@pytest.mark.parametrize('dtype, products', [(torch.float64, torch.float64), (torch.float32, torch.float32),
                                             (torch.bfloat16, torch.bfloat16)])
def test_tiled_op_passes_opcheck(dtype, products):
    # 45 tokens in tiles of 16: two full tiles and a tail; bfloat16 q and v with float32 landmarks: mixed precision
    check_custom_op(_tiled_products.forward_op, (*requiring_grad(token_major_inputs(dtype)), 16, products))


@pytest.mark.triton_kernels
@pytest.mark.skipif(TRITON_VERSION is None, reason='triton is not installed (bash tools/install.sh adds it)')
@pytest.mark.parametrize('low, products', [(0, torch.float32), (1, torch.bfloat16), (2, torch.float16)])
def test_triton_op_passes_opcheck(monkeypatch, low, products):
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    q, landmarks, v, middle = token_major_inputs(torch.float32, num_tokens=70)
    v = v.to(products)
    check_custom_op(_triton_products.forward_op, (*requiring_grad((q, landmarks, v, middle)), low))


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_newton_op_passes_opcheck(dtype):
    # a batch of landmark kernels (symmetric, unit diagonal): the op's input after the ridge-free start
    points = torch.randn(2, 3, 6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    kernel = torch.exp(-0.5 * torch.cdist(points, points).square()).to(dtype).requires_grad_()
    check_custom_op(NEWTON_OP, (kernel, 20, 0.01))


def test_compiled_newton_inverse_is_one_node_with_the_eager_results():
    torch._dynamo.reset()
    points = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    kernel = torch.exp(-0.5 * torch.cdist(points, points).square())
    grad_out = torch.randn(kernel.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    recorder = RecordingBackend()
    compiled = torch.compile(lambda m: newton_inverse(m, 20, 0.01), backend=recorder, fullgraph=HAS_CUSTOM_OP)
    graph = outputs_and_grads(compiled, (kernel,), grad_out)
    eager = outputs_and_grads(lambda m: newton_inverse(m, 20, 0.01), (kernel,), grad_out)
    if HAS_CUSTOM_OP:  # torch >= 2.4; older torch traces into the autograd.Function that stands in for the op
        assert recorder.targets().count(torch.ops.soft_mm.newton_inverse.default) == 1
    for a, b in zip(graph, eager):  # the same kernel: equal
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def outputs_and_grads(fn, tensors, grad_out):
    leaves = requiring_grad(tensors)
    out = fn(*leaves)
    return (out.detach(), *torch.autograd.grad(out, leaves, grad_out))


def test_compiled_soft_attention_runs_the_tiled_op_as_one_node_with_the_eager_results():
    torch._dynamo.reset()
    q, landmarks, v, _ = token_major_inputs(num_tokens=AUTO_TILING_MIN_TOKENS + 1, head_dim=4)
    grad_out = torch.randn(v.shape, generator=torch.Generator().manual_seed(1), dtype=v.dtype)

    def attention(q, landmarks, v):
        return soft_attention(q, landmarks, v, soft_norm=True, ridge=0.01)

    recorder = RecordingBackend()
    compiled = torch.compile(attention, backend=recorder, fullgraph=HAS_CUSTOM_OP)
    eager = outputs_and_grads(attention, (q, landmarks, v), grad_out)
    graph = outputs_and_grads(compiled, (q, landmarks, v), grad_out)
    if HAS_CUSTOM_OP:
        assert len(recorder.graphs) == 1
        assert recorder.targets().count(torch.ops.soft_mm.tiled_nystrom_products.default) == 1
    for a, b in zip(graph, eager):  # the same kernels in float64: equal to rounding
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_one_dynamic_graph_serves_other_token_counts():
    # the fake kernel works on symbolic sizes: a dynamic graph compiled at one size runs at another unchanged
    torch._dynamo.reset()
    recorder = RecordingBackend()
    compiled = torch.compile(lambda *t: _tiled_products(*t, 16, torch.float64), backend=recorder, dynamic=True,
                             fullgraph=HAS_CUSTOM_OP)
    for num_tokens in (45, 77):
        tensors = token_major_inputs(num_tokens=num_tokens)
        torch.testing.assert_close(compiled(*tensors), _tiled_products(*tensors, 16, torch.float64), rtol=0, atol=0)
    if HAS_CUSTOM_OP:
        assert len(recorder.graphs) == 1


def test_export_keeps_plain_aten_operators():
    q, landmarks, v, _ = token_major_inputs(num_tokens=AUTO_TILING_MIN_TOKENS + 1, head_dim=4)

    class Attention(torch.nn.Module):
        def forward(self, q, landmarks, v):
            return soft_attention(q, landmarks, v, soft_norm=True, ridge=0.01)

    # torch.export where torch tells it from torch.compile (>= 2.7), else torch.jit.trace (the legacy ONNX exporter's)
    export = torch.export.export if HAS_IS_EXPORTING else torch.jit.trace
    program = export(Attention(), (q, landmarks, v))
    if HAS_IS_EXPORTING:
        assert 'soft_mm' not in str(program.graph)  # the reference math, not the tiled custom op
    else:  # the reference math: ATen operators, no Python op (the autograd.Function of an op) and no soft_mm op
        kinds = {node.kind() for node in program.inlined_graph.nodes()}
        assert 'aten::exp' in kinds and not any(k == 'prim::PythonOp' or 'soft_mm' in k for k in kinds), kinds
    run = program.module() if HAS_IS_EXPORTING else program
    torch.testing.assert_close(run(q, landmarks, v), Attention()(q, landmarks, v), rtol=1e-9, atol=1e-12)

    class Forced(torch.nn.Module):
        def forward(self, q, landmarks, v):
            return soft_attention(q, landmarks, v, backend='tiled')

    with pytest.raises(DispatchError, match="backend 'tiled' cannot run while a graph is exported"):
        export(Forced(), (q, landmarks, v))


def test_double_backward_through_the_custom_op_is_refused():
    q, landmarks, v, middle = requiring_grad(token_major_inputs())
    out = _tiled_products(q, landmarks, v, middle, 16, torch.float64)
    (grad_q,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        grad_q.sum().backward()


def test_recorded_calls_sees_every_call_of_the_op_on_every_torch():
    """custom_ops.recorded_calls (what the FLOP counter reads): a dispatch mode on a custom op, the op's own hook on the
    autograd.Function fallback; nothing recorded outside the block."""
    mats = [torch.eye(n, dtype=torch.float64) * 2 + 0.1 for n in (3, 5)]
    with recorded_calls(NEWTON_OP) as calls:
        for mat in mats:
            newton_inverse(mat, 7, 0.01)
    assert [(tuple(args[0].shape), args[1]) for args in calls] == [((3, 3), 7), ((5, 5), 7)]
    newton_inverse(mats[0], 7, 0.01)
    assert len(calls) == 2


def test_custom_ops_live_in_one_module():
    """soft_mm/ops/custom_ops.py is the one module that registers ``torch.library`` ops (and holds their
    ``autograd.Function`` stand-in for torch < 2.4): every op of soft_mm goes through ``differentiable_op`` or
    ``custom_op``."""
    registering = re.compile(r'torch\.library\.(custom_op|define|impl|Library|register_\w+)\(')
    modules = [str(path.relative_to(ROOT)) for path in sorted((ROOT / 'soft_mm').rglob('*.py'))
               if registering.search(path.read_text())]
    assert modules == ['soft_mm/ops/custom_ops.py']
