"""Tests of soft_mm.ops.functional.head_conv: the per-head value conv and its custom backward against autograd's
conv."""
import pytest
import torch
import torch.nn.functional as F
from helpers.op_checks import check_custom_op, grad_fn_name

from soft_mm.ops.functional.head_conv import CUSTOM_BACKWARD_MIN_KERNEL, _head_conv_op, head_depthwise_conv


def reference(x, weight, head_dim):
    return F.conv2d(x, weight.repeat_interleave(head_dim, 0), padding=weight.shape[-1] // 2, groups=x.shape[1])


@pytest.mark.parametrize('kernel', [3, 5, 7, 9])
@pytest.mark.parametrize('channels_last', [False, True])
def test_output_and_gradients_equal_the_depthwise_conv_float64(kernel, channels_last):
    gen = torch.Generator().manual_seed(kernel)
    batch, heads, head_dim, height, width = 2, 3, 4, 11, 6  # a map smaller than the filter in one direction
    x = torch.randn(batch, heads * head_dim, height, width, generator=gen, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(heads, 1, kernel, kernel, generator=gen, dtype=torch.float64)
    grad_out = torch.randn(batch, heads * head_dim, height, width, generator=gen, dtype=torch.float64)
    results = []
    for fn in (head_depthwise_conv, reference):
        leaves = (x.clone().requires_grad_(), weight.clone().requires_grad_())
        out = fn(*leaves, head_dim)
        results.append((out, *torch.autograd.grad(out, leaves, grad_out)))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_gradcheck_of_the_custom_backward():
    assert CUSTOM_BACKWARD_MIN_KERNEL <= 5
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 1, 5, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w: head_depthwise_conv(a, w, 2), (x, weight))


def test_bad_shapes_raise():
    x = torch.randn(1, 6, 5, 5)
    with pytest.raises(ValueError, match='weight must be'):
        head_depthwise_conv(x, torch.randn(3, 1, 4, 4), 2)
    with pytest.raises(ValueError, match='x must be'):
        head_depthwise_conv(x, torch.randn(2, 1, 3, 3), 2)


def test_autocast_bfloat16_gives_gradients_in_the_leaves_dtypes():
    x = torch.randn(1, 4, 9, 9, requires_grad=True)
    weight = torch.randn(2, 1, 9, 9, requires_grad=True)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = head_depthwise_conv(x, weight, 2)
    assert out.dtype == torch.bfloat16
    out.float().square().sum().backward()
    assert x.grad.dtype == torch.float32 and weight.grad.dtype == torch.float32
    ref_x, ref_weight = (t.detach().clone().requires_grad_() for t in (x, weight))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        expected = F.conv2d(ref_x, ref_weight.repeat_interleave(2, 0), padding=4, groups=4)
    expected.float().square().sum().backward()
    torch.testing.assert_close(out.float(), expected.float())
    # both backwards run in bfloat16 (the op's operands are cast at entry, as autocast casts the conv's), with the
    # sums in another order: equal to bfloat16 precision
    scale = ref_weight.grad.abs().max().item()
    torch.testing.assert_close(weight.grad, ref_weight.grad, rtol=2e-2, atol=2e-2 * scale)


@pytest.mark.parametrize('channels_last', [False, True])
def test_custom_op_passes_opcheck(channels_last):
    # the fake kernels give the real kernels' shapes, dtypes and memory layouts (channels-last maps stay so)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 9, 7, generator=gen, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(3, 1, 7, 7, generator=gen, dtype=torch.float64)
    check_custom_op(_head_conv_op, (x.requires_grad_(), weight.requires_grad_(), 2))


def test_the_custom_backward_is_taken_on_cpu_from_its_measured_kernel_size():
    from soft_mm.ops.functional.head_conv import uses_custom_backward
    # SOFT's stage-1 and stage-2 filters (9, 5) take it, stage 3's (3) does not
    assert [uses_custom_backward('cpu', k) for k in (3, 5, 7, 9)] == [False, True, True, True]
    assert not uses_custom_backward('cuda', 9)  # measured on CPU only
    x = torch.randn(1, 4, 9, 9, requires_grad=True)
    names = {k: grad_fn_name(head_depthwise_conv(x, torch.randn(2, 1, k, k), 2)) for k in (3, 5, 9)}
    assert 'soft_mm' not in names[3] and 'soft_mm' in names[5] and 'soft_mm' in names[9], names


@pytest.mark.cuda
@pytest.mark.parametrize('kernel', [3, 5, 9])
@pytest.mark.parametrize('channels_last', [False, True])
def test_on_cuda_large_filters_take_the_nchw_kernel_and_give_the_input_layout_back(kernel, channels_last):
    """From ``CUDA_NCHW_MIN_KERNEL`` the map is copied to NCHW for PyTorch's depthwise kernel (cuDNN's channels-last
    one was 5x slower at 9x9): the same values and gradients as the float64 conv, in the input's memory layout."""
    from torch.profiler import ProfilerActivity, profile

    from soft_mm.ops.functional.head_conv import CUDA_NCHW_MIN_KERNEL
    gen = torch.Generator().manual_seed(kernel)
    x = torch.randn(2, 6, 40, 33, generator=gen, dtype=torch.float64)
    weight = torch.randn(3, 1, kernel, kernel, generator=gen, dtype=torch.float64)
    grad_out = torch.randn(2, 6, 40, 33, generator=gen, dtype=torch.float64)
    leaves = (x.clone().requires_grad_(), weight.clone().requires_grad_())
    want = reference(*leaves, 2)
    want_grads = torch.autograd.grad(want, leaves, grad_out)
    cx = x.float().cuda()
    if channels_last:
        cx = cx.contiguous(memory_format=torch.channels_last)
    cleaves = (cx.requires_grad_(), weight.float().cuda().requires_grad_())
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # IEEE float32 in cuDNN's kernels too
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = head_depthwise_conv(*cleaves, 2)
            torch.cuda.synchronize()
        grads = torch.autograd.grad(out, cleaves, grad_out.float().cuda())
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    for got, ref in zip((out, *grads), (want, *want_grads)):
        torch.testing.assert_close(got.double().cpu(), ref, rtol=1e-4, atol=1e-4)
    if kernel >= CUDA_NCHW_MIN_KERNEL:  # PyTorch's own depthwise kernel (it takes NCHW maps only)
        assert any('conv_depthwise2d' in e.name for e in prof.events()), [e.name for e in prof.events()]


def test_the_nchw_route_is_cuda_only_from_its_kernel_size_and_keeps_values_and_layout():
    from soft_mm.ops.functional.head_conv import CUDA_NCHW_MIN_KERNEL, nchw_conv, uses_nchw_route
    # stage 1's 9x9 filters take it on CUDA (cuDNN's channels-last kernel was 5x slower there), 5 and 3 do not
    assert [uses_nchw_route('cuda', k) for k in (3, 5, CUDA_NCHW_MIN_KERNEL, 9)] == [False, False, True, True]
    assert not uses_nchw_route('cpu', 9)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(2, 1, 9, 9, generator=gen, dtype=torch.float64)
    for x in (torch.randn(1, 4, 11, 13, generator=gen, dtype=torch.float64),
              torch.randn(1, 11, 13, 4, generator=gen, dtype=torch.float64).permute(0, 3, 1, 2)):
        out = nchw_conv(x, weight, 2)
        torch.testing.assert_close(out, reference(x, weight, 2), rtol=1e-12, atol=1e-12)
        assert out.is_contiguous() == x.is_contiguous()
        assert out.is_contiguous(memory_format=torch.channels_last) == (not x.is_contiguous())
