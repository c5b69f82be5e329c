"""Tests of soft_mm.ops.functional.sdpa: stage 4's softmax attention, bfloat16 operands attended in float32 in CPU
inference."""
import torch
import torch.nn.functional as F

from soft_mm.ops.functional.sdpa import softmax_attention


def operands(dtype=torch.bfloat16, tokens=300, requires_grad=False):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(1, 4, tokens, 32, generator=gen).to(dtype).requires_grad_(requires_grad)
            for _ in range(3)]


def test_bfloat16_inference_is_float32_math_rounded_once():
    q, k, v = operands()
    with torch.no_grad():
        out = softmax_attention(q, k, v)
        plain = F.scaled_dot_product_attention(q, k, v)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert out.dtype == plain.dtype == torch.bfloat16
    # the float64 result of the same bfloat16 operands rounded to bfloat16 once: at most one bfloat16 step apart, and
    # the correctly rounded value itself almost everywhere (float32 sums can straddle a rounding tie); PyTorch's
    # bfloat16 kernel, which also rounds the probabilities, gets about 60% of the elements so (the check has teeth)
    rounded = exact.to(torch.bfloat16)
    torch.testing.assert_close(out, rounded, rtol=2 ** -7, atol=1e-6)
    correctly_rounded, plain_correctly_rounded = ((o == rounded).double().mean().item() for o in (out, plain))
    assert correctly_rounded > 0.999 and plain_correctly_rounded < 0.9, (correctly_rounded, plain_correctly_rounded)
    error, plain_error = ((o.double() - exact).abs().mean().item() for o in (out, plain))
    assert error < plain_error, (error, plain_error)


def test_under_autocast_the_bfloat16_projections_take_the_float32_core():
    q, k, v = (t.float() for t in operands())
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        q16, k16, v16 = (t.to(torch.bfloat16) for t in (q, k, v))
        out = softmax_attention(q16, k16, v16)
    assert out.dtype == torch.bfloat16
    with torch.no_grad():
        expected = F.scaled_dot_product_attention(q16.float(), k16.float(), v16.float()).to(torch.bfloat16)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_training_and_float32_keep_the_call_as_written():
    q, k, v = operands(requires_grad=True)
    out = softmax_attention(q, k, v)  # a gradient recorded: PyTorch's bfloat16 kernel, differentiable
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=0, atol=0)
    assert out.grad_fn is not None
    with torch.no_grad():
        q, k, v = operands(torch.float32)
        torch.testing.assert_close(softmax_attention(q, k, v), F.scaled_dot_product_attention(q, k, v),
                                   rtol=0, atol=0)
