"""The fused Triton backend, run on CPU tensors under the Triton interpreter (TRITON_INTERPRET=1): outputs and
gradients against the float64 reference at odd sizes, the FlashAttention rule in low precision, strided inputs.

Skipped, with the reason printed, only where triton cannot be imported; the installer installs it."""
from __future__ import annotations

import pytest
import torch
from helpers.op_checks import triton_kernels

from soft_mm.ops import soft_attention
from soft_mm.ops.route import route_of
from soft_mm.testing import RULE_FRACTION, relative_error, rule_errors, rule_inputs

pytestmark = triton_kernels


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv('TRITON_INTERPRET', '1')


@pytest.fixture
def compiled_blocks(monkeypatch):
    """The interpreter runs the token kernels in a GPU's blocks (nystrom_config.kernel_block's: several blocks a map,
    masked tails), not the whole-map blocks it takes otherwise."""
    import soft_mm.ops.soft.backends.triton.nystrom_launch as launch
    from soft_mm.ops.soft.backends.triton.nystrom_config import kernel_block

    monkeypatch.setattr(launch, '_interpreter_block', lambda kernel, num_tokens: kernel_block(kernel, None))
    launch._geometry.cache_clear()
    yield
    launch._geometry.cache_clear()


def inputs(num_tokens, num_landmarks):
    """The rule's inputs (a trained layer's magnitudes) in float64, two images of two heads of 32 dims."""
    return rule_inputs(num_tokens, num_landmarks, dtype=torch.float64)


def outputs_and_grads(tensors, grad_out, dtype, **kwargs):
    leaves = [t.to(dtype).clone().requires_grad_() for t in tensors]
    out = soft_attention(*leaves, ridge=0.01, **kwargs)
    return [out.detach(), *torch.autograd.grad(out, leaves, grad_out.to(out.dtype))]


@pytest.mark.parametrize('blocks', ['whole map', 'compiled'])
@pytest.mark.parametrize('soft_norm', [True, False])
@pytest.mark.parametrize('num_tokens, num_landmarks', [(1, 1), (63, 49), (300, 1), (300, 49)])
def test_float32_outputs_and_gradients_match_the_float64_reference(num_tokens, num_landmarks, soft_norm, blocks,
                                                                   request):
    if blocks == 'compiled':
        request.getfixturevalue('compiled_blocks')
    tensors, grad_out = inputs(num_tokens, num_landmarks)
    reference = outputs_and_grads(tensors, grad_out, torch.float64, soft_norm=soft_norm, backend='reference')
    fused = outputs_and_grads(tensors, grad_out, torch.float32, soft_norm=soft_norm, backend='triton')
    errors = [relative_error(a, b) for a, b in zip(fused, reference)]
    # observed <= 6.5e-6 (the float32 reference backend: ~5e-7; the kernels sum in another order)
    assert max(errors) < 3e-5, errors
    assert fused[0].dtype == torch.float32


def test_value_dim_and_head_dim_may_differ_and_strided_views_are_read_in_place():
    # q and v as the attention layer makes them: head-split views of token-major (B, N, h * d) projections
    gen = torch.Generator().manual_seed(3)
    q = 0.4 * torch.randn(2, 97, 3, 16, generator=gen).transpose(1, 2)
    v = torch.randn(2, 97, 3, 24, generator=gen).transpose(1, 2)
    landmarks = q[:, :, :7].clone() + 0.05
    out = soft_attention(q, landmarks, v, soft_norm=True, ridge=0.01, backend='triton')
    reference = soft_attention(q.double(), landmarks.double(), v.double(), soft_norm=True, ridge=0.01,
                               backend='reference')
    assert out.shape == (2, 3, 97, 24) and out.stride() == v.stride()
    assert relative_error(out, reference) < 3e-5


def test_gradients_of_non_dense_views_are_written_in_their_own_layout():
    # q and v are the first 32 of 48 channels of wider tensors (views with gaps, which empty_like does not copy: the
    # gradients are contiguous); writing them through q's and v's strides would go out of bounds
    tensors, grad_out = inputs(70, 9)
    wide = [torch.cat([t, torch.randn(*t.shape[:3], 16, dtype=t.dtype)], -1) for t in (tensors[0], tensors[2])]
    reference = outputs_and_grads(tensors, grad_out, torch.float64, soft_norm=True, backend='reference')
    leaves = [w.float().requires_grad_() for w in wide]
    landmarks = tensors[1].float().requires_grad_()
    q, v = leaves[0][..., :32], leaves[1][..., :32]
    assert not q.is_contiguous() and q.stride() == (2 * 70 * 48, 70 * 48, 48, 1)
    out = soft_attention(q, landmarks, v, ridge=0.01, soft_norm=True, backend='triton')
    grad_q, grad_landmarks, grad_v = torch.autograd.grad(out, (q, landmarks, v), grad_out.float())
    errors = [relative_error(a, b) for a, b in zip((out, grad_q, grad_landmarks, grad_v), reference)]
    assert max(errors) < 3e-5, errors
    assert grad_q.is_contiguous() and grad_v.is_contiguous()


@pytest.mark.parametrize('num_tokens, num_landmarks', [(63, 49), (300, 1)])
@pytest.mark.parametrize('input_dtype, autocast, low_dtype', [(torch.bfloat16, False, torch.bfloat16),
                                                              (torch.float32, True, torch.bfloat16),
                                                              (torch.float16, False, torch.float16),
                                                              (torch.float32, True, torch.float16)])
def test_low_precision_error_within_the_flash_attention_rule(num_tokens, num_landmarks, input_dtype, autocast,
                                                             low_dtype):
    # bfloat16 / float16 products with float32 accumulation (float16: float16 inputs, or float16 autocast as mmdet's
    # --amp on a GPU). Observed: each error 0.21-0.24 of the plain bfloat16 math's, 0.23-0.28 of the plain float16
    # math's (float16 products: 3e-4..8e-4 against plain float16's 1.6e-3..1.1e-2)
    tensors, grad_out = inputs(num_tokens, num_landmarks)
    tensors = [t.to(input_dtype) for t in tensors]

    def fused(*leaves):
        with torch.autocast('cpu', dtype=low_dtype, enabled=autocast):
            return soft_attention(*leaves, soft_norm=True, ridge=0.01, backend='triton')

    errors = rule_errors(fused, tensors, low_dtype, grad_out.float(), soft_norm=True, ridge=0.01)
    # at these sizes the strict half of the plain math's error holds (the rule's rounding bound is not needed)
    assert all(f <= RULE_FRACTION * p for f, p in zip(errors.fast, errors.plain)), errors
    fast_errors = errors.fast
    # and the products really ran in the low dtype: well above float32's error (no silent float32 path)
    assert min(fast_errors) > 50 * torch.finfo(torch.float32).eps, fast_errors


def test_float16_reaches_the_kernels_without_a_full_size_cast(monkeypatch):
    import soft_mm.ops.soft.backends.triton.nystrom_launch as triton_module
    seen = []
    original = triton_module._launch_forward
    monkeypatch.setattr(triton_module, '_launch_forward', lambda q, lm, v, mid, low, route: seen.append(
        (q.dtype, v.dtype, low)) or original(q, lm, v, mid, low, route))
    tensors, _ = inputs(40, 5)
    q, landmarks, v = (t.half() for t in tensors)
    assert soft_attention(q, landmarks, v, backend='triton').dtype == torch.float16
    with torch.autocast('cpu', dtype=torch.float16):  # float32 q and v (from float32 layers): v cast for the products
        assert soft_attention(*(t.float() for t in tensors), backend='triton').dtype == torch.float16
    assert seen == [(torch.float16, torch.float16, 2), (torch.float32, torch.float16, 2)]


def test_is_never_chosen_automatically_on_cpu(monkeypatch: pytest.MonkeyPatch):
    import soft_mm.ops.soft.backends.triton.nystrom_launch as triton_module
    calls = []
    original = triton_module._launch_forward
    monkeypatch.setattr(triton_module, '_launch_forward', lambda *a: calls.append(1) or original(*a))
    tensors, _ = inputs(40, 5)
    soft_attention(*(t.float() for t in tensors))
    assert calls == []
    soft_attention(*(t.float() for t in tensors), backend='triton')
    assert calls == [1]


def test_float16_products_keep_large_middle_factors_in_range():
    # landmarks far from the tokens (kernel values ~1e-3) and a middle matrix of 1e7 (an ill-conditioned inverse):
    # the m x d factors middle @ (K1^T v) reach ~4e5, beyond float16's 65504, while the float16 output and grad v
    # stay in range; each kernel scales such a factor tile into [-1, 1] by a power of two before rounding it
    from soft_mm.ops.soft.backends.triton.nystrom_launch import triton_nystrom_products
    gen = torch.Generator().manual_seed(4)
    q = 0.1 * torch.randn(1, 2, 100, 8, generator=gen, dtype=torch.float64)
    landmarks = 1.3 + 0.1 * torch.randn(1, 2, 4, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(1, 2, 100, 8, generator=gen, dtype=torch.float64)
    middle = 1e7 * (torch.eye(4, dtype=torch.float64)
                    + 0.1 * torch.rand(1, 2, 4, 4, generator=gen, dtype=torch.float64))
    grad_out = torch.randn(v.shape, generator=gen, dtype=torch.float64)

    def exact(q, landmarks, v):
        k1 = torch.exp(-0.5 * torch.cdist(q, landmarks).square())
        return k1 @ (middle @ (k1.transpose(-2, -1) @ v))

    leaves = [t.clone().requires_grad_() for t in (q, landmarks, v)]
    reference = exact(*leaves)
    reference_grads = torch.autograd.grad(reference, leaves, grad_out)
    assert (middle @ (torch.exp(-0.5 * torch.cdist(q, landmarks).square()).transpose(-2, -1) @ v)).abs().max() > 1e5
    assert reference.abs().max() < 1e4 and reference_grads[2].abs().max() < 1e4  # float16 out and grad v fit
    leaves = [q.float().requires_grad_(), landmarks.float().requires_grad_(), v.half().requires_grad_()]
    out = triton_nystrom_products(*leaves, middle.float(), products=torch.float16)
    grads = torch.autograd.grad(out, leaves, grad_out.half())
    assert out.dtype == torch.float16
    errors = [relative_error(a, b) for a, b in zip((out, *grads), (reference.detach(), *reference_grads))]
    assert max(errors) < 3e-3, errors  # float16 rounding of the factors and the output (observed 2.5e-4..4.7e-4)


@pytest.mark.parametrize('programs, splits', [(4, 1), (12, 3)])
def test_split_reduction_sums_several_blocks_per_program(monkeypatch, compiled_blocks, programs, splits):
    # 4 (sample, head) groups of 300 tokens: 5 forward blocks of 64 and 19 backward blocks of 16 tokens, summed by 1
    # or 3 programs per group (uneven shares) into as many partial sums; against float64, and run to run identical
    import soft_mm.ops.soft.backends.triton.nystrom_config as config
    monkeypatch.setattr(config, 'SPLIT_PROGRAMS', programs)
    assert config.split_count(300, 64, 4) == splits and config.split_count(300, 16, 4) == splits
    tensors, grad_out = inputs(300, 49)
    reference = outputs_and_grads(tensors, grad_out, torch.float64, soft_norm=True, backend='reference')
    fused = outputs_and_grads(tensors, grad_out, torch.float32, soft_norm=True, backend='triton')
    errors = [relative_error(a, b) for a, b in zip(fused, reference)]
    assert max(errors) < 3e-5, errors
    again = outputs_and_grads(tensors, grad_out, torch.float32, soft_norm=True, backend='triton')
    assert all(torch.equal(a, b) for a, b in zip(fused, again))


def test_the_interpreter_takes_whole_maps_and_the_compiled_blocks_where_the_tests_ask():
    import soft_mm.ops.soft.backends.triton.nystrom_launch as launch

    launch._geometry.cache_clear()
    backward = launch._geometry(2, 2, 300, 49, 32, 32, 'nystrom_bwd_kernel_dq_dv_dl', None)
    assert backward.grid == (1, 4) and backward.meta[0]['BLOCK'] == 512
    assert launch._geometry(1, 1, 5000, 49, 32, 32, 'nystrom_fwd_kernel_o', None).grid == (2, 1)  # 4,096 a block
    # a GPU's blocks are the compiled ones (sm_90: 64 tokens forward, 16 backward)
    assert launch._geometry(2, 2, 300, 49, 32, 32, 'nystrom_bwd_kernel_dq_dv_dl', 90).grid == (19, 4)


def test_the_compiled_blocks_fixture_gives_the_interpreter_a_gpu_s_blocks(compiled_blocks):
    import soft_mm.ops.soft.backends.triton.nystrom_launch as launch

    assert launch._geometry(2, 2, 300, 49, 32, 32, 'nystrom_bwd_kernel_dq_dv_dl', None).grid == (19, 4)
    assert launch._geometry(2, 2, 300, 49, 32, 32, 'nystrom_fwd_kernel_o', None).grid == (5, 4)


def test_split_count_follows_the_sizes_only():
    from soft_mm.ops.soft.backends.triton.nystrom_config import SPLIT_PROGRAMS, split_count
    assert split_count(66816, 64, 4) == SPLIT_PROGRAMS // 4 == 128  # 1044 blocks: about 8 per program
    assert split_count(100, 64, 4) == 2  # never more programs than blocks
    assert split_count(10 ** 6, 64, 10 ** 4) == 1  # at least one per group


def test_the_kernels_products_constants_are_the_launch_codes():
    # the kernels name their PRODUCTS values; the launches pass nystrom_config.PRODUCTS_CODES (the config is plain
    # Python, without triton, so it cannot read them from the kernels' module): the two must agree
    from soft_mm.ops.soft.backends.triton import nystrom_config as config
    from soft_mm.ops.soft.backends.triton import nystrom_launch

    kernels = nystrom_launch._kernels(route_of(torch.empty(0)))
    assert {name: getattr(kernels, f'PRODUCTS_{name.upper()}').value for name in config.PRODUCTS_CODES} \
        == config.PRODUCTS_CODES == {'float32': 0, 'bfloat16': 1, 'float16': 2}


class _OutOfResources:
    """A kernel that raises triton's OutOfResources at its launch (``kernel[grid](...)``), as triton does at a kernel's
    first launch where it asks for more shared memory than the device has; counts its launches."""

    def __init__(self):
        self.launches = 0

    def __getitem__(self, grid):
        from triton.runtime.errors import OutOfResources

        def launch(*args, **kwargs):
            self.launches += 1
            raise OutOfResources(200_704, 101_376, 'shared memory')
        return launch


@pytest.fixture
def launch_failures(monkeypatch):
    """``fail(kernel_name)``: that kernel raises OutOfResources from now on; the route is the interpreted GPU route,
    with no decision kept, nothing announced and no failure recorded before the test (all dropped after it)."""
    from soft_mm.ops import triton_route
    from soft_mm.ops.soft import dispatch
    from soft_mm.ops.soft.backends.triton import nystrom_launch, nystrom_limits
    monkeypatch.setattr(dispatch, '_DECISIONS', {})
    monkeypatch.setattr(dispatch, '_ANNOUNCED', set())
    monkeypatch.setattr(nystrom_limits, '_FAILED_LAUNCHES', {})
    # (interpreted_triton_route(), for the test's duration)
    monkeypatch.setitem(triton_route._ROUTE, 'cpu', triton_route.CpuRoute())
    dispatch.forget_decisions()

    def fail(kernel: str) -> _OutOfResources:
        raising = _OutOfResources()
        monkeypatch.setattr(nystrom_launch._kernels(route_of(torch.empty(0))), kernel, raising)
        return raising
    yield fail
    monkeypatch.undo()
    dispatch.forget_decisions()  # (the decisions kept with this test's failures recorded)


def _warnings_of(record) -> list[str]:
    from soft_mm.ops.soft.dispatch import BackendFallbackWarning
    return [str(w.message) for w in record if w.category is BackendFallbackWarning]


def test_a_forward_kernel_that_cannot_launch_falls_back_to_the_reference_math_and_says_so(launch_failures):
    from soft_mm.ops.soft.dispatch import DispatchError
    tensors, grad_out = inputs(70, 9)
    reference = outputs_and_grads(tensors, grad_out, torch.float64, soft_norm=True, backend='reference')
    raising = launch_failures('nystrom_fwd_kernel_context')
    with pytest.warns(UserWarning) as record:
        out = soft_attention(*(t.float() for t in tensors), soft_norm=True, ridge=0.01)
    assert raising.launches == 1 and relative_error(out, reference[0]) < 3e-5  # the call ran again, on the reference
    assert _warnings_of(record) == [
        "soft_attention on cpu: the 'triton' backend could not launch its forward kernels on this device at m <= 16, "
        "d <= 32 with float32 products (OutOfResources: out of resource: shared memory, Required: 200704, Hardware "
        "limit: 101376. Reducing block sizes or `num_stages` may help.); the 'reference' backend runs instead (said "
        "once per device and reason; soft_mm.ops.soft.dispatch.BackendFallbackWarning is its category)"]
    # from then on such calls (forward and training, up to 16 landmarks and 32 dims) take the reference math at once,
    # without a word; larger ones, and other products, still the kernels
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        fallback = outputs_and_grads(tensors, grad_out, torch.float32, soft_norm=True)
        soft_attention(*(t.float()[:, :, :, :20] for t in tensors), soft_norm=True)
    assert raising.launches == 1
    assert max(relative_error(a, b) for a, b in zip(fallback, reference)) < 3e-5
    with pytest.warns(UserWarning, match='at m <= 32, d <= 32 with float32 products'):
        soft_attention(*(t.float() for t in inputs(70, 20)[0]), soft_norm=True)  # m = 20 pads to 32: tried, failed
    assert raising.launches == 2
    with pytest.raises(DispatchError, match=r"backend 'triton' could not launch its forward kernels on this device "
                                            r"at m <= 16, d <= 32 with float32 products \(OutOfResources"):
        soft_attention(*(t.float() for t in tensors), backend='triton')


def test_a_backward_kernel_that_cannot_launch_gives_the_same_gradients_in_pytorch(launch_failures):
    tensors, grad_out = inputs(70, 9)
    reference = outputs_and_grads(tensors, grad_out, torch.float64, soft_norm=True, backend='reference')
    raising = launch_failures('nystrom_bwd_kernel_dq_dv_dl')
    with pytest.warns(UserWarning) as record:
        fused = outputs_and_grads(tensors, grad_out, torch.float32, soft_norm=True)
    assert raising.launches == 1
    errors = [relative_error(a, b) for a, b in zip(fused, reference)]
    assert max(errors) < 3e-5, errors  # the kernels' forward, the tiled backend's backward (float32 products)
    reason = ("could not launch its backward kernels on this device at m <= 16, d <= 32 with float32 products "
              "(OutOfResources: out of resource: shared memory")
    assert len(_warnings_of(record)) == 1 and _warnings_of(record)[0].startswith(
        f"soft_attention on cpu: the 'triton' backend {reason}") and 'this backward runs the same math in PyTorch, ' \
        'and such calls take the next backend from now on' in _warnings_of(record)[0]
    # the next training call takes the reference math, announced already (the same device and reason); inference
    # calls still take the kernels
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        again = outputs_and_grads(tensors, grad_out, torch.float32, soft_norm=True)
        with torch.no_grad():
            soft_attention(*(t.float() for t in tensors), soft_norm=True, ridge=0.01)
    assert raising.launches == 1 and max(relative_error(a, b) for a, b in zip(again, reference)) < 3e-5


@pytest.mark.parametrize('soft_norm', [False, True])
def test_the_middle_backward_in_pytorch_is_the_kernel_s(launch_failures, soft_norm):
    # the m×m part's backward kernel, and its PyTorch form where the kernel cannot launch: the same gradient
    from soft_mm.ops.soft.backends.triton.nystrom_launch import triton_nystrom_middle
    gen = torch.Generator().manual_seed(5)
    landmarks = 0.4 * torch.randn(2, 3, 9, 16, generator=gen)
    grad_middle = torch.randn(2, 3, 9, 9, generator=gen)

    def gradient():
        leaf = landmarks.clone().requires_grad_()
        return torch.autograd.grad(triton_nystrom_middle(leaf, 20, 0.01, soft_norm), leaf, grad_middle)[0]

    kernel = gradient()
    raising = launch_failures('nystrom_middle_bwd_kernel_dl')
    with pytest.warns(UserWarning, match="could not launch its backward kernels of the m×m part on this device at "
                                         r"m <= 16, d <= 16 \(OutOfResources"):
        pytorch = gradient()
    assert raising.launches == 1
    assert relative_error(pytorch, kernel.double()) < 1e-5
