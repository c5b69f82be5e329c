"""Tests of soft_mm.ops.soft_attention against full Gaussian attention and a float64 pinv reference."""
import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from soft_mm.ops import gaussian_kernel, naive_soft_attention, soft_attention
from soft_mm.ops.compat import CPU_FLOAT16_AUTOCAST, matmul
from soft_mm.testing import relative_error


def random_inputs(batch=2, heads=3, num_tokens=32, num_landmarks=6, head_dim=4, value_dim=5, spread=1.0, seed=0,
                  dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = spread * torch.randn(batch, heads, num_tokens, head_dim, generator=gen, dtype=torch.float64)
    landmarks = 2.0 * torch.randn(batch, heads, num_landmarks, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, heads, num_tokens, value_dim, generator=gen, dtype=torch.float64)
    return q.to(dtype), landmarks.to(dtype), v.to(dtype)


def reference_attention(q, landmarks, v, soft_norm=False, ridge=0.0):
    """``K1 (D^-1/2) pinv(A + ridge I) (D^-1/2) K1^T v`` in float64 with an explicit m×m pinv."""
    q, landmarks, v = q.double(), landmarks.double(), v.double()
    k1 = gaussian_kernel(q, landmarks)
    kernel_landmarks = gaussian_kernel(landmarks, landmarks)
    eye = torch.eye(landmarks.shape[-2], dtype=torch.float64)
    middle = torch.linalg.pinv(kernel_landmarks + ridge * eye)
    if soft_norm:
        d_inv_sqrt = torch.diag_embed(kernel_landmarks.sum(-1).rsqrt())
        middle = d_inv_sqrt @ middle @ d_inv_sqrt
    return k1 @ middle @ k1.transpose(-2, -1) @ v


def test_every_token_as_landmark_reproduces_full_attention():
    gen = torch.Generator().manual_seed(0)
    q = 2.0 * torch.randn(2, 2, 16, 4, generator=gen, dtype=torch.float64)  # well separated: cond(A) < 5
    v = torch.randn(2, 2, 16, 4, generator=gen, dtype=torch.float64)
    full = gaussian_kernel(q, q) @ v
    out = soft_attention(q, q, v, num_iters=30)
    assert out.shape == (2, 2, 16, 4) and out.dtype == torch.float64
    assert (out - full).abs().max() < 1e-6  # observed 2e-15


@pytest.mark.parametrize('soft_norm', [False, True])
@pytest.mark.parametrize('ridge', [0.0, 0.02])
def test_matches_float64_pinv_reference(soft_norm, ridge):
    q, landmarks, v = random_inputs()
    out = soft_attention(q, landmarks, v, num_iters=30, soft_norm=soft_norm, ridge=ridge)
    reference = reference_attention(q, landmarks, v, soft_norm=soft_norm, ridge=ridge)
    assert out.shape == (2, 3, 32, 5)
    assert relative_error(out, reference) < 1e-10
    # The setting is applied: the other value of `soft_norm` is far from this reference.
    other = soft_attention(q, landmarks, v, num_iters=30, soft_norm=not soft_norm, ridge=ridge)
    assert relative_error(other, reference) > 1e-2


@pytest.mark.parametrize('soft_norm', [False, True])
def test_naive_reference_is_soft_attention(soft_norm):
    # the plain math (the FlashAttention rule's baseline, the benchmarks' plain-PyTorch SOFT) computes the op's function
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 50, 4, generator=gen, dtype=torch.float64)
    landmarks = 2 * torch.randn(1, 2, 6, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(1, 2, 50, 3, generator=gen, dtype=torch.float64)
    expected = soft_attention(q, landmarks, v, soft_norm=soft_norm, ridge=0.01)
    torch.testing.assert_close(naive_soft_attention(q, landmarks, v, soft_norm=soft_norm, ridge=0.01), expected,
                               rtol=1e-12, atol=1e-12)
    with torch.autocast('cpu', dtype=torch.bfloat16):  # autocast off inside: the inputs' dtype throughout
        assert naive_soft_attention(q.float(), landmarks.float(), v.float()).dtype == torch.float32


def test_num_iters_and_backward_are_applied():
    q, landmarks, v = random_inputs(num_landmarks=8, seed=1)
    landmarks = 0.3 * landmarks  # closer landmarks: A needs more than 2 iterations
    converged = soft_attention(q, landmarks, v, num_iters=60)
    assert relative_error(soft_attention(q, landmarks, v, num_iters=2), converged) > 1e-2
    grads = {}
    for backward in ('implicit', 'unrolled'):
        leaf = landmarks.clone().requires_grad_()
        soft_attention(q, leaf, v, num_iters=3, backward=backward).sum().backward()
        grads[backward] = leaf.grad
    assert relative_error(grads['implicit'], grads['unrolled']) > 1e-2


def test_error_falls_as_landmarks_increase():
    # 256 tokens on a 16x16 grid with smooth features; landmarks are averages of 8x8, 4x4 and 2x2 token groups.
    gen = torch.Generator().manual_seed(0)
    rows, cols = torch.meshgrid(torch.linspace(0, 1, 16, dtype=torch.float64),
                                torch.linspace(0, 1, 16, dtype=torch.float64), indexing='ij')
    grid = torch.stack([rows, cols], -1)  # (16, 16, 2)
    frequencies = 2 * torch.randn(2, 8, generator=gen, dtype=torch.float64)
    phases = 6.28 * torch.rand(8, generator=gen, dtype=torch.float64)
    feature_map = torch.sin(grid @ frequencies + phases).permute(2, 0, 1)[None]  # (1, 8, 16, 16)
    q = feature_map.flatten(2).transpose(1, 2)[None]  # (1, 1, 256, 8)
    v = torch.randn(1, 1, 256, 4, generator=gen, dtype=torch.float64)
    full = gaussian_kernel(q, q) @ v
    errors = []
    for grid_size in (2, 4, 8):
        landmarks = F.adaptive_avg_pool2d(feature_map, grid_size).flatten(2).transpose(1, 2)[None]
        errors.append(relative_error(soft_attention(q, landmarks, v), full))
    # Observed with the default 20 iterations: 0.41, 0.050, 0.0015 for m = 4, 16, 64.
    assert errors[0] > 3 * errors[1] > 9 * errors[2]
    assert errors[2] < 1e-2


def test_product_order_never_forms_n_by_m_by_m_products():
    q, landmarks, v = random_inputs(batch=1, heads=1, num_tokens=40, num_landmarks=7, head_dim=3, value_dim=5)
    calls = []

    class RecordMatmul(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__):
                calls.append(tuple(tuple(arg.shape[-2:]) for arg in args[:2]))
            return func(*args, **(kwargs or {}))

    with RecordMatmul():
        soft_attention(q, landmarks, v, num_iters=2)
    # K1^T v, then A^+ (K1^T v), then K1 (A^+ K1^T v); never K1 A^+ (N×m by m×m) or anything N×N.
    assert ((40, 7), (7, 7)) not in calls
    assert ((7, 40), (40, 5)) in calls and ((7, 7), (7, 5)) in calls
    assert calls[-1] == ((40, 7), (7, 5))
    assert not any(left[0] == 40 and right[1] == 40 for left, right in calls)


@pytest.mark.parametrize('soft_norm', [False, True])
def test_gradcheck_through_attention(soft_norm):
    q, landmarks, v = random_inputs(batch=1, heads=2, num_tokens=5, num_landmarks=3, head_dim=2, value_dim=2)
    inputs = tuple(t.clone().requires_grad_() for t in (q, landmarks, v))
    assert torch.autograd.gradcheck(lambda *t: soft_attention(*t, num_iters=40, soft_norm=soft_norm), inputs)


def test_value_dim_may_differ_from_head_dim():
    q, landmarks, v = random_inputs(head_dim=4, value_dim=7)
    assert soft_attention(q, landmarks, v).shape == (2, 3, 32, 7)


def low_precision_check(q, landmarks, v, dtype, autocast: bool, grad_scale: float = 1.0):
    """Outputs and gradients are finite, in ``dtype``, and as accurate as rounding to ``dtype`` allows."""
    grad_out = grad_scale * torch.randn(v.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    leaves = tuple(t.clone().requires_grad_() for t in (q, landmarks, v))
    with torch.autocast(device_type='cpu', dtype=torch.bfloat16, enabled=autocast):
        out = soft_attention(*leaves, soft_norm=True)
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.backward(grad_out.to(dtype))
    # float16: everything inside ran in float32, only the rounding of inputs, output and gradients is left (observed
    # 0.0002, <= 0.0003). bfloat16: the two products with v ran in bfloat16, the exponent and inverse in float32
    # (observed well below bfloat16's eps; tests/ops/soft/test_dispatch.py holds it to the FlashAttention rule).
    ref_leaves = tuple(t.detach().double().requires_grad_() for t in (q, landmarks, v))
    reference = soft_attention(*ref_leaves, soft_norm=True)
    reference.backward(grad_out)
    assert relative_error(out, reference) < torch.finfo(dtype).eps
    for leaf, ref_leaf in zip(leaves, ref_leaves):
        assert leaf.grad.dtype == dtype and torch.isfinite(leaf.grad).all()
        assert relative_error(leaf.grad, ref_leaf.grad) < torch.finfo(dtype).eps


def test_bfloat16_under_autocast_is_finite_and_accurate():
    q, landmarks, v = random_inputs(num_tokens=64, dtype=torch.bfloat16)
    low_precision_check(q, landmarks, v, torch.bfloat16, autocast=True)


def test_float16_inputs_are_finite_and_accurate():
    # 8192 nearly identical tokens and one landmark at kernel value ~0.72 from them: K1^T v ~ 0.72 * 8192 * 12 ~ 7e4
    # overflows float16 (max 65504), although the output, ~0.72^2 * 8192 * 12 ~ 5e4, is representable.
    gen = torch.Generator().manual_seed(0)
    q = 0.01 * torch.randn(1, 1, 8192, 4, generator=gen)
    landmarks = torch.tensor([0.81, 0.0, 0.0, 0.0]).expand(1, 1, 1, 4)
    v = 10 + 4 * torch.rand(1, 1, 8192, 2, generator=gen)
    q, landmarks, v = q.half(), landmarks.half(), v.half()
    assert torch.isinf(matmul(gaussian_kernel(q, landmarks).transpose(-2, -1), v)).any()  # what plain float16 does
    # Scaled gradients (as with a float16 loss scaler): d out / d q itself is ~1e5 here.
    low_precision_check(q, landmarks, v, torch.float16, autocast=False, grad_scale=1e-3)


def test_float32_under_autocast_gives_the_autocast_dtype():
    # bfloat16 autocast turns on the bfloat16 products and the output takes the autocast dtype, as a matmul's does;
    # float16 autocast on CPU runs float32 products (no CPU backend stores its sums in float32) and a float16 output
    q, landmarks, v = random_inputs(dtype=torch.float32)
    with torch.autocast(device_type='cpu', dtype=torch.bfloat16):
        out = soft_attention(q, landmarks, v)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, reference_attention(q, landmarks, v)) < torch.finfo(torch.bfloat16).eps
    if CPU_FLOAT16_AUTOCAST:  # torch >= 2.3
        with torch.autocast(device_type='cpu', dtype=torch.float16):
            out = soft_attention(q, landmarks, v)
        assert out.dtype == torch.float16
        assert torch.equal(out, soft_attention(q, landmarks, v, precision='highest').half())
    # float64 keeps float64 under autocast
    with torch.autocast(device_type='cpu', dtype=torch.bfloat16):
        assert soft_attention(q.double(), landmarks.double(), v.double()).dtype == torch.float64


@pytest.mark.parametrize('shapes, match', [
    (((2, 8, 4), (2, 1, 3, 4), (2, 1, 8, 4)), 'q must have 4 dims'),
    (((2, 1, 8, 4), (2, 3, 4), (2, 1, 8, 4)), 'landmarks must have 4 dims'),
    (((2, 1, 8, 4), (2, 1, 3, 4), (2, 8, 4)), 'v must have 4 dims'),
    (((2, 1, 8, 4), (1, 1, 3, 4), (2, 1, 8, 4)), 'landmarks must have shape'),
    (((2, 1, 8, 4), (2, 2, 3, 4), (2, 1, 8, 4)), 'landmarks must have shape'),
    (((2, 1, 8, 4), (2, 1, 3, 5), (2, 1, 8, 4)), 'landmarks must have shape'),
    (((2, 1, 8, 4), (2, 1, 0, 4), (2, 1, 8, 4)), 'at least one landmark'),
    (((2, 1, 8, 4), (2, 1, 3, 4), (2, 1, 7, 4)), 'v must have shape'),
    (((2, 1, 8, 4), (2, 1, 3, 4), (1, 1, 8, 4)), 'v must have shape'),
])
def test_bad_shapes_raise(shapes, match):
    q, landmarks, v = (torch.zeros(shape) for shape in shapes)
    with pytest.raises(ValueError, match=match):
        soft_attention(q, landmarks, v)


def test_bad_settings_raise():
    q, landmarks, v = random_inputs()
    with pytest.raises(ValueError, match='num_iters'):
        soft_attention(q, landmarks, v, num_iters=-1)
    with pytest.raises(ValueError, match='ridge'):
        soft_attention(q, landmarks, v, ridge=-1.0)
    with pytest.raises(ValueError, match='backward'):
        soft_attention(q, landmarks, v, backward='exact')
    with pytest.raises(TypeError, match='floating-point'):
        soft_attention(q.long(), landmarks, v)


@pytest.mark.parametrize('backend', ['reference', 'tiled'])
def test_landmarks_made_by_a_gelu_get_their_exact_gradient(backend):
    # The layer's landmarks come out of a GELU, and the op's landmark gradient is built transposed: torch 2.1's CPU
    # GELU backward misread such a gradient (values up to 1e32), which compat.dense_grad puts right
    gen = torch.Generator().manual_seed(5)
    q = 0.4 * torch.randn(2, 2, 60, 32, generator=gen, dtype=torch.float64)
    pre = torch.randn(2, 2, 49, 32, generator=gen, dtype=torch.float64)  # contiguous (B, h, m, d), as a LayerNorm's
    v = torch.randn(2, 2, 60, 32, generator=gen, dtype=torch.float64)
    grad_out = torch.randn(2, 2, 60, 32, generator=gen, dtype=torch.float64)

    def grad_of_pre(dtype):
        leaf = pre.to(dtype).detach().requires_grad_()
        out = soft_attention(q.to(dtype), F.gelu(leaf), v.to(dtype), soft_norm=True, ridge=0.01, backend=backend,
                             tile_size=16)
        return torch.autograd.grad(out, leaf, grad_out.to(dtype))[0]

    exact = grad_of_pre(torch.float64)
    assert relative_error(grad_of_pre(torch.float32), exact) < 1e-5


def test_normalize_is_the_earlier_name_of_soft_norm():
    q, landmarks, v = random_inputs()
    for function in (soft_attention, naive_soft_attention):
        with pytest.warns(FutureWarning, match=rf'^{function.__name__}\(normalize=\.\.\.\) is now'):
            renamed = function(q, landmarks, v, normalize=True, ridge=0.01)
        assert torch.equal(renamed, function(q, landmarks, v, soft_norm=True, ridge=0.01))
        assert not torch.allclose(renamed, function(q, landmarks, v, ridge=0.01))
