"""Tests of the SOFT op's dispatch point and precision policy: which backend and dtypes a call gets, forced and
automatic choices, the errors, and every backend's low-precision error against float64 by the FlashAttention rule."""
import pytest
import torch

from soft_mm.ops import soft_attention
from soft_mm.ops.compat import CPU_FLOAT16_AUTOCAST
from soft_mm.ops.precision.error_rule import RULE_FRACTION, rule_errors, rule_inputs
from soft_mm.ops.precision.soft_policy import Precision, precision_policy
from soft_mm.ops.soft import dispatch
from soft_mm.ops.soft.backends.tiled import AUTO_TILING_MIN_TOKENS
from soft_mm.ops.soft.backends.triton.backend import triton_available
from soft_mm.ops.soft.backends.triton.targets import DeviceLimits
from soft_mm.ops.soft.dispatch import Backend, DispatchError, backends, select_backend

FP32 = Precision(torch.float32, torch.float32, torch.float32, torch.float32)
BF16_PRODUCTS = Precision(torch.bfloat16, torch.float32, torch.float32, torch.float32)
F16_PRODUCTS = Precision(torch.float16, torch.float32, torch.float32, torch.float32)


@pytest.fixture(autouse=True)
def an_h100_where_there_is_no_gpu(monkeypatch):
    """The calls on 'cuda' below ask the Triton backend's check which GPU it is: without one, an H100 (every declared
    size fits it; tests/ops/test_triton_targets.py has the other GPUs)."""
    if not torch.cuda.is_available():
        import soft_mm.ops.soft.backends.triton.backend as triton_module
        h100 = DeviceLimits('NVIDIA H100 80GB HBM3', (9, 0), 232_448)
        monkeypatch.setattr(triton_module, 'device_limits', lambda index=None: h100)


def pick(device='cpu', dtype=torch.float32, precision=FP32, tokens=100, grad=True, mode='eager', name=None):
    return select_backend(device, dtype, precision, tokens, grad, mode, name).name


def test_built_in_backends_declare_their_support():
    declared = {b.name: b for b in backends()}
    assert [b.name for b in backends()][:3] == ['triton', 'tiled', 'reference']  # priority order
    reference, tiled, triton = declared['reference'], declared['tiled'], declared['triton']
    assert triton.devices == ('cuda', 'cpu') and triton.compile and not triton.export and triton.backward
    assert torch.float64 not in triton.dtypes
    assert reference.compile and reference.export and 'cuda' in reference.devices
    assert tiled.compile and not tiled.export and tiled.devices == ('cpu',)
    assert tiled.min_tokens == AUTO_TILING_MIN_TOKENS and dict(tiled.options) == {'tile_size': 4096}
    assert 'eager, compile;' in tiled.describe() and 'eager, compile, export' in reference.describe()


def test_automatic_choice():
    assert pick(tokens=AUTO_TILING_MIN_TOKENS) == 'reference'
    assert pick(tokens=AUTO_TILING_MIN_TOKENS + 1) == 'tiled'
    assert pick(tokens=AUTO_TILING_MIN_TOKENS + 1, precision=BF16_PRODUCTS, dtype=torch.bfloat16) == 'tiled'
    assert pick(tokens=10 ** 6, mode='export') == 'reference'  # an exported graph never gets the tile loop
    assert pick(tokens=10 ** 6, mode='compile') == 'tiled'  # a compiled one runs the eager kernels (custom ops)
    with pytest.raises(ValueError, match=r"mode must be one of \('eager', 'compile', 'export'\), got 'traced'"):
        pick(mode='traced')
    # a GPU never gets the CPU tile loop: the fused Triton kernels, or without triton the reference math
    assert pick(device='cuda', tokens=10 ** 6) == ('triton' if triton_available() else 'reference')
    assert pick(device='cuda', tokens=10 ** 6, dtype=torch.float64) == 'reference'
    assert pick(tokens=10 ** 6, device='cpu') == 'tiled'  # the interpreter is never chosen automatically


def test_without_triton_cuda_gets_the_reference_math(monkeypatch):
    from soft_mm.ops import triton_route
    monkeypatch.setattr(triton_route, 'TRITON_VERSION', None)
    assert pick(device='cuda', tokens=10 ** 6) == 'reference'
    with pytest.raises(DispatchError, match=r"backend 'triton' needs triton \(pip install triton\)"):
        pick(device='cuda', name='triton')


@pytest.mark.parametrize('version', [(2, 1), (3, 0)])
def test_a_triton_older_than_the_kernels_need_is_declined_with_its_version(monkeypatch, version):
    # torch 2.1 ships triton 2.1, torch 2.4 triton 3.0: the kernels need triton_nystrom.MIN_TRITON (3.4)
    from soft_mm.ops import triton_route
    monkeypatch.setattr(triton_route, 'TRITON_VERSION', version)
    assert triton_route.MIN_TRITON == (3, 4)
    assert pick(device='cuda', tokens=10 ** 6) == 'reference'
    found = '.'.join(map(str, version))
    with pytest.raises(DispatchError, match=rf"backend 'triton' needs triton >= 3.4 \(found {found}: torch < 2.8 "):
        pick(device='cuda', name='triton')


def test_forced_backend_ignores_the_token_threshold_but_not_support(monkeypatch):
    assert pick(tokens=5, name='tiled') == 'tiled'
    with pytest.raises(DispatchError, match="backend 'tiled' runs on cpu, not cuda"):
        pick(device='cuda', name='tiled')
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    if triton_available():
        with pytest.raises(DispatchError, match="backend 'triton' runs on CPU only when forced under TRITON_INTERPRET"):
            pick(name='triton')
    with pytest.raises(ValueError, match=r"backend='fused' is not one of \['reference', 'tiled', 'triton'\]"):
        pick(name='fused')


def test_no_fitting_backend_lists_every_reason():
    with pytest.raises(DispatchError) as info:
        pick(device='hpu')
    message = str(info.value)
    assert 'no backend fits hpu' in message
    assert 'tiled runs on cpu, not hpu' in message and 'reference runs on cpu/cuda' in message


def test_every_reason_of_every_backend_is_listed():
    with pytest.raises(DispatchError) as info:
        pick(device='hpu', dtype=torch.float64, mode='export')
    message = str(info.value)
    for reason in (('triton runs on cuda/cpu, not hpu, does not take torch.float64 inputs, cannot run while a graph '
                    'is exported'),
                   'tiled runs on cpu, not hpu, cannot run while a graph is exported',
                   'is chosen automatically only above 8192 tokens (got 100)', 'reference runs on cpu/cuda/mps'):
        assert reason in message, message


def test_backends_declare_their_size_limits_and_the_dispatcher_falls_back(monkeypatch):
    sizes = dict(num_landmarks=64, head_dim=64, value_dim=64)
    expected = 'triton' if triton_available() else 'reference'
    assert select_backend('cuda', torch.float32, FP32, 10 ** 5, True, **sizes).name == expected
    # m = 65..128 (the m×m kernel), d or d_v = 128 (every backward) or m = 196 (landmark_grid=14): the kernels would
    # ask for more shared memory than an A100 has per block (test_triton_cubins.py), the reference runs
    for too_big in (dict(num_landmarks=65), dict(num_landmarks=196), dict(head_dim=65), dict(value_dim=128)):
        assert select_backend('cuda', torch.float32, FP32, 10 ** 5, True, **{**sizes, **too_big}).name == 'reference'
    triton = {b.name: b for b in backends()}['triton']
    assert (triton.max_landmarks, triton.max_head_dim) == (64, 64) and 'm <= 64; d, d_v <= 64' in triton.describe()
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    monkeypatch.setattr('soft_mm.ops.triton_route.triton_available', lambda: True)
    with pytest.raises(DispatchError) as info:
        select_backend('cpu', torch.float64, FP32, 10, True, name='triton', num_landmarks=196, head_dim=160,
                       value_dim=32)
    assert str(info.value) == (
        "soft_attention: backend 'triton' runs on CPU only when forced under TRITON_INTERPRET=1 (the interpreter, for "
        "tests) or inside soft_mm.ops.triton_route.interpreted_triton_route(), does not take torch.float64 inputs, "
        "takes at most 64 landmarks (got m = 196), takes a head dim d of at most 64 (got 160)")


def test_soft_attention_passes_its_sizes_to_the_dispatcher(monkeypatch):
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    q, v = torch.randn(1, 1, 8, 4), torch.randn(1, 1, 8, 3)
    with pytest.raises(DispatchError, match=r"takes at most 64 landmarks \(got m = 65\)"):
        soft_attention(q, torch.randn(1, 1, 65, 4), v, backend='triton')


def test_a_registered_backend_is_picked_by_priority_and_called(monkeypatch):
    calls = []

    def run(q, landmarks, v, middle, precision, scale=1.0):
        calls.append((q.shape, precision))
        return scale * v

    fake = Backend(name='fake', priority=100, run=run, devices=('cpu',), dtypes=(torch.float32,),
                   mixed_precision=False, options=(('scale', 1.0),))
    # registered into copies of the registry, which the monkeypatch puts back afterwards
    monkeypatch.setattr(dispatch, '_BACKENDS', dict(dispatch._BACKENDS))
    monkeypatch.setattr(dispatch, '_BY_PRIORITY', list(dispatch._BY_PRIORITY))
    dispatch.register_backend(fake)
    q, landmarks, v = torch.randn(1, 1, 8, 4), torch.randn(1, 1, 2, 4), torch.randn(1, 1, 8, 3)
    assert torch.equal(soft_attention(q, landmarks, v), v) and calls == [(q.shape, FP32)]
    # fp64 inputs and bfloat16 products are declared unsupported: the next backend by priority runs
    assert soft_attention(q.double(), landmarks.double(), v.double()).dtype == torch.float64
    with torch.autocast('cpu', dtype=torch.bfloat16):
        soft_attention(q, landmarks, v)
    assert len(calls) == 1
    with pytest.raises(DispatchError, match="backend 'fake' has no mixed-precision products"):
        soft_attention(q, landmarks, v, backend='fake', precision='bfloat16')


@pytest.mark.parametrize('device_dtype, autocast, precision, expected', [
    (torch.float32, None, None, FP32),
    (torch.float16, None, None, F16_PRODUCTS),
    (torch.bfloat16, None, None, BF16_PRODUCTS),
    (torch.float32, torch.bfloat16, None, BF16_PRODUCTS),
    # float16 autocast on CPU exists from torch 2.3 (compat.CPU_FLOAT16_AUTOCAST)
    *([(torch.float32, torch.float16, None, F16_PRODUCTS)] if CPU_FLOAT16_AUTOCAST else []),
    (torch.float16, torch.bfloat16, None, BF16_PRODUCTS),
    (torch.float32, None, 'float16', F16_PRODUCTS),
    (torch.float64, torch.bfloat16, None, Precision(*[torch.float64] * 4)),
    (torch.float64, None, 'bfloat16', Precision(*[torch.float64] * 4)),
    (torch.float32, torch.bfloat16, 'highest', FP32),
    (torch.bfloat16, None, 'highest', FP32),
    (torch.float32, None, 'bfloat16', BF16_PRODUCTS),
])
def test_precision_policy(device_dtype, autocast, precision, expected):
    with torch.autocast('cpu', dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        assert precision_policy('cpu', device_dtype, precision) == expected
    assert precision_policy('cpu', device_dtype, expected) == expected  # a Precision is used as given


def test_float16_products_run_where_the_sums_are_stored_in_float32_and_fall_back_to_float32_elsewhere(monkeypatch):
    preferred = precision_policy('cuda', torch.float16)
    assert preferred == F16_PRODUCTS and preferred.chain() == (F16_PRODUCTS, FP32)
    sizes = dict(num_landmarks=49, head_dim=32, value_dim=32)
    if triton_available():
        assert dispatch.select('cuda', torch.float16, preferred, 10 ** 5, True, **sizes) == (
            {b.name: b for b in backends()}['triton'], F16_PRODUCTS)
    # the reference math would round its N-token sums to float16 (a GEMM's float16 output): float32 products there
    assert dispatch.select('cuda', torch.float16, preferred, 10 ** 5, True, num_landmarks=196)[1] == FP32
    assert dispatch.select('cpu', torch.float16, preferred, 10 ** 5, True, name='tiled')[1] == FP32
    # forced by name there is no fallback
    forced = precision_policy('cpu', torch.float16, 'float16')
    with pytest.raises(DispatchError, match="backend 'reference' has no float16 products with float32 accumulation"):
        dispatch.select('cpu', torch.float16, forced, 100, True, name='reference')
    assert 'triton (priority 20): devices cuda/cpu; dtypes float16, bfloat16, float32; bfloat16/float16 products' in \
        {b.name: b for b in backends()}['triton'].describe()


def test_bad_precision_raises():
    with pytest.raises(ValueError, match=r"precision='fp8' is not None \(automatic\) or one of "
                                         r"\('highest', 'bfloat16', 'float16'\)"):
        precision_policy('cpu', torch.float32, 'fp8')
    with pytest.raises(ValueError, match='precision='):
        soft_attention(torch.randn(1, 1, 4, 2), torch.randn(1, 1, 2, 2), torch.randn(1, 1, 4, 2), precision='fp8')


def test_highest_precision_under_autocast_equals_float32():
    gen = torch.Generator().manual_seed(0)
    q, landmarks, v = torch.randn(2, 2, 40, 8, generator=gen), torch.randn(2, 2, 5, 8, generator=gen), \
        torch.randn(2, 2, 40, 8, generator=gen)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        fast = soft_attention(q, landmarks, v)
        highest = soft_attention(q, landmarks, v, precision='highest')
    assert fast.dtype == highest.dtype == torch.bfloat16  # the output follows autocast, as a matmul's
    assert torch.equal(highest, soft_attention(q, landmarks, v).bfloat16()) and not torch.equal(fast, highest)


# bfloat16 inputs, float32 inputs under bfloat16 autocast (both: bfloat16 products), float16 inputs (float32 inside)
LOW_PRECISION_CASES = [(torch.bfloat16, True, torch.bfloat16), (torch.bfloat16, False, torch.bfloat16),
                       (torch.float32, True, torch.bfloat16), (torch.float16, False, torch.float16)]


@pytest.mark.parametrize('backend', ['reference', 'tiled'])
@pytest.mark.parametrize('num_tokens, num_landmarks', [(1, 1), (63, 49), (300, 1), (300, 49)])
@pytest.mark.parametrize('input_dtype, autocast, low_dtype', LOW_PRECISION_CASES)
def test_low_precision_error_within_the_flash_attention_rule(backend, num_tokens, num_landmarks, input_dtype,
                                                             autocast, low_dtype):
    inputs, grad_out = rule_inputs(num_tokens, num_landmarks)
    inputs = [t.to(input_dtype) for t in inputs]

    def fast(*tensors):
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
            return soft_attention(*tensors, soft_norm=True, ridge=0.01, backend=backend, tile_size=37)

    errors = rule_errors(fast, inputs, low_dtype, grad_out, soft_norm=True, ridge=0.01)
    # Output, grad q, grad landmarks, grad v against float64, each at most half the error of the plain math in the
    # same low precision (observed: bfloat16 products 0.11-0.32 of it, float16 inputs 0.06-0.19)
    assert all(f <= RULE_FRACTION * p for f, p in zip(errors.fast, errors.plain)), errors
    fast_errors = errors.fast
    # and small in absolute terms: bfloat16 products <= 7.5e-3 (observed <= 7.5e-3 at one landmark, ~4e-3 at 49)
    assert max(fast_errors) < (1e-2 if low_dtype == torch.bfloat16 else 1e-3)
