"""Tests of soft_mm.ops.soft.backends.tiled: the token-tiled products against the untiled math, and the path
soft_attention takes."""
import pytest
import torch

from soft_mm.ops import gaussian_kernel, soft_attention
from soft_mm.ops.soft.backends.tiled import AUTO_TILING_MIN_TOKENS, tiled_nystrom_products
from soft_mm.ops.soft.dispatch import DispatchError
from soft_mm.ops.soft.kernel import augment_kernel_cols, augment_kernel_rows


def random_inputs(groups=3, num_tokens=37, num_landmarks=5, head_dim=4, value_dim=6, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(groups, num_tokens, head_dim, generator=gen, dtype=torch.float64)
    landmarks = 1.5 * torch.randn(groups, num_landmarks, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(groups, num_tokens, value_dim, generator=gen, dtype=torch.float64)
    middle = torch.randn(groups, num_landmarks, num_landmarks, generator=gen, dtype=torch.float64)
    return tuple(t.to(dtype) for t in (q, landmarks, v, middle))


def untiled_products(q, landmarks, v, middle):
    k1 = gaussian_kernel(q, landmarks)
    return k1 @ (middle @ (k1.transpose(-2, -1) @ v))


def outputs_and_grads(fn, inputs, grad_out):
    leaves = tuple(t.clone().requires_grad_() for t in inputs)
    out = fn(*leaves)
    return (out.detach(), *torch.autograd.grad(out, leaves, grad_out))


def max_relative_error(results, references) -> float:
    return max(((a - b).norm() / b.norm()).item() for a, b in zip(results, references))


def test_augmented_rows_give_the_kernel_exponent():
    q, landmarks, _, _ = random_inputs()
    exponent = augment_kernel_rows(q) @ augment_kernel_cols(landmarks).transpose(-2, -1)
    torch.testing.assert_close(exponent.clamp_max(0).exp(), gaussian_kernel(q, landmarks), rtol=0, atol=1e-14)
    assert augment_kernel_rows(q).shape == (3, 37, 6) and augment_kernel_cols(landmarks).shape == (3, 5, 6)


# 37 tokens: tiles of 5 (7 full + one of 2), 37 (one exact tile), 64 (N < tile), 1 (one token per tile).
@pytest.mark.parametrize('tile_size', [1, 5, 37, 64])
def test_outputs_and_gradients_match_untiled_float64(tile_size):
    inputs = random_inputs()
    grad_out = torch.randn(3, 37, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    tiled = outputs_and_grads(lambda *t: tiled_nystrom_products(*t, tile_size=tile_size), inputs, grad_out)
    reference = outputs_and_grads(untiled_products, inputs, grad_out)
    assert max_relative_error(tiled, reference) < 1e-12  # observed ~1e-15


def test_single_token():
    inputs = random_inputs(num_tokens=1)
    grad_out = torch.randn(3, 1, 6, dtype=torch.float64)
    tiled = outputs_and_grads(lambda *t: tiled_nystrom_products(*t, tile_size=4), inputs, grad_out)
    reference = outputs_and_grads(untiled_products, inputs, grad_out)
    assert tiled[0].shape == (3, 1, 6)
    assert max_relative_error(tiled, reference) < 1e-12


def test_gradcheck_with_several_tiles():
    inputs = tuple(t.requires_grad_() for t in random_inputs(groups=2, num_tokens=7, num_landmarks=3, head_dim=2,
                                                             value_dim=2))
    assert torch.autograd.gradcheck(lambda *t: tiled_nystrom_products(*t, tile_size=3), inputs)


def test_bad_arguments_raise():
    q, landmarks, v, middle = random_inputs()
    with pytest.raises(ValueError, match='tile_size must be an int >= 1'):
        tiled_nystrom_products(q, landmarks, v, middle, tile_size=0)
    with pytest.raises(ValueError, match='middle must have shape'):
        tiled_nystrom_products(q, landmarks, v, middle[:, :2], tile_size=4)
    with pytest.raises(ValueError, match='must all be 3-d'):
        tiled_nystrom_products(q[None], landmarks, v, middle, tile_size=4)
    with pytest.raises(ValueError, match='tile_size must be None'):
        soft_attention(q[None], landmarks[None], v[None], tile_size=-1)
    with pytest.raises(ValueError, match='tile_size must be None'):
        soft_attention(q[None], landmarks[None], v[None], tile_size=0)
    with pytest.raises(ValueError, match='share the work dtype'):
        tiled_nystrom_products(q, landmarks.float(), v, middle, tile_size=4)
    with pytest.raises(ValueError, match='must be in the work dtype'):
        tiled_nystrom_products(q.float(), landmarks, v, middle, tile_size=4)


def attention_inputs(batch=2, heads=2, num_tokens=45, num_landmarks=6, head_dim=4, value_dim=5, dtype=torch.float64):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(batch, heads, num_tokens, head_dim, generator=gen, dtype=torch.float64)
    landmarks = 2.0 * torch.randn(batch, heads, num_landmarks, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, heads, num_tokens, value_dim, generator=gen, dtype=torch.float64)
    return tuple(t.to(dtype) for t in (q, landmarks, v))


@pytest.mark.parametrize('soft_norm', [False, True])
@pytest.mark.parametrize('backward', ['implicit', 'unrolled'])
@pytest.mark.parametrize('tile_size', [1, 8, 45, 100])
def test_soft_attention_tiled_equals_untiled(soft_norm, backward, tile_size):
    inputs = attention_inputs()
    grad_out = torch.randn(2, 2, 45, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def run(backend, tile=None):
        return outputs_and_grads(lambda *t: soft_attention(*t, num_iters=30, soft_norm=soft_norm, ridge=0.01,
                                                           backward=backward, backend=backend, tile_size=tile),
                                 inputs, grad_out)

    assert max_relative_error(run('tiled', tile_size), run('reference')) < 1e-12  # observed ~1e-15


def test_soft_attention_gradcheck_tiled():
    q, landmarks, v = (t.requires_grad_() for t in attention_inputs(batch=1, num_tokens=7, num_landmarks=3,
                                                                     head_dim=2, value_dim=2))
    assert torch.autograd.gradcheck(lambda *t: soft_attention(*t, num_iters=40, soft_norm=True, backend='tiled',
                                                                 tile_size=3),
                                    (q, landmarks, v))


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision_inputs_tiled(dtype):
    q, landmarks, v = (t.requires_grad_() for t in attention_inputs(dtype=dtype))
    out = soft_attention(q, landmarks, v, soft_norm=True, backend='tiled', tile_size=8)
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.float().square().sum().backward()
    assert all(t.grad.dtype == dtype and torch.isfinite(t.grad).all() for t in (q, landmarks, v))
    reference = soft_attention(*(t.detach().double() for t in (q, landmarks, v)), soft_norm=True,
                               backend='reference')
    assert ((out.double() - reference).norm() / reference.norm()).item() < torch.finfo(dtype).eps


def test_autocast_tiled_equals_untiled():
    q, landmarks, v = attention_inputs(dtype=torch.float32)
    with torch.autocast(device_type='cpu', dtype=torch.bfloat16):
        tiled = soft_attention(q, landmarks, v, backend='tiled', tile_size=8)
        untiled = soft_attention(q, landmarks, v, backend='reference')
    assert tiled.dtype == untiled.dtype == torch.bfloat16  # the autocast dtype
    # both in the bfloat16-products policy: the same rounding steps in another order
    torch.testing.assert_close(tiled, untiled, rtol=1e-2, atol=1e-3)


def test_automatic_tiling_and_tracing_take_the_expected_path(monkeypatch):
    import soft_mm.ops.soft.backends.tiled as tiled_module
    calls = []
    original = tiled_module.tiled_nystrom_products

    def record(*args, **kwargs):
        calls.append(args[0].shape[-2])  # tokens
        return original(*args, **kwargs)

    monkeypatch.setattr(tiled_module, 'tiled_nystrom_products', record)
    small = attention_inputs(batch=1, heads=1, num_tokens=AUTO_TILING_MIN_TOKENS, dtype=torch.float32)
    large = attention_inputs(batch=1, heads=1, num_tokens=AUTO_TILING_MIN_TOKENS + 1, dtype=torch.float32)
    soft_attention(*small)
    assert calls == []
    soft_attention(*large)
    assert calls == [AUTO_TILING_MIN_TOKENS + 1]
    # Tracing records the reference graph (the Newton-Schulz iterations as matmuls) even with a tile size, and the
    # traced function equals eager; forcing the tiled backend while tracing is refused with the reason.
    traced = torch.jit.trace(lambda q, lm, v: soft_attention(q, lm, v, tile_size=8), attention_inputs(),
                             check_trace=False)
    assert calls == [AUTO_TILING_MIN_TOKENS + 1]
    assert 'soft_mm::' not in str(traced.graph) and 'aten::matmul' in str(traced.graph)  # no custom op: plain ATen
    other_size = attention_inputs(num_tokens=30)
    torch.testing.assert_close(traced(*other_size), soft_attention(*other_size, backend='tiled', tile_size=8),
                               rtol=1e-12, atol=0)
    with pytest.raises(DispatchError, match="backend 'tiled' cannot run while a graph is exported"):
        torch.jit.trace(lambda q, lm, v: soft_attention(q, lm, v, backend='tiled'), attention_inputs(),
                        check_trace=False)


def test_token_major_views_are_read_in_place_and_the_output_keeps_their_layout():
    # q and v as the attention layer makes them: head-split views of token-major (B, N, h * d) projections.
    batch, heads, num_tokens, head_dim = 2, 3, 29, 4
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(batch, num_tokens, heads, head_dim, generator=gen, dtype=torch.float64).transpose(1, 2)
    v = torch.randn(batch, num_tokens, heads, head_dim, generator=gen, dtype=torch.float64).transpose(1, 2)
    landmarks = 1.5 * torch.randn(batch, heads, 5, head_dim, generator=gen, dtype=torch.float64)
    middle = torch.randn(batch, heads, 5, 5, generator=gen, dtype=torch.float64)
    grad_out = torch.randn(batch, num_tokens, heads, head_dim, generator=gen, dtype=torch.float64).transpose(1, 2)
    leaves = [t.detach().requires_grad_() for t in (q, landmarks, v, middle)]
    out = tiled_nystrom_products(*leaves, tile_size=8)
    grads = torch.autograd.grad(out, leaves, grad_out)
    reference = outputs_and_grads(untiled_products, (q.contiguous(), landmarks, v.contiguous(), middle),
                                  grad_out.contiguous())
    assert max_relative_error((out.detach(), *grads), reference) < 1e-12
    assert out.stride() == v.stride() and grads[0].stride() == q.stride() and grads[2].stride() == v.stride()
