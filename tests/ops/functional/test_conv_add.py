"""soft_mm.ops.functional.head_conv.conv_add: a SOFT layer's attention output plus its value conv in one Triton kernel
forward and two launches backward on the GPU route (run here on CPU tensors by the Triton interpreter), against
float64 and against the PyTorch form in the same precision; where it is not taken; and in a SOFT layer."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.kernel_launches import counted_launches, summary
from helpers.op_checks import triton_kernels
from torch import nn

from soft_mm.ops.functional.head_conv import MAX_FUSED_KERNEL, conv_add, fuses_conv_add
from soft_mm.ops.functional.head_conv_config import block_tokens
from soft_mm.ops.route import route_of
from soft_mm.ops.triton_launch import interpreter_block
from soft_mm.ops.triton_route import interpreted_triton_route

pytestmark = triton_kernels


def _case(hw, heads, head_dim, kernel, seed=0):
    """``(v, out, weight, grad)`` in float64: ``v`` a head-split view of a fused projection's output (its value half,
    strided as the layers hand it over), ``out`` head-major, ``grad`` token-major."""
    gen = torch.Generator().manual_seed(seed)
    batch, n, c = 2, hw[0] * hw[1], heads * head_dim
    projection = torch.randn(batch, n, 2 * c, generator=gen, dtype=torch.float64)
    v = projection[..., c:].reshape(batch, n, heads, head_dim).transpose(1, 2)
    out = torch.randn(batch, heads, n, head_dim, generator=gen, dtype=torch.float64)
    weight = torch.randn(heads, 1, kernel, kernel, generator=gen, dtype=torch.float64) / kernel
    grad = torch.randn(batch, n, c, generator=gen, dtype=torch.float64)
    return v, out, weight, grad


def _pytorch_form(v, out, weight, hw):
    """What the layer runs without the kernel: the depthwise conv of the channels-last map with each head's filter
    repeated over its channels (filters cast to the values' dtype, as autocast casts them), added to the output."""
    batch, heads, n, head_dim = v.shape
    c = heads * head_dim
    value_map = v.transpose(1, 2).reshape(batch, *hw, c).permute(0, 3, 1, 2)
    filters = weight.to(v.dtype).repeat_interleave(head_dim, 0)
    local = F.conv2d(value_map, filters, padding=weight.shape[-1] // 2, groups=c)
    return out.transpose(1, 2).reshape(batch, n, c) + local.permute(0, 2, 3, 1).reshape(batch, n, c)


def _fused(v, out, weight, hw):
    with interpreted_triton_route():
        route = route_of(v)
        assert fuses_conv_add(route, _conv(weight), v, out)
        return conv_add(v, out, weight, hw, route)


def _conv(weight):
    heads, _, kernel, _ = weight.shape
    conv = nn.Conv2d(heads, heads, kernel, padding=kernel // 2, groups=heads, bias=False)
    conv.weight = nn.Parameter(weight.detach(), requires_grad=weight.requires_grad)
    return conv


def _run(fn, case, hw, dtype):
    """Output and gradients (v, out, weight) of ``fn`` with the tokens in ``dtype`` and the filters in float32 (as
    the model's parameters under autocast), all returned in float64."""
    v, out, weight, grad = case
    leaves = [v.to(dtype).requires_grad_(), out.to(dtype).requires_grad_(),
              weight.to(torch.float64 if dtype == torch.float64 else torch.float32).requires_grad_()]
    y = fn(*leaves, hw)
    grads = torch.autograd.grad(y, leaves, grad.to(y.dtype))
    assert y.dtype == dtype and y.is_contiguous() and all(g.dtype == t.dtype for g, t in zip(grads, leaves))
    return y.double(), [g.double() for g in grads]


def _relative(a, b):
    return ((a - b).norm() / b.norm()).item()


# odd sizes: maps smaller than the filter in one direction (6 < 9), heads of 3 channels (masked), of 32
CASES = [((5, 7), 2, 3, 3), ((9, 4), 3, 8, 5), ((6, 11), 2, 32, 9)]


@pytest.mark.parametrize('hw, heads, head_dim, kernel', CASES)
def test_float32_matches_float64_as_the_pytorch_form_does(hw, heads, head_dim, kernel):
    case = _case(hw, heads, head_dim, kernel)
    exact, exact_grads = _run(_pytorch_form, case, hw, torch.float64)
    fused, fused_grads = _run(_fused, case, hw, torch.float32)
    pytorch, pytorch_grads = _run(_pytorch_form, case, hw, torch.float32)
    # observed: every error 4e-7 relative or below
    assert _relative(fused, exact) < 1e-6 and _relative(fused, exact) <= 3 * _relative(pytorch, exact) + 1e-7
    for name, f, p, e in zip(('v', 'out', 'weight'), fused_grads, pytorch_grads, exact_grads):
        assert _relative(f, e) < 1e-5 and _relative(f, e) <= 3 * _relative(p, e) + 1e-7, name


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_low_precision_no_worse_than_the_pytorch_form(dtype):
    # the kernel sums in float32 from float32 filters and rounds once; the PyTorch form casts the filters, rounds the
    # conv and rounds the sum again
    hw = (9, 4)
    case = _case(hw, 3, 8, 5)
    exact, exact_grads = _run(_pytorch_form, case, hw, torch.float64)
    fused, fused_grads = _run(_fused, case, hw, dtype)
    pytorch, pytorch_grads = _run(_pytorch_form, case, hw, dtype)
    unit = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[dtype]
    error, pytorch_error = _relative(fused, exact), _relative(pytorch, exact)
    assert error < unit and error <= pytorch_error, (error, pytorch_error)
    for name, f, p, e in zip(('v', 'out', 'weight'), fused_grads, pytorch_grads, exact_grads):
        assert _relative(f, e) < 2 * unit and _relative(f, e) <= 1.5 * _relative(p, e) + 1e-7, name


def test_the_gpus_blocks_give_the_interpreters_sums(monkeypatch):
    # under the interpreter a program takes the whole map (triton_launch.interpreter_block); the GPUs' 64 tokens a
    # program (here 2 programs, the second with a tail) give each output the same sum over the same taps, and the
    # filters' gradient from other partial sums
    from soft_mm.ops.functional import head_conv

    hw = (9, 11)
    case = tuple(t.float() for t in _case(hw, 2, 32, 5))
    whole, whole_grads = _run(_fused, case, hw, torch.float32)
    monkeypatch.setattr(head_conv, 'interpreter_block', lambda tokens: block_tokens(32))
    blocks, block_grads = _run(_fused, case, hw, torch.float32)
    assert block_tokens(32) == 64 and interpreter_block(99) == 128 and interpreter_block(5000) == 4096
    assert torch.equal(blocks, whole)
    assert torch.equal(block_grads[0], whole_grads[0]) and torch.equal(block_grads[1], whole_grads[1])
    # (float32 sums of 6,336 products each, split 2 ways or 1: observed 5e-6 apart, relative)
    torch.testing.assert_close(block_grads[2], whole_grads[2], rtol=2e-5, atol=5e-5)


def test_one_launch_forward_two_and_a_sum_backward_and_none_for_a_frozen_filter():
    hw = (5, 7)
    v, out, weight, grad = (t.float() for t in _case(hw, 2, 4, 3))
    leaves = [v.requires_grad_(), out.requires_grad_(), weight.requires_grad_()]
    with interpreted_triton_route(), counted_launches() as forward:
        y = conv_add(*leaves, hw, route_of(v))
    with interpreted_triton_route(), counted_launches() as backward:
        torch.autograd.grad(y, leaves, grad)
    assert forward == ['triton.head_conv_fwd_kernel_y'], summary(forward)
    # the values' gradient (the same kernel, the filters turned), the filters' partial sums, their sum
    assert summary(backward) == {'triton.head_conv_fwd_kernel_y': 1, 'triton.head_conv_bwd_kernel_dw': 1,
                                 'aten.sum': 1}, summary(backward)
    frozen = weight.detach()
    with interpreted_triton_route():
        y = conv_add(v, out, frozen, hw, route_of(v))
        with counted_launches() as backward:
            grads = torch.autograd.grad(y, [v, out], grad)
    assert summary(backward) == {'triton.head_conv_fwd_kernel_y': 1}, summary(backward)
    assert torch.equal(grads[1], grad.reshape(2, 35, 2, 4).transpose(1, 2))  # the sum's gradient, as it came


def test_bad_shapes_raise_naming_the_argument():
    v, out, weight, _ = (t.float() for t in _case((5, 7), 2, 4, 3))
    with interpreted_triton_route():
        route = route_of(v)
        with pytest.raises(ValueError, match=r'v and out must be \(B, h, H \* W, d\) with hw_shape \(H, W\)'):
            conv_add(v, out, weight, (5, 6), route)
        with pytest.raises(ValueError, match=r'v and out must be'):
            conv_add(v, out[:, :1], weight, (5, 7), route)
        with pytest.raises(ValueError, match=r'weight must be \(heads, 1, k, k\) with odd k and heads = 2, got '
                                             r'\(2, 1, 4, 4\)'):
            conv_add(v, out, torch.zeros(2, 1, 4, 4), (5, 7), route)
        with pytest.raises(ValueError, match=r'heads = 2, got \(3, 1, 3, 3\)'):
            conv_add(v, out, torch.zeros(3, 1, 3, 3), (5, 7), route)


def test_elsewhere_the_layer_keeps_the_pytorch_form():
    v, out, weight, _ = (t.float() for t in _case((5, 7), 2, 4, 3))
    conv = _conv(weight)
    assert not fuses_conv_add(route_of(v), conv, v, out)  # CPU tensors off the interpreted route
    with interpreted_triton_route():
        route = route_of(v)
        assert fuses_conv_add(route, conv, v, out)
        assert not fuses_conv_add(route, conv, v.double(), out.double())  # float64: PyTorch's
        big = nn.Conv2d(2, 2, MAX_FUSED_KERNEL + 2, padding=MAX_FUSED_KERNEL // 2 + 1, groups=2, bias=False)
        assert not fuses_conv_add(route, big, v, out)  # a filter larger than the kernel unrolls
        assert not fuses_conv_add(route, nn.Conv2d(2, 2, 3, padding=1, groups=2), v, out)  # a bias
        assert not fuses_conv_add(route, nn.Conv2d(2, 2, 3, padding=0, groups=2, bias=False), v, out)  # 'valid'
        assert not fuses_conv_add(route, type('Wrapped', (nn.Conv2d,), {})(2, 2, 3, padding=1, groups=2, bias=False),
                                  v, out)  # another class in the conv's place


def test_a_soft_layer_on_the_gpu_route_takes_it_with_the_cpu_routes_outputs_and_gradients():
    from soft_mm.models.attention import SoftAttention

    torch.manual_seed(0)
    dim, hw = 64, (9, 11)
    attn = SoftAttention(dim, num_heads=2, landmark_stride=4, v_conv_kernel=5, soft_norm=True)
    x = torch.randn(2, hw[0] * hw[1], dim, requires_grad=True)
    weights = torch.randn(2, hw[0] * hw[1], dim)
    params = [x, attn.v_conv.weight, attn.v.weight, attn.proj.weight]
    ref = attn(x, hw)
    ref_grads = torch.autograd.grad((ref * weights).sum(), params)
    with interpreted_triton_route(), counted_launches() as launches:
        out = attn(x, hw)
    assert launches.count('triton.head_conv_fwd_kernel_y') == 1, summary(launches)
    assert 'aten.convolution' not in launches and 'aten.add' not in launches, summary(launches)
    grads = torch.autograd.grad((out * weights).sum(), params)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    for name, got, want in zip(('x', 'v_conv', 'v', 'proj'), grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=name)
