"""soft_mm.ops.functional.residual.linear_residual: ``residual + linear(x)`` with the sum started in the GEMM in CPU
inference, the two-op form everywhere else; and the blocks that hand it their sums."""
import pytest
import torch
import torch.nn.functional as F
from timm.layers import Mlp
from torch import nn

from soft_mm.ops.functional import residual as residual_module
from soft_mm.ops.functional.residual import linear_residual


def layer(dtype, with_bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 41, 24, generator=gen, dtype=torch.float64)
    weight = torch.randn(16, 24, generator=gen, dtype=torch.float64) / 5
    bias = torch.randn(16, generator=gen, dtype=torch.float64) if with_bias else None
    residual = 4 * torch.randn(3, 41, 16, generator=gen, dtype=torch.float64)
    return [None if t is None else t.to(dtype) for t in (x, weight, bias, residual)]


@pytest.fixture
def linear_calls(monkeypatch):
    """Calls of F.linear inside the module: one per two-op form, none in the in-place form."""
    calls = []
    original = F.linear
    monkeypatch.setattr(residual_module.F, 'linear', lambda *args: calls.append(1) or original(*args))
    return calls


@pytest.mark.parametrize('with_bias', [True, False])
def test_inference_sums_in_the_gemm_within_float32_rounding(with_bias, linear_calls):
    x, weight, bias, residual = layer(torch.float32, with_bias)
    before = residual.clone()
    with torch.no_grad():
        out = linear_residual(x, weight, bias, residual)
    assert linear_calls == []  # the in-place form: no F.linear
    assert torch.equal(residual, before)  # the caller's residual is not written
    reference = residual.double() + F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    plain = residual + F.linear(x, weight, bias)
    scale = reference.abs().max()
    assert out.shape == (3, 41, 16) and out.dtype == torch.float32
    assert (out - reference).abs().max() <= 2 * (plain - reference).abs().max() + 1e-7 * scale
    assert (out - reference).abs().max() / scale < 1e-6


def test_float64_inference_equals_the_sum_to_rounding_and_a_strided_residual_works(linear_calls):
    x, weight, bias, residual = layer(torch.float64)
    strided = residual.transpose(0, 1).contiguous().transpose(0, 1)  # same values, not contiguous
    with torch.no_grad():
        out = linear_residual(x, weight, bias, strided)
    assert linear_calls == [] and out.is_contiguous()
    torch.testing.assert_close(out, residual + F.linear(x, weight, bias), rtol=1e-14, atol=1e-13)


def test_gradients_take_the_two_op_form_and_are_exact():
    x, weight, bias, residual = (t.requires_grad_() for t in layer(torch.float64))
    assert torch.autograd.gradcheck(linear_residual, (x, weight, bias, residual))
    out = linear_residual(x, weight, bias, residual)
    assert type(out.grad_fn).__name__ == 'AddBackward0'


def test_a_float32_stream_under_autocast_and_mixed_dtypes_take_the_two_op_form(linear_calls):
    x, weight, bias, residual = layer(torch.float32)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        out = linear_residual(x, weight, bias, residual)
    assert linear_calls == [1] and out.dtype == torch.float32  # bfloat16 linear, float32 stream
    with torch.no_grad():
        linear_residual(x, weight, bias, residual.double())
    assert linear_calls == [1, 1]


@pytest.mark.parametrize('autocast', [True, False])
def test_bfloat16_sums_in_the_gemms_epilogue_no_less_accurate_than_the_two_ops(autocast, linear_calls):
    """A bfloat16 stream: oneDNN's GEMM adds the residual to its float32 accumulator and rounds once; against the
    float64 sum of the same bfloat16 inputs it is no further off than the two-op form in bfloat16 (which rounds the
    linear's output, then the sum). Where this torch's oneDNN has no such bfloat16 kernel on this CPU (torch 2.1
    without AMX), the two ops run."""
    x, weight, bias, residual = layer(torch.float32)
    bf16 = [t.to(torch.bfloat16) for t in (x, weight, bias, residual)]
    inputs = [x, weight, bias, bf16[3]] if autocast else bf16
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        out = linear_residual(*inputs)
    assert linear_calls == ([] if residual_module.bfloat16_epilogue_available() else [1])
    assert out.dtype == torch.bfloat16 and out.shape == (3, 41, 16)
    reference = bf16[3].double() + F.linear(*(t.double() for t in bf16[:3]))
    plain = bf16[3] + F.linear(*bf16[:3])
    assert (out.double() - reference).abs().max() <= (plain.double() - reference).abs().max()


class PlainMixer(nn.Module):
    """A token mixer with the blocks' plain signature, ``attn(x, hw_shape)``, and no ``residual``."""

    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, hw_shape):
        return self.proj(x)


@pytest.mark.parametrize('post_norm', [True, False])
def test_blocks_hand_their_sums_to_the_branches_and_any_mixer_still_works(post_norm):
    from soft_mm.models.attention import SoftAttention
    from soft_mm.models.blocks import Block

    torch.manual_seed(0)
    block = Block(32, SoftAttention(32, 2, landmark_stride=2), post_norm=post_norm).eval().double()
    x = torch.randn(2, 48, 32, dtype=torch.float64)
    with torch.no_grad():
        summed = block(x, (6, 8))
        # the plain forms: the attention adds no residual (the blocks' protocol), the MLP as timm's Mlp with the sum
        block.attn.adds_residual = False
        block.mlp.forward = lambda x, residual=None, mlp=block.mlp, route=None: residual + Mlp.forward(mlp, x)
        plain = block(x, (6, 8))
    torch.testing.assert_close(summed, plain, rtol=1e-12, atol=1e-12)

    mixer_block = Block(32, PlainMixer(32), post_norm=post_norm).eval()
    x, attn, mlp = x.float(), mixer_block.attn, mixer_block.mlp
    with torch.no_grad():
        out = mixer_block(x, (6, 8))
        if post_norm:
            y = mixer_block.norm1(x + attn(x, None))
            expected = mixer_block.norm2(y + mlp(y))
        else:
            y = x + attn(mixer_block.norm1(x), None)
            expected = y + mlp(mixer_block.norm2(y))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_a_hooked_branch_keeps_its_output_apart_from_the_sum():
    """A forward hook on the attention (e.g. the attention-health recorder) sees the branch's own output, as without
    the in-GEMM sum; the unhooked MLP still sums in its GEMM."""
    from soft_mm.models.attention import SoftAttention
    from soft_mm.models.blocks import Block

    torch.manual_seed(0)
    block = Block(32, SoftAttention(32, 2, landmark_stride=2), post_norm=True).eval()
    x = torch.randn(2, 48, 32)
    seen = []
    handle = block.attn.register_forward_hook(lambda module, args, out: seen.append((args, out)))
    with torch.no_grad():
        block(x, (6, 8))
        handle.remove()
        branch = block.attn(x, (6, 8))
    (args, out), = seen
    assert len(args) == 2 and torch.equal(out, branch)
