"""soft_mm.ops.functional.gelu.linear_gelu: the same function as ``F.gelu(F.linear(...))``, fused into one oneDNN GEMM
in CPU inference (float32 tanh-GELU: the GEMM, then gelu_tanh_'s in-place sigmoid form), and the blocks' GeluMlp that
uses it."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from timm.layers import Mlp

from soft_mm.models.blocks import GeluMlp, TanhGELU
from soft_mm.ops.functional import gelu
from soft_mm.ops.functional.gelu import fused_dtypes, fused_linear_gelu_available, gelu_tanh_, linear_gelu

needs_onednn = pytest.mark.skipif(not fused_linear_gelu_available(), reason='this PyTorch build has no oneDNN')


def layer(dtype=torch.float32, tokens=37, seed=0):
    gen = torch.Generator().manual_seed(seed)
    # a non-contiguous (N, B, C) view of 3-d activations, as wide as the 4x MLP of a small stage
    x = 2 * torch.randn(2, tokens, 24, generator=gen, dtype=torch.float64).transpose(0, 1)
    weight = 0.3 * torch.randn(96, 24, generator=gen, dtype=torch.float64)
    bias = torch.randn(96, generator=gen, dtype=torch.float64)
    return x.to(dtype), weight.to(dtype), bias.to(dtype)


@pytest.fixture
def fused_calls(monkeypatch):
    calls = []
    original = gelu._fusable
    monkeypatch.setattr(gelu, '_fusable', lambda *a: calls.append(dtype := original(*a)) or dtype)
    return calls


@pytest.mark.parametrize('approximate', ['tanh', 'none'])
def test_float64_is_exactly_the_unfused_function(approximate, fused_calls):
    x, weight, bias = layer(torch.float64)
    with torch.no_grad():
        out = linear_gelu(x, weight, bias, approximate)
    assert torch.equal(out, F.gelu(F.linear(x, weight, bias), approximate=approximate))
    assert fused_calls == [None]  # oneDNN takes no float64: the plain ops ran


@pytest.fixture
def sigmoid_form_calls(monkeypatch):
    calls = []
    original = gelu.gelu_tanh_
    monkeypatch.setattr(gelu, 'gelu_tanh_', lambda t, *args: calls.append(t.shape) or original(t, *args))
    return calls


@needs_onednn
@pytest.mark.parametrize('approximate', ['tanh', 'none'])
@pytest.mark.parametrize('with_bias', [True, False])
def test_float32_inference_is_equal_to_float32_rounding(approximate, with_bias, fused_calls, sigmoid_form_calls):
    """erf GELU: fused into oneDNN's GEMM; tanh GELU: the BLAS GEMM, then the sigmoid form in place."""
    x, weight, bias = layer(torch.float32)
    bias = bias if with_bias else None
    with torch.no_grad():
        out = linear_gelu(x, weight, bias, approximate)
    assert fused_calls == [torch.float32 if approximate == 'none' else None]
    assert sigmoid_form_calls == ([(37, 2, 96)] if approximate == 'tanh' else [])
    reference = F.gelu(F.linear(x.double(), weight.double(), None if bias is None else bias.double()),
                       approximate=approximate)
    unfused = F.gelu(F.linear(x, weight, bias), approximate=approximate)
    assert out.shape == (37, 2, 96) and out.dtype == torch.float32
    scale = reference.abs().max()
    assert (out - reference).abs().max() / scale < 1e-6  # observed 1.5e-7
    assert (out - reference).abs().max() <= 2 * (unfused - reference).abs().max() + 1e-7 * scale


@needs_onednn
def test_float32_layers_wider_than_the_bound_run_unfused_and_bfloat16_ones_fused(fused_calls):
    wide = gelu.FUSED_FLOAT32_MAX_IN_FEATURES + 1
    gen = torch.Generator().manual_seed(0)
    x, weight, bias = torch.randn(5, wide, generator=gen), torch.randn(8, wide, generator=gen), torch.randn(8)
    with torch.no_grad():
        out = linear_gelu(x, weight, bias)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            linear_gelu(x, weight, bias)
    assert fused_calls == [None, torch.bfloat16 if torch.bfloat16 in fused_dtypes() else None]
    assert torch.equal(out, F.gelu(F.linear(x, weight, bias)))  # the plain ops ran


@needs_onednn
def test_bfloat16_autocast_is_fused_and_no_less_accurate_than_the_unfused_ops(fused_calls):
    x, weight, bias = layer(torch.float32, tokens=401)
    reference = F.gelu(F.linear(x.double(), weight.double(), bias.double()), approximate='tanh')
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        out = linear_gelu(x, weight, bias, 'tanh')
        unfused = F.gelu(F.linear(x, weight, bias), approximate='tanh')
    # fused where this torch's oneDNN runs the bfloat16 kernel (not torch 2.1's without AMX: fused_dtypes())
    assert fused_calls == [torch.bfloat16 if torch.bfloat16 in fused_dtypes() else None]
    assert out.dtype == unfused.dtype == torch.bfloat16
    fused_error = ((out.double() - reference).norm() / reference.norm()).item()
    unfused_error = ((unfused.double() - reference).norm() / reference.norm()).item()
    # one rounding to bfloat16 (from the float32 accumulator) instead of two: observed 2.9e-3 against 3.5e-3
    assert fused_error <= unfused_error, (fused_error, unfused_error)


def test_training_takes_the_differentiable_ops(fused_calls):
    x, weight, bias = (t.requires_grad_() for t in layer(torch.float32))
    linear_gelu(x, weight, bias, 'tanh').square().sum().backward()
    assert fused_calls == [None]
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight, bias)]
    F.gelu(F.linear(*leaves), approximate='tanh').square().sum().backward()
    for got, want in zip((x, weight, bias), leaves):
        torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=0)


def test_bad_approximation_is_refused():
    with pytest.raises(ValueError, match=r"approximate must be one of \('none', 'tanh'\), got 'fast'"):
        linear_gelu(*layer(), approximate='fast')


@pytest.mark.parametrize('act_layer', [TanhGELU, torch.nn.GELU, torch.nn.ReLU])
def test_gelu_mlp_is_timms_mlp(act_layer):
    torch.manual_seed(0)
    ours, timms = GeluMlp(24, 96, act_layer=act_layer), Mlp(24, 96, act_layer=act_layer)
    assert list(ours.state_dict()) == list(timms.state_dict())
    timms.load_state_dict(ours.state_dict())
    x = layer()[0]
    with torch.no_grad():
        torch.testing.assert_close(ours(x), timms(x), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(ours.double()(x.double()), timms.double()(x.double()), rtol=0, atol=1e-15)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_gelu_tanh_in_place_is_the_tanh_gelu(dtype):
    """Values from -1e4 to 1e4, chunks that do not divide the tensor: against the function in float64, no further off
    than F.gelu in the same dtype (plus 16 eps relative to each value, and the smallest normal number; observed at most
    8 eps). The float64 reference is F.gelu for x >= 0 and, for x < 0, where ``1 + tanh(u)`` cancels (float64's
    F.gelu gives 0 below x = -10), its exact rewriting ``x e^{2u} / (1 + e^{2u})``, whose exponentials cannot
    overflow there."""
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.linspace(-12, 12, 4001, dtype=torch.float64), 3 * torch.randn(3000, generator=gen,
                   dtype=torch.float64), torch.tensor([0.0, -0.0, 1e4, -1e4, 1e-30, -1e-30], dtype=torch.float64)])
    e_2u = torch.exp(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))
    reference = torch.where(x < 0, x * e_2u / (1 + e_2u), F.gelu(x, approximate='tanh'))
    plain = F.gelu(x.to(dtype), approximate='tanh').double()
    got = x.to(dtype)
    assert gelu_tanh_(got, chunk=1000) is got and got.dtype == dtype
    tiny = torch.finfo(dtype).tiny
    bound = (plain - reference).abs() + 16 * torch.finfo(dtype).eps * reference.abs() + tiny
    assert bool(((got.double() - reference).abs() <= bound).all())
    # every chunk is computed (the vectorised and the scalar remainder of a chunk may round differently)
    torch.testing.assert_close(gelu_tanh_(x.to(dtype)), got, rtol=4 * torch.finfo(dtype).eps, atol=tiny)


def test_gelu_tanh_in_place_adds_the_bias_along_the_rows():
    """The bias of a GEMM run without it, added row by row in chunks of whole rows (chunks that do not divide the
    rows): against F.gelu(x + bias) in float64, no further off than F.gelu(x + bias) in float32."""
    gen = torch.Generator().manual_seed(1)
    x, bias = 3 * torch.randn(37, 2, 96, generator=gen), torch.randn(96, generator=gen)
    reference = F.gelu(x.double() + bias.double(), approximate='tanh')
    plain = F.gelu(x + bias, approximate='tanh')
    got = x.clone()
    assert gelu_tanh_(got, bias, chunk=5 * 96 + 7) is got
    scale = reference.abs().max()
    assert (got - reference).abs().max() <= 2 * (plain - reference).abs().max() + 1e-7 * scale
    torch.testing.assert_close(gelu_tanh_(x.clone(), bias), got, rtol=4e-7, atol=1e-30)  # one chunk, the same values


def test_gelu_tanh_in_place_refuses_bad_input():
    with pytest.raises(ValueError, match=r'gelu_tanh_: x must be contiguous, got shape \(3, 2\)'):
        gelu_tanh_(torch.zeros(2, 3).t())
    with pytest.raises(ValueError, match=r'gelu_tanh_: chunk must be an int >= 1, got 0'):
        gelu_tanh_(torch.zeros(3), chunk=0)
    with pytest.raises(ValueError, match=r'gelu_tanh_: bias must have shape \(3,\) \(the last dim of x\), got \(2,\)'):
        gelu_tanh_(torch.zeros(2, 3), torch.zeros(2))
