"""soft_mm.ops.functional.add_norm: a post-norm block's LayerNorm(residual + branch) in one Triton kernel forward and
two launches backward on the GPU route (run here on CPU tensors by the Triton interpreter), against float64 and against
the PyTorch form in the same precision; where it is not taken; and in a SOFT block."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.kernel_launches import counted_launches, summary
from helpers.op_checks import triton_kernels

from soft_mm.ops.functional.add_norm import MAX_ADD_NORM_WIDTH, add_layer_norm, fuses_add_norm
from soft_mm.ops.route import route_of
from soft_mm.ops.triton_route import interpreted_triton_route

pytestmark = triton_kernels
EPS = 1e-6  # the SOFT blocks' LayerNorm epsilon


def _case(rows: int, width: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    branch = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    residual = 3 * torch.randn(rows, width, generator=gen, dtype=torch.float64) + 1  # a stream with an offset
    weight = 1 + 0.1 * torch.randn(width, generator=gen, dtype=torch.float64)
    bias = 0.1 * torch.randn(width, generator=gen, dtype=torch.float64)
    grad = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    return branch, residual, weight, bias, grad


def _run(fn, branch, residual, weight, bias, grad, dtype):
    """Outputs and gradients (branch, residual, weight, bias) of ``fn`` with the stream in ``dtype`` and the
    LayerNorm's parameters in float32 (as under autocast), all returned in float64."""
    params_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    leaves = [branch.to(dtype), residual.to(dtype), weight.to(params_dtype), bias.to(params_dtype)]
    leaves = [t.clone().requires_grad_() for t in leaves]
    y = fn(*leaves)
    grads = torch.autograd.grad(y, leaves, grad.to(y.dtype))
    assert y.dtype == dtype and all(g.dtype == t.dtype for g, t in zip(grads, leaves))
    return y.double(), [g.double() for g in grads]


def _exact(branch, residual, weight, bias):
    return F.layer_norm(residual + branch, residual.shape[-1:], weight, bias, EPS)


def _pytorch_form(branch, residual, weight, bias):
    """What the block runs without the kernel: the sum in the stream's dtype, LayerNorm in float32 (CUDA autocast),
    cast back to the stream's dtype."""
    return F.layer_norm((residual + branch).float(), residual.shape[-1:], weight.float(), bias.float(),
                        EPS).to(residual.dtype)


def _fused(branch, residual, weight, bias):
    with interpreted_triton_route():
        assert fuses_add_norm(branch, residual, weight)
        return add_layer_norm(branch, residual, weight, bias, EPS)


def _relative(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture
def compiled_tiles(monkeypatch):
    """The interpreter runs the kernels in a GPU's tiles (add_norm_rows': 16 rows at 64 channels, several programs a
    matrix), not the whole-matrix tiles it takes otherwise."""
    import soft_mm.ops.functional.add_norm.add_norm_launch as launch
    from soft_mm.ops.functional.add_norm.add_norm_config import add_norm_rows

    monkeypatch.setattr(launch, '_interpreter_rows', lambda rows, width: add_norm_rows(width))
    launch._launch_sizes.cache_clear()
    yield
    launch._launch_sizes.cache_clear()


def test_the_interpreter_takes_whole_matrices_and_a_gpu_its_tiles():
    from soft_mm.ops.functional.add_norm.add_norm_launch import _launch_sizes

    assert _launch_sizes(74, 320, True) == (128, 512, 1, 1, 1)
    assert _launch_sizes(16 * 256 + 5, 64, True) == (4096, 64, 2, 2, 1)  # 2 ** 18 elements a tile at most
    assert _launch_sizes(16 * 256 + 5, 64, False) == (16, 64, 257, 129, 2)


# 2 x 37 rows: not a multiple of the kernels' 16; 4,101: more row blocks (257) than the backward's 256 programs, so
# each program sums two; widths 64 and 320 (SOFT-Small's stages 1 and 2; 320 is no power of two: masked columns). In
# the GPU's tiles and in the interpreter's whole-matrix ones.
@pytest.mark.parametrize('tiles', ['whole', 'compiled'])
@pytest.mark.parametrize('rows, width', [(74, 64), (74, 320), (16 * 256 + 5, 64)])
def test_float32_matches_float64_as_the_pytorch_form_does(rows, width, tiles, request):
    if tiles == 'compiled':
        request.getfixturevalue('compiled_tiles')
    case = _case(rows, width)
    exact, exact_grads = _run(_exact, *case, torch.float64)
    fused, fused_grads = _run(_fused, *case, torch.float32)
    pytorch, pytorch_grads = _run(_pytorch_form, *case, torch.float32)
    # observed: every error 1e-7 relative or below, the PyTorch form's alike
    assert _relative(fused, exact) < 1e-6 and _relative(fused, exact) <= 3 * _relative(pytorch, exact) + 1e-7
    for name, f, p, e in zip(('branch', 'residual', 'weight', 'bias'), fused_grads, pytorch_grads, exact_grads):
        assert _relative(f, e) < 1e-5 and _relative(f, e) <= 3 * _relative(p, e) + 1e-7, name
    # the gradient of a sum is the same for both addends: the kernel writes it once
    assert torch.equal(fused_grads[0], fused_grads[1])


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_low_precision_stream_no_worse_than_the_pytorch_form(dtype):
    # the kernel sums in float32; the PyTorch form rounds the sum to the stream's dtype before normalising
    case = _case(74, 320)
    exact, exact_grads = _run(_exact, *case, torch.float64)
    fused, fused_grads = _run(_fused, *case, dtype)
    pytorch, pytorch_grads = _run(_pytorch_form, *case, dtype)
    unit = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[dtype]
    error, pytorch_error = _relative(fused, exact), _relative(pytorch, exact)
    assert error < unit and error <= pytorch_error, (error, pytorch_error)
    for name, f, p, e in zip(('branch', 'residual', 'weight', 'bias'), fused_grads, pytorch_grads, exact_grads):
        assert _relative(f, e) < 2 * unit and _relative(f, e) <= 1.5 * _relative(p, e), name


def test_one_launch_forward_and_two_backward():
    branch, residual, weight, bias, grad = (t.float() for t in _case(74, 64))
    leaves = [t.requires_grad_() for t in (branch, residual, weight, bias)]
    with interpreted_triton_route(), counted_launches() as forward:
        y = add_layer_norm(*leaves, EPS)
    with interpreted_triton_route(), counted_launches() as backward:
        torch.autograd.grad(y, leaves, grad)  # (.backward() would add .grad's copies of the one tensor)
    assert forward == ['triton.add_norm_fwd_kernel_y'], summary(forward)
    # the sum's gradient and the partial sums in one kernel, then the sum of the programs' partials
    assert backward[0] == 'triton.add_norm_bwd_kernel_dx' and summary(backward) == {
        'triton.add_norm_bwd_kernel_dx': 1, 'aten.sum': 1}, summary(backward)


def test_elsewhere_the_pytorch_form_runs():
    branch, residual, weight, bias, _ = (t.float() for t in _case(16, 64))
    exact = F.layer_norm(residual + branch, (64,), weight, bias, EPS)
    # CPU tensors outside the interpreted route: the CPU's own kernels, the very PyTorch form
    assert not fuses_add_norm(branch, residual, weight)
    assert torch.equal(add_layer_norm(branch, residual, weight, bias, EPS), exact)
    with interpreted_triton_route():
        wide = torch.zeros(2, MAX_ADD_NORM_WIDTH + 1)
        assert not fuses_add_norm(wide, wide, torch.ones(MAX_ADD_NORM_WIDTH + 1))  # wider than the kernels take
        assert not fuses_add_norm(branch, residual[:, :32], weight)  # shapes that broadcast: not a post-norm sum
        assert not fuses_add_norm(branch.double(), residual.double(), weight.double())  # float64: PyTorch's
        assert not fuses_add_norm(branch, residual, None)  # no affine LayerNorm
        with counted_launches() as launches:
            out = add_layer_norm(branch.double(), residual.double(), weight.double(), bias.double(), EPS)
    assert 'triton.add_norm_fwd_kernel_y' not in launches
    assert torch.allclose(out, exact.double(), atol=1e-5)


def test_a_soft_block_gives_the_same_outputs_and_gradients_on_either_route():
    from soft_mm.models.attention import SoftAttention
    from soft_mm.models.blocks import Block

    torch.manual_seed(0)
    dim, hw = 64, (9, 11)
    block = Block(dim, SoftAttention(dim, num_heads=2, landmark_stride=4, soft_norm=True), post_norm=True)
    x = torch.randn(2, hw[0] * hw[1], dim, requires_grad=True)
    ref = block(x, hw)
    weights = torch.randn_like(ref)  # (a LayerNorm output's square sum is constant: no use as a loss)
    ref_grads = torch.autograd.grad((ref * weights).sum(), [x, block.norm1.weight, block.norm2.bias])
    with interpreted_triton_route(), counted_launches() as launches:
        assert block._fuses_add_norm(x, route_of(x))
        out = block(x, hw)
    # the two post-norm sums and norms, and the landmark sampler's LayerNorm and GELU
    assert launches.count('triton.add_norm_fwd_kernel_y') == 3
    grads = torch.autograd.grad((out * weights).sum(), [x, block.norm1.weight, block.norm2.bias])
    assert (out - ref).abs().max().item() < 1e-4
    for g, r in zip(grads, ref_grads):
        assert _relative(g.double(), r.double()) < 1e-4
    # a forward hook on a norm sees the norm's own output: the block keeps the modules' forms then
    handle = block.norm1.register_forward_hook(lambda *args: None)
    with interpreted_triton_route():
        assert not block._fuses_add_norm(x, route_of(x))
    handle.remove()


def _folded_case(with_residual: bool, seed: int = 1):
    """A (3 samples x 37 tokens x 80 channels) case with a residual (or none), the branch's bias, stochastic depth's
    scales (the first sample dropped, the others kept at 1 / 0.9) and the gradients of both outputs, in float64."""
    gen = torch.Generator().manual_seed(seed)
    shape = (3, 37, 80)
    branch = torch.randn(shape, generator=gen, dtype=torch.float64)
    residual = 3 * torch.randn(shape, generator=gen, dtype=torch.float64) + 1 if with_residual else None
    weight = 1 + 0.1 * torch.randn(80, generator=gen, dtype=torch.float64)
    bias, branch_bias = (0.1 * torch.randn(80, generator=gen, dtype=torch.float64) for _ in range(2))
    scale = torch.tensor([0.0, 1 / 0.9, 1 / 0.9], dtype=torch.float64)
    grads = [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(2)]
    return branch, residual, weight, bias, branch_bias, scale, grads


@pytest.mark.parametrize('with_residual, gelu, return_sum', [
    (True, False, False),  # a post-norm block's sum (its branch's bias and stochastic depth in it)
    (True, False, True),  # a pre-norm block's first sum, kept, and its second norm
    (False, True, False),  # the landmark sampler's LayerNorm and GELU
    (False, False, True)])
def test_the_folded_bias_scale_gelu_and_kept_sum_match_float64(with_residual, gelu, return_sum):
    branch, residual, weight, bias, branch_bias, scale, grads = _folded_case(with_residual)

    def run(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (branch, weight, bias, branch_bias)]
        leaves += [] if residual is None else [residual.to(dtype).requires_grad_()]
        kwargs = dict(branch_bias=leaves[3], branch_scale=scale.to(dtype), gelu=gelu, return_sum=return_sum)
        out = fn(leaves[0], leaves[4] if residual is not None else None, leaves[1], leaves[2], EPS, **kwargs)
        outs = out if return_sum else (out,)
        got = torch.autograd.grad(outs, leaves, [g.to(dtype) for g in grads[:len(outs)]])
        return [o.double() for o in outs], [g.double() for g in got]

    exact, exact_grads = run(add_layer_norm, torch.float64)  # off the GPU route: the PyTorch form in float64
    with interpreted_triton_route():
        assert fuses_add_norm(branch.float(), None if residual is None else residual.float(), weight.float())
        fused, fused_grads = run(add_layer_norm, torch.float32)
    # observed: 1e-7 relative or below, as the plain form in float32 (test above)
    assert all(_relative(f, e) < 1e-6 for f, e in zip(fused, exact))
    assert all(_relative(f, e) < 1e-5 for f, e in zip(fused_grads, exact_grads)), [
        _relative(f, e) for f, e in zip(fused_grads, exact_grads)]
    # the dropped sample: its branch (and its bias's share) gets no gradient
    assert fused_grads[0][0].abs().max() == 0


def test_the_folded_forms_launch_what_the_plain_one_does():
    branch, residual, weight, bias, branch_bias, scale, grads = (t.float() if isinstance(t, torch.Tensor) else t
                                                                 for t in _folded_case(True))
    leaves = [t.requires_grad_() for t in (branch, residual, weight, bias, branch_bias)]
    with interpreted_triton_route(), counted_launches() as forward:
        total, y = add_layer_norm(leaves[0], leaves[1], leaves[2], leaves[3], EPS, branch_bias=leaves[4],
                                  branch_scale=scale, return_sum=True)
    grads = [g.float() for g in grads]
    with interpreted_triton_route(), counted_launches() as backward:
        torch.autograd.grad([total, y], leaves, grads)
    assert forward == ['triton.add_norm_fwd_kernel_y'], summary(forward)
    # the gradients of the sum (the one it received added in), of the branch and the three partial sums: one kernel and
    # the sum of its programs' partials
    assert summary(backward) == {'triton.add_norm_bwd_kernel_dx': 1, 'aten.sum': 1}, summary(backward)


@pytest.mark.parametrize('post_norm', [True, False])
def test_blocks_in_training_with_stochastic_depth_give_the_same_on_either_route(post_norm):
    """A SOFT block (post-norm) and a softmax-stage block (pre-norm, its first sum kept and its second norm fused) in
    training with given stochastic-depth scales: the GPU route's fused sums give the CPU route's outputs and
    gradients."""
    from soft_mm.models.attention import SoftAttention, SoftmaxAttention
    from soft_mm.models.blocks import Block

    torch.manual_seed(0)
    dim, hw = 64, (9, 11)
    attn = SoftAttention(dim, 2, landmark_stride=4, soft_norm=True) if post_norm else SoftmaxAttention(dim, 2)
    block = Block(dim, attn, post_norm=post_norm, drop_path=0.2).train()
    x = torch.randn(3, hw[0] * hw[1], dim, requires_grad=True)
    scales = torch.tensor([[0.0, 1.25, 1.25], [1.25, 1.25, 0.0]])  # (the attention's, the MLP's) x 3 samples
    weights = torch.randn(3, hw[0] * hw[1], dim)
    params = [x, block.norm1.weight, block.norm2.bias, block.attn.proj.bias, block.mlp.fc2.bias]
    ref = block(x, hw, scales)
    ref_grads = torch.autograd.grad((ref * weights).sum(), params)
    with interpreted_triton_route(), counted_launches() as launches:
        out = block(x, hw, scales)
    grads = torch.autograd.grad((out * weights).sum(), params)
    # post-norm: both sums and norms and the landmarks' norm; pre-norm: the first sum with the second norm
    assert launches.count('triton.add_norm_fwd_kernel_y') == (3 if post_norm else 1)
    # the given scales, inside the sums: no mask drawn, no product with them (the two products of a SOFT layer scale its
    # query weight and bias, uncast outside autocast)
    assert 'aten.bernoulli_' not in launches and launches.count('aten.mul') == (2 if post_norm else 0)
    assert (out - ref).abs().max().item() < 1e-4
    for g, r in zip(grads, ref_grads):
        assert _relative(g.double(), r.double()) < 1e-4
