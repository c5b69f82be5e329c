"""Tests of soft_mm.models.SoftAttention against full Gaussian-kernel attention computed by brute force in float64."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers.op_checks import cpu_float16

from soft_mm.models import SoftAttention, SoftmaxAttention
from soft_mm.testing import relative_error


def smooth_tokens(h: int, w: int, dim: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    """``(1, h*w, dim)`` float64 tokens that vary smoothly over the map (low-frequency cosines, random mixing)."""
    gen = torch.Generator().manual_seed(seed)
    ys = torch.linspace(0, 1, h, dtype=torch.float64)[:, None]
    xs = torch.linspace(0, 1, w, dtype=torch.float64)[None, :]
    out = torch.zeros(h, w, dim, dtype=torch.float64)
    for fy in range(2):
        for fx in range(2):
            wave = torch.cos(math.pi * fy * ys) * torch.cos(math.pi * fx * xs)
            out += wave[..., None] * torch.randn(dim, generator=gen, dtype=torch.float64)
    return scale * out.reshape(1, h * w, dim)


def split_heads(attn: SoftAttention, tokens: torch.Tensor) -> torch.Tensor:
    b, n, _ = tokens.shape
    return tokens.reshape(b, n, attn.num_heads, attn.head_dim).transpose(1, 2)


def full_attention_reference(attn: SoftAttention, x: torch.Tensor, hw_shape: tuple[int, int]) -> torch.Tensor:
    """Exact SOFT attention with the module's weights: ``proj(exp(-|q_i - q_j|^2 / (2 sqrt(d))) v + vconv(v))``.

    Written from the spec, independently of the module: brute-force pairwise distances of the unscaled queries, and
    the per-head value conv as a depthwise conv whose filter is repeated over the head's d channels.
    """
    b, n, c = x.shape
    q, v = split_heads(attn, attn.qk(x)), split_heads(attn, attn.v(x))  # (B, h, N, d)
    dist_sq = (q[..., :, None, :] - q[..., None, :, :]).pow(2).sum(-1)
    out = torch.exp(-dist_sq / (2 * math.sqrt(attn.head_dim))) @ v
    if attn.v_conv is not None:
        v_map = v.transpose(-2, -1).reshape(b, c, *hw_shape)  # channel = head * d + j
        weight = attn.v_conv.weight.repeat_interleave(attn.head_dim, dim=0)  # (C, 1, k, k)
        local = F.conv2d(v_map, weight, padding=weight.shape[-1] // 2, groups=c)
        out = out + local.reshape(b, attn.num_heads, attn.head_dim, n).transpose(-2, -1)
    return attn.proj(out.transpose(1, 2).reshape(b, n, c))


def test_error_against_full_attention_falls_as_landmark_grid_grows():
    hw = (16, 16)
    x = smooth_tokens(*hw, 64)
    errors = []
    for grid in (2, 4, 8, 16):
        torch.manual_seed(0)  # same weights for every grid
        attn = SoftAttention(64, 2, landmark_mode='avg', landmark_grid=grid, v_conv_kernel=3, newton_iters=40,
                             newton_ridge=0.0).double()
        with torch.no_grad():
            errors.append(relative_error(attn(x, hw), full_attention_reference(attn, x, hw)))
    # observed: 7.2e-2, 2.1e-3, 1.2e-7, 2.8e-10
    assert all(a > 10 * b for a, b in zip(errors, errors[1:])), errors
    assert errors[0] > 1e-2, errors  # the coarse grid really is an approximation
    assert errors[-1] < 1e-8, errors  # m = N: exact up to the Newton iteration


def test_every_token_a_landmark_is_exact_in_float64():
    # m = N (avg grid >= map side): K1 A^+ K1^T = S S^+ S = S, so the module equals full attention.
    for hw, seed in (((6, 6), 0), ((3, 5), 1), ((5, 7), 2)):
        torch.manual_seed(seed)
        attn = SoftAttention(32, 2, landmark_mode='avg', landmark_grid=8, v_conv_kernel=3, newton_ridge=0.0).double()
        assert attn.landmark_shape(hw) == hw
        x = torch.randn(2, hw[0] * hw[1], 32, dtype=torch.float64)
        with torch.no_grad():
            out, ref = attn(x, hw), full_attention_reference(attn, x, hw)
        assert (out - ref).abs().max().item() < 1e-9  # observed ~3e-14


def test_gradient_with_every_token_a_landmark_matches_full_attention():
    # S S^+ S v = S v holds for every x, so the implicit Newton backward must give the exact gradient too.
    torch.manual_seed(0)
    attn = SoftAttention(32, 2, landmark_mode='avg', landmark_grid=8, v_conv_kernel=3, newton_ridge=0.0).double()
    hw = (5, 6)
    x = torch.randn(2, 30, 32, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 30, 32, dtype=torch.float64)
    (grad_module,) = torch.autograd.grad((attn(x, hw) * weight).sum(), x)
    (grad_ref,) = torch.autograd.grad((full_attention_reference(attn, x, hw) * weight).sum(), x)
    torch.testing.assert_close(grad_module, grad_ref, rtol=0, atol=1e-8)


def test_default_ridge_is_the_authors_and_is_exactly_applied():
    # With every token a landmark the module computes S (S + ridge I)^-1 S v: the default 0.01 ridge is applied.
    torch.manual_seed(0)
    attn = SoftAttention(32, 2, landmark_mode='avg', landmark_grid=8, v_conv_kernel=0).double()
    assert attn.newton_ridge == 0.01
    x = torch.randn(1, 36, 32, dtype=torch.float64)
    with torch.no_grad():
        q, v = split_heads(attn, attn.qk(x)), split_heads(attn, attn.v(x))
        kernel = torch.exp(-(q[..., :, None, :] - q[..., None, :, :]).pow(2).sum(-1) / (2 * math.sqrt(16)))
        ridged = kernel @ torch.linalg.solve(kernel + 0.01 * torch.eye(36, dtype=torch.float64), kernel @ v)
        out = attn(x, (6, 6))
        ref = attn.proj(ridged.transpose(1, 2).reshape(1, 36, 32))
        exact = attn.proj((kernel @ v).transpose(1, 2).reshape(1, 36, 32))
    assert (out - ref).abs().max().item() < 1e-9
    assert (out - exact).abs().max().item() > 1e-4  # the ridge is not negligible


@pytest.mark.parametrize('soft_norm', [False, True])
def test_nystrom_formula_with_pooled_landmarks(soft_norm):
    """avg landmarks on an 8x8 map with grid 4 are 2x2 means of q; compare with K1 A^+ K1^T v (SOFT-Norm:
    K1 D^-1/2 A^+ D^-1/2 K1^T v, D = diag(A 1)) computed with torch.linalg.pinv."""
    torch.manual_seed(0)
    attn = SoftAttention(32, 2, landmark_mode='avg', landmark_grid=4, v_conv_kernel=0, soft_norm=soft_norm,
                         newton_iters=30, newton_ridge=0.0).double()
    x = torch.randn(2, 64, 32, dtype=torch.float64)
    bandwidth = 2 * math.sqrt(attn.head_dim)
    with torch.no_grad():
        q, v = split_heads(attn, attn.qk(x)), split_heads(attn, attn.v(x))
        landmarks = q.reshape(2, 2, 4, 2, 4, 2, 16).mean((3, 5)).reshape(2, 2, 16, 16)
        k1 = torch.exp(-torch.cdist(q, landmarks).pow(2) / bandwidth)
        kernel_landmarks = torch.exp(-torch.cdist(landmarks, landmarks).pow(2) / bandwidth)
        middle = torch.linalg.pinv(kernel_landmarks)
        if soft_norm:
            inv_sqrt_d = torch.diag_embed(kernel_landmarks.sum(-1).rsqrt())
            middle = inv_sqrt_d @ middle @ inv_sqrt_d
        ref = attn.proj((k1 @ middle @ k1.transpose(-2, -1) @ v).transpose(1, 2).reshape(2, 64, 32))
        out = attn(x, (8, 8))
    assert (out - ref).abs().max().item() < 1e-9  # observed ~1e-14


@pytest.mark.parametrize('landmark_mode', ['conv', 'avg'])
@pytest.mark.parametrize('hw', [(1, 1), (3, 5), (7, 7), (33, 47), (200, 334)])
def test_any_map_size_bounded_landmarks_finite_outputs(landmark_mode, hw):
    grid = 7
    torch.manual_seed(0)
    attn = SoftAttention(16, 2, landmark_mode=landmark_mode, landmark_stride=8, landmark_grid=grid, v_conv_kernel=9)
    n = hw[0] * hw[1]
    x = torch.randn(1, n, 16, requires_grad=True)
    out = attn(x, hw)
    assert out.shape == (1, n, 16) and out.isfinite().all()
    out.pow(2).mean().backward()
    assert x.grad.isfinite().all() and all(p.grad.isfinite().all() for p in attn.parameters())

    shape = attn.landmark_shape(hw)
    if landmark_mode == 'avg':
        expected = (min(grid, hw[0]), min(grid, hw[1]))
    else:
        expected = (min(grid, math.ceil(hw[0] / 8)), min(grid, math.ceil(hw[1] / 8)))
    assert shape == expected
    with torch.no_grad():
        landmarks = attn.sample_landmarks(split_heads(attn, attn.qk(x)), hw)
    assert landmarks.shape == (1, 2, shape[0] * shape[1], 8)
    assert landmarks.shape[2] <= grid ** 2


@pytest.mark.parametrize('landmark_mode', ['conv', 'avg'])
def test_border_tokens_change_the_landmarks(landmark_mode):
    # 33x47 is not a multiple of the stride 8: a bare strided conv would never see the last row and column.
    torch.manual_seed(0)
    attn = SoftAttention(16, 2, landmark_mode=landmark_mode, landmark_stride=8)
    hw = (33, 47)
    q = torch.randn(1, 2, 33 * 47, 8)
    with torch.no_grad():
        base = attn.sample_landmarks(q, hw)
        for token in (0, 46, 32 * 47, 33 * 47 - 1):  # the four corners
            moved = q.clone()
            moved[:, :, token] += 5.0
            assert (attn.sample_landmarks(moved, hw) - base).abs().max() > 1e-3, token


def test_conv_landmarks_at_224_stage_sizes_are_the_bare_strided_conv():
    # At the pretraining size every stage map is stride * 7, so the authors' sampler (strided conv, LN, GELU) is
    # reproduced exactly, without pooling.
    for side, stride in ((56, 8), (28, 4), (14, 2)):
        torch.manual_seed(0)
        attn = SoftAttention(64, 2, landmark_mode='conv', landmark_stride=stride).double()
        q = torch.randn(2, 2, side * side, 32, dtype=torch.float64)
        with torch.no_grad():
            q_map = q.reshape(4, side, side, 32).permute(0, 3, 1, 2)
            ref = F.gelu(attn.landmark_norm(attn.landmark_conv(q_map).flatten(2).transpose(1, 2)))
            out = attn.sample_landmarks(q, (side, side))
        assert attn.landmark_shape((side, side)) == (7, 7)
        # equal up to the rounding of the conv's memory layout (pooling, had it run, would change them at O(1))
        torch.testing.assert_close(out, ref.reshape(2, 2, 49, 32), rtol=0, atol=1e-13)


def test_conv_landmarks_are_one_matmul_of_patches_with_the_convs_gradients_and_a_hooked_conv_runs():
    """The eager sampler runs the stride-r conv as one matmul of the r x r patches: the conv module's values and
    gradients (float64, pooled map of an odd size); with a forward hook on the conv, the module itself runs."""
    torch.manual_seed(0)
    attn = SoftAttention(64, 2, landmark_mode='conv', landmark_stride=4).double()
    q = torch.randn(2, 2, 37 * 45, 32, dtype=torch.float64, requires_grad=True)
    out = attn.sample_landmarks(q, (37, 45))
    grads = torch.autograd.grad(out.square().sum(), (q, attn.landmark_conv.weight))
    seen = []
    handle = attn.landmark_conv.register_forward_hook(lambda module, args, output: seen.append(output.shape))
    ref = attn.sample_landmarks(q, (37, 45))
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, attn.landmark_conv.weight))
    handle.remove()
    assert seen == [(4, 32, 7, 7)] and out.shape == (2, 2, 49, 32)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-13)
    for got, expected in zip(grads, ref_grads):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_avg_landmarks_are_adaptive_means_of_q():
    attn = SoftAttention(16, 2, landmark_mode='avg', landmark_grid=3)
    q = torch.randn(1, 2, 6 * 9, 8)
    ref = q.reshape(1, 2, 3, 2, 3, 3, 8).mean((3, 5)).reshape(1, 2, 9, 8)
    torch.testing.assert_close(attn.sample_landmarks(q, (6, 9)), ref)


@pytest.mark.parametrize('landmark_mode', ['conv', 'avg'])
@pytest.mark.parametrize('weight', ['qk', 'v'])
def test_heads_do_not_mix(landmark_mode, weight):
    # Changing the projection rows of head 1 (queries/keys, hence its landmarks, or values) must leave head 0 alone.
    torch.manual_seed(0)
    attn = SoftAttention(16, 2, landmark_mode=landmark_mode, landmark_stride=2, v_conv_kernel=3).double()
    attn.proj = torch.nn.Identity()
    x = torch.randn(1, 36, 16, dtype=torch.float64)
    with torch.no_grad():
        base = attn(x, (6, 6))
        getattr(attn, weight).weight[8:] *= 3.0
        moved = attn(x, (6, 6))
    torch.testing.assert_close(moved[..., :8], base[..., :8], rtol=0, atol=0)
    assert (moved[..., 8:] - base[..., 8:]).abs().max() > 1e-3


@pytest.mark.parametrize('landmark_mode', ['conv', 'avg'])
def test_samples_do_not_mix(landmark_mode):
    # Each sample's output depends on that sample only (the authors' first release shared one Newton alpha per batch).
    torch.manual_seed(0)
    attn = SoftAttention(32, 2, landmark_mode=landmark_mode, landmark_stride=4).double()
    scales = torch.tensor([0.1, 1.0, 10.0], dtype=torch.float64).reshape(3, 1, 1)
    x = scales * torch.randn(3, 12 * 10, 32, dtype=torch.float64)
    with torch.no_grad():
        batched = attn(x, (12, 10))
        for i in range(3):
            torch.testing.assert_close(attn(x[i:i + 1], (12, 10)), batched[i:i + 1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('landmark_mode', ['conv', 'avg'])
def test_bfloat16_autocast_finite_outputs_and_gradients(landmark_mode):
    torch.manual_seed(0)
    attn = SoftAttention(64, 2, landmark_mode=landmark_mode)
    x = torch.randn(2, 56 * 56, 64, requires_grad=True)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = attn(x, (56, 56))
    assert out.dtype == torch.bfloat16 and out.isfinite().all()
    ref = attn(x.detach(), (56, 56))
    assert relative_error(out.float(), ref) < 0.05
    out.float().pow(2).mean().backward()
    assert x.grad.isfinite().all() and x.grad.abs().max() > 0
    assert all(p.grad is not None and p.grad.isfinite().all() for p in attn.parameters())


@cpu_float16
@pytest.mark.parametrize('landmark_mode', ['conv', 'avg'])
def test_float16_finite_outputs_and_gradients(landmark_mode):
    torch.manual_seed(0)
    attn = SoftAttention(64, 2, landmark_mode=landmark_mode)
    x = torch.randn(2, 56 * 56, 64)
    ref = attn(x, (56, 56))
    attn.half()
    x16 = x.half().requires_grad_()
    out = attn(x16, (56, 56))
    assert out.dtype == torch.float16 and out.isfinite().all()
    # Measured 5.7e-4 (conv) and 5.2e-4 (avg), at most 6.4e-4 over seeds 0-3, about half float16's eps (9.8e-4): the
    # attention op works in float32 inside. Its arithmetic left in float16 gives 1.4e-2 (avg). The bar has a 3x margin.
    assert relative_error(out.float(), ref) < 2e-3
    out.float().pow(2).mean().backward()
    assert x16.grad.isfinite().all() and x16.grad.abs().max() > 0
    assert all(p.grad is not None and p.grad.isfinite().all() for p in attn.parameters())


def test_settings_change_the_output():
    x = torch.randn(2, 16 * 16, 32)
    hw = (16, 16)

    def run(**kwargs) -> torch.Tensor:
        torch.manual_seed(0)
        attn = SoftAttention(32, 2, **{'landmark_stride': 4, **kwargs})
        with torch.no_grad():
            return attn(x, hw)

    base = run()
    torch.testing.assert_close(run(), base, rtol=0, atol=0)
    for kwargs in ({'landmark_grid': 2}, {'landmark_stride': 2}, {'newton_iters': 2}, {'newton_ridge': 0.05},
                   {'soft_norm': True}, {'v_conv_kernel': 5}, {'v_conv_kernel': 0}, {'landmark_mode': 'avg'},
                   {'qkv_bias': False}):
        assert (run(**kwargs) - base).abs().max() > 1e-4, kwargs


def test_newton_backward_changes_gradients_only_before_convergence():
    torch.manual_seed(0)
    x = torch.randn(1, 64, 32, dtype=torch.float64)

    def grads(newton_backward: str, newton_iters: int) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        attn = SoftAttention(32, 2, landmark_stride=2, landmark_grid=4, newton_iters=newton_iters,
                             newton_backward=newton_backward).double()
        out = attn(x, (8, 8))
        out.pow(2).sum().backward()
        return out.detach(), attn.qk.weight.grad

    out_implicit, grad_implicit = grads('implicit', 3)
    out_unrolled, grad_unrolled = grads('unrolled', 3)
    torch.testing.assert_close(out_implicit, out_unrolled, rtol=0, atol=0)
    assert (grad_implicit - grad_unrolled).abs().max() > 1e-3 * grad_unrolled.abs().max()
    _, grad_implicit = grads('implicit', 60)
    _, grad_unrolled = grads('unrolled', 60)
    torch.testing.assert_close(grad_implicit, grad_unrolled, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize('kwargs, name', [
    ({'dim': 30, 'num_heads': 4}, 'num_heads'),
    ({'landmark_mode': 'max'}, 'landmark_mode'),
    ({'landmark_grid': 0}, 'landmark_grid'),
    ({'landmark_grid': 2.5}, 'landmark_grid'),
    ({'landmark_stride': 0}, 'landmark_stride'),
    ({'v_conv_kernel': 4}, 'v_conv_kernel'),
    ({'v_conv_kernel': -1}, 'v_conv_kernel'),
    ({'newton_iters': 0}, 'newton_iters'),
    ({'newton_iters': 2.0}, 'newton_iters'),
    ({'newton_ridge': -0.01}, 'newton_ridge'),
    ({'newton_ridge': float('nan')}, 'newton_ridge'),
    ({'newton_backward': 'exact'}, 'newton_backward'),
    ({'landmark_grid': True}, 'landmark_grid'),
    ({'newton_ridge': 'a'}, 'newton_ridge'),
    ({'newton_ridge': float('inf')}, 'newton_ridge'),
    ({'newton_iters': True}, 'newton_iters'),
    ({'landmark_stride': True}, 'landmark_stride'),
])
def test_bad_arguments_raise_value_error_naming_them(kwargs, name):
    kwargs = {'dim': 32, 'num_heads': 2, **kwargs}
    with pytest.raises(ValueError, match=name):
        SoftAttention(**kwargs)


def test_forward_rejects_hw_shape_that_does_not_match_the_tokens():
    attn = SoftAttention(16, 2)
    with pytest.raises(ValueError, match='hw_shape'):
        attn(torch.randn(1, 20, 16), (4, 4))
    with pytest.raises(ValueError, match='hw_shape'):
        attn(torch.randn(1, 20, 16), (5, 5))


def test_softmax_attention_matches_explicit_softmax():
    torch.manual_seed(0)
    attn = SoftmaxAttention(32, 4).double()
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    q = attn.q(x).reshape(2, 10, 4, 8).transpose(1, 2)
    k, v = attn.kv(x).reshape(2, 10, 2, 4, 8).unbind(2)
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
    ref = attn.proj((weights @ v).transpose(1, 2).reshape(2, 10, 32))
    torch.testing.assert_close(attn(x), ref, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match='num_heads'):
        SoftmaxAttention(30, 4)
