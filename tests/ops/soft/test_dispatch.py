"""Tests of the SOFT op's dispatch point and precision policy: which backend and dtypes a call gets, forced and
automatic choices, the errors, the decisions kept per call signature and their announcements, and every backend's
low-precision error against float64 by the FlashAttention rule."""
import itertools
import random
import warnings

import pytest
import torch
from helpers.op_checks import see_the_installed_triton

from soft_mm.ops import soft_attention
from soft_mm.ops.compat import CPU_FLOAT16_AUTOCAST
from soft_mm.ops.precision.soft_policy import Precision, precision_policy
from soft_mm.ops.soft import dispatch
from soft_mm.ops.soft.backends.tiled import AUTO_TILING_MIN_TOKENS
from soft_mm.ops.soft.dispatch import Backend, BackendFallbackWarning, DispatchError, backends, decide, select
from soft_mm.ops.triton_route import DeviceLimits, triton_available
from soft_mm.testing import RULE_FRACTION, rule_errors, rule_inputs

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
    return select(device, dtype, precision, tokens, grad, mode, name)[0].name


def test_built_in_backends_declare_their_support():
    declared = {b.name: b for b in backends()}
    assert [b.name for b in backends()][:3] == ['triton', 'tiled', 'reference']  # priority order
    reference, tiled, triton = declared['reference'], declared['tiled'], declared['triton']
    assert triton.devices == ('cuda', 'cpu') and triton.compile and not triton.export and triton.backward
    assert torch.float64 not in triton.dtypes
    assert reference.compile and reference.export and 'cuda' in reference.devices
    assert tiled.compile and not tiled.export and tiled.devices == ('cpu',)
    assert tiled.min_tokens == AUTO_TILING_MIN_TOKENS and dict(tiled.options) == {'tile_size': 4096}


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
                   'is chosen automatically only above 8192 tokens', 'reference runs on cpu/cuda/mps'):
        assert reason in message, message


def test_backends_declare_their_size_limits_and_the_dispatcher_falls_back(monkeypatch):
    sizes = dict(num_landmarks=64, head_dim=64, value_dim=64)
    expected = 'triton' if triton_available() else 'reference'
    assert select('cuda', torch.float32, FP32, 10 ** 5, True, **sizes)[0].name == expected
    # m = 65..128 (the m×m kernel), d or d_v = 128 (every backward) or m = 196 (landmark_grid=14): the kernels would
    # ask for more shared memory than an A100 has per block (test_triton_cubins.py), the reference runs
    for too_big in (dict(num_landmarks=65), dict(num_landmarks=196), dict(head_dim=65), dict(value_dim=128)):
        assert select('cuda', torch.float32, FP32, 10 ** 5, True, **{**sizes, **too_big})[0].name == 'reference'
    triton = {b.name: b for b in backends()}['triton']
    assert (triton.max_landmarks, triton.max_head_dim) == (64, 64)
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    monkeypatch.setattr('soft_mm.ops.triton_route.triton_available', lambda: True)
    with pytest.raises(DispatchError) as info:
        select('cpu', torch.float64, FP32, 10, True, name='triton', num_landmarks=196, head_dim=160, value_dim=32)
    assert str(info.value) == (
        "soft_attention: backend 'triton' runs on CPU only when forced under TRITON_INTERPRET=1 (the interpreter, for "
        "tests) or inside soft_mm.ops.triton_route.interpreted_triton_route() or stubbed_triton_route(), does not take "
        "torch.float64 inputs, takes at most 64 landmarks (got m = 196), takes a head dim d of at most 64 (got 160)")


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
    # registered into copies of the registry (and of the decisions kept from it), which the monkeypatch puts back
    for name in ('_BACKENDS', '_BY_PRIORITY', '_TOKEN_THRESHOLDS', '_DECISIONS'):
        monkeypatch.setattr(dispatch, name, type(getattr(dispatch, name))(getattr(dispatch, name)))
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


@pytest.fixture
def fresh_decisions(monkeypatch):
    """No decision kept and nothing announced before the test; those of the test dropped after it."""
    monkeypatch.setattr(dispatch, '_DECISIONS', {})
    monkeypatch.setattr(dispatch, '_ANNOUNCED', set())


@pytest.fixture
def a_triton_the_kernels_take(monkeypatch):
    see_the_installed_triton(monkeypatch)


def outcome(choose, *args, **kwargs):
    """``(backend name, policy)`` of a choice, or the error it raises as ``(type, message)``."""
    try:
        backend, policy = choose(*args, **kwargs)
    except (DispatchError, ValueError) as err:
        return type(err), str(err)
    return backend.name, policy


def test_decide_keeps_exactly_the_decision_select_makes_for_every_signature(fresh_decisions, a_triton_the_kernels_take,
                                                                           monkeypatch):
    # every fact a decision depends on, in a shuffled order twice over (the second pass answered from the kept
    # decisions), on CPU and on GPUs of several kinds, forced and automatic, with the policies' fallbacks: decide's
    # answer, or error, is select's each time
    from soft_mm.ops.soft.backends.triton import backend as triton_module
    gpus = {0: DeviceLimits('NVIDIA H100 80GB HBM3', (9, 0), 232_448), 1: DeviceLimits('Tesla T4', (7, 5), 65_536),
            2: DeviceLimits('NVIDIA GeForce RTX 5090', (12, 0), 101_376),
            3: DeviceLimits('AMD Instinct MI250X', (9, 0), 65_536, 'rocm', 'gfx90a'),
            4: DeviceLimits('NVIDIA GeForce RTX 4090', (8, 9), 101_376)}  # (m = d = 64: inference only)
    monkeypatch.setattr(triton_module, 'device_limits', lambda index=None: gpus[index or 0])
    f16_automatic = precision_policy('cpu', torch.float16)  # float16 products, else float32
    f16_forced = precision_policy('cpu', torch.float16, 'float16')  # equal to it, without the fallback
    assert f16_automatic == f16_forced and f16_automatic.chain() != f16_forced.chain()
    grid = list(itertools.product(
        [('cpu', None), ('cuda', 0), ('cuda', 1), ('cuda', 2), ('cuda', 3), ('cuda', 4)],
        [torch.float32, torch.bfloat16, torch.float64],
        [FP32, BF16_PRODUCTS, f16_automatic, f16_forced],
        [False, True], ['eager', 'compile', 'export'], [None, 'triton', 'reference'],
        [(49, 32, 32), (64, 64, 64), (65, 32, 32), (49, 32, 128), (49, 128, 32)],
        [1, AUTO_TILING_MIN_TOKENS, AUTO_TILING_MIN_TOKENS + 1]))
    rng = random.Random(0)
    decisions = set()
    for _ in range(2):
        rng.shuffle(grid)
        for (device, index), dtype, policy, grad, mode, name, (m, d, dv), tokens in grid:
            args = (device, dtype, policy, tokens, grad, mode, name)
            sizes = dict(num_landmarks=m, head_dim=d, value_dim=dv, device_index=index)
            with warnings.catch_warnings():
                warnings.simplefilter('ignore', BackendFallbackWarning)
                kept = outcome(decide, *args, **sizes)
            assert kept == outcome(dispatch.select, *args, **sizes), (args, sizes)
            if kept[0] not in (DispatchError, ValueError):
                decisions.add(kept)
    # the grid reaches every backend and every policy of a chain
    assert {name for name, _ in decisions} == {'triton', 'tiled', 'reference'}
    assert {policy for _, policy in decisions} >= {FP32, BF16_PRODUCTS, F16_PRODUCTS}
    assert 0 < len(dispatch._DECISIONS) <= dispatch.MAX_DECISIONS


def test_the_kept_decisions_are_bounded_and_follow_what_the_checks_read(fresh_decisions, monkeypatch):
    from soft_mm.ops import triton_route
    monkeypatch.setattr(dispatch, 'MAX_DECISIONS', 8)
    for m in range(1, 30):
        decide('cpu', torch.float32, FP32, 100, False, num_landmarks=m)
        assert len(dispatch._DECISIONS) <= 8
    # the token count matters only through the backends' thresholds: one decision for every count on one side
    dispatch._DECISIONS.clear()
    for tokens in (1, 100, AUTO_TILING_MIN_TOKENS):
        assert decide('cpu', torch.float32, FP32, tokens, False)[0].name == 'reference'
    assert len(dispatch._DECISIONS) == 1
    assert decide('cpu', torch.float32, FP32, AUTO_TILING_MIN_TOKENS + 1, False)[0].name == 'tiled'
    # a fact a backend's check reads (here: triton, gone) is part of the key: a new decision, not the kept one
    if triton_available():
        assert decide('cuda', torch.float32, FP32, 100, False, device_index=0)[0].name == 'triton'
    monkeypatch.setattr(triton_route, 'TRITON_VERSION', None)
    with pytest.warns(BackendFallbackWarning, match=r"the 'triton' backend needs triton \(pip install triton\); "
                                                    r"the 'reference' backend runs instead"):
        assert decide('cuda', torch.float32, FP32, 100, False, device_index=0)[0].name == 'reference'


def test_soft_attention_decides_through_the_kept_decisions_only_when_eager(fresh_decisions, monkeypatch):
    # dynamo traces the dispatcher's every step (select); the kept decisions are an eager call's alone. Before torch
    # 2.4 (no torch.library.custom_op) dynamo runs the op eagerly at a graph break: an eager call, through them
    from soft_mm.ops.compat import HAS_CUSTOM_OP
    from soft_mm.ops.soft import attention
    decided = []
    monkeypatch.setattr(attention, 'decide', lambda *a, **k: decided.append(a) or dispatch.decide(*a, **k))
    q, landmarks, v = torch.randn(1, 2, 24, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 24, 8)
    eager = soft_attention(q, landmarks, v)
    assert [a[:2] for a in decided] == [('cpu', torch.float32)]
    torch._dynamo.reset()
    compiled = torch.compile(lambda *t: soft_attention(*t), backend='eager', fullgraph=HAS_CUSTOM_OP)
    torch.testing.assert_close(compiled(q, landmarks, v), eager, rtol=1e-6, atol=1e-6)
    # the compiled call chose through select, not through the kept decisions (on old torch the eager fallback's call
    # has the first call's signature: it takes that call's kept decision, without asking again)
    assert len(decided) == 1
    torch._dynamo.reset()


def test_passing_over_a_backend_on_a_gpu_is_announced_once_per_device_and_reason(
        fresh_decisions, a_triton_the_kernels_take, monkeypatch):
    from soft_mm.ops.soft.backends.triton import backend as triton_module
    v100 = DeviceLimits('Tesla V100-SXM2-32GB', (7, 0), 98_304)
    monkeypatch.setattr(triton_module, 'device_limits', lambda index=None: v100)
    sizes = dict(num_landmarks=49, head_dim=32, value_dim=32)
    with pytest.warns(BackendFallbackWarning) as record:
        assert decide('cuda', torch.float32, FP32, 10 ** 5, True, device_index=0, **sizes)[0].name == 'reference'
    assert [str(w.message) for w in record] == [
        "soft_attention on cuda:0: the 'triton' backend is built and checked for sm_75, sm_80, sm_86, sm_89, sm_90, "
        "sm_100, sm_103, sm_120, sm_121, not this Tesla V100-SXM2-32GB (sm_70); the 'reference' backend runs instead "
        "(said once per device and reason; soft_mm.ops.soft.dispatch.BackendFallbackWarning is its category)"]
    with warnings.catch_warnings():
        warnings.simplefilter('error', BackendFallbackWarning)
        # the same reason again (the same signature, inference, another dtype, another m): said already
        decide('cuda', torch.float32, FP32, 10 ** 5, True, device_index=0, **sizes)
        decide('cuda', torch.float32, FP32, 10 ** 5, False, device_index=0, **sizes)
        decide('cuda', torch.bfloat16, BF16_PRODUCTS, 10 ** 5, True, device_index=0, **{**sizes, 'num_landmarks': 9})
        # not announced: forced names (the error says it), CPU (the Triton kernels are no CPU path), traced calls
        with pytest.raises(DispatchError):
            decide('cuda', torch.float32, FP32, 10 ** 5, True, name='triton', device_index=0, **sizes)
        decide('cpu', torch.float64, FP32, 10 ** 5, True, **sizes)
    # another GPU is told afresh; so is another reason on this one (a float64 call: "does not take" added)
    with pytest.warns(BackendFallbackWarning, match='on cuda:1: '):
        decide('cuda', torch.float32, FP32, 10 ** 5, True, device_index=1, **sizes)
    with pytest.warns(BackendFallbackWarning, match='does not take torch.float64 inputs'):
        decide('cuda', torch.float64, Precision(*[torch.float64] * 4), 10 ** 5, True, device_index=0, **sizes)
    # a user silences it by its category (the decisions and announcements forgotten: all is new again)
    monkeypatch.setattr(dispatch, '_DECISIONS', {})
    monkeypatch.setattr(dispatch, '_ANNOUNCED', set())
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        warnings.filterwarnings('ignore', category=BackendFallbackWarning)
        decide('cuda', torch.float32, FP32, 10 ** 5, True, device_index=0, **sizes)


def test_a_backend_passed_over_for_its_token_threshold_only_is_not_announced(fresh_decisions, a_triton_the_kernels_take,
                                                                             monkeypatch):
    # on the interpreted GPU route (CPU tensors taking a GPU's route, where CPU calls are announced) the tiled backend
    # (CPU, automatic above 8192 tokens) passed over for fewer tokens is no fallback; the Triton kernels passed over
    # for m = 65 are, and only they are named
    from soft_mm.ops import triton_route
    monkeypatch.setitem(triton_route._ROUTE, 'cpu', triton_route.CpuRoute())
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    with warnings.catch_warnings():
        warnings.simplefilter('error', BackendFallbackWarning)
        assert decide('cpu', torch.float32, FP32, 100, True, num_landmarks=49)[0].name == 'triton'
    with pytest.warns(BackendFallbackWarning) as record:
        assert decide('cpu', torch.float32, FP32, 100, True, num_landmarks=65)[0].name == 'reference'
    assert [str(w.message).split(';')[0] for w in record] == [
        "soft_attention on cpu: the 'triton' backend takes at most 64 landmarks (got m = 65)"]


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
    triton = {b.name: b for b in backends()}['triton']
    assert (triton.priority, triton.devices, triton.dtypes, triton.product_dtypes) == (
        20, ('cuda', 'cpu'), (torch.float16, torch.bfloat16, torch.float32), (torch.bfloat16, torch.float16))


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
