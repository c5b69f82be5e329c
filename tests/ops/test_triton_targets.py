"""The Triton backend on every GPU a detection user trains on: a fake device of each kind (capability, opt-in shared
memory per block) and the dispatcher's decision and reason for it, at the published sizes and at the largest declared
corner, in each dtype, with and without a backward; from the table of :mod:`~soft_mm.ops.soft.backends.triton.
shared_memory` (which tests/ops/test_triton_cubins.py holds against the compiled kernels)."""
import pytest
import torch
from helpers.op_checks import triton_kernels

import soft_mm.ops.soft.backends.triton.backend as triton_backend
from soft_mm.ops.precision.soft_policy import precision_policy
from soft_mm.ops.soft.backends.triton.config import (
    KERNELS,
    MAX_HEAD_DIM,
    MAX_LANDMARKS,
    SHARED_MEMORY_PER_BLOCK,
    TARGETS,
    kernel_block,
)
from soft_mm.ops.soft.backends.triton.shared_memory import SHARED_MEMORY
from soft_mm.ops.soft.backends.triton.targets import (
    DeviceLimits,
    device_limits,
    launch_reasons,
    launched_kernels,
    shared_memory_needed,
)
from soft_mm.ops.soft.dispatch import DispatchError, select

pytestmark = triton_kernels  # (the dispatcher takes the backend only with a triton the kernels can use)

T4 = DeviceLimits('Tesla T4', (7, 5), 65_536)
RTX_3090 = DeviceLimits('NVIDIA GeForce RTX 3090', (8, 6), 101_376)
RTX_4090 = DeviceLimits('NVIDIA GeForce RTX 4090', (8, 9), 101_376)
A100 = DeviceLimits('NVIDIA A100-SXM4-80GB', (8, 0), 166_912)
H100 = DeviceLimits('NVIDIA H100 80GB HBM3', (9, 0), 232_448)
B200 = DeviceLimits('NVIDIA B200', (10, 0), 232_448)
RTX_5090 = DeviceLimits('NVIDIA GeForce RTX 5090', (12, 0), 101_376)
V100 = DeviceLimits('Tesla V100-SXM2-32GB', (7, 0), 98_304)
PUBLISHED = dict(num_landmarks=49, head_dim=32, value_dim=32)
CORNER = dict(num_landmarks=MAX_LANDMARKS, head_dim=MAX_HEAD_DIM, value_dim=MAX_HEAD_DIM)


@pytest.fixture
def on_device(monkeypatch):
    """Make the dispatcher see a fake GPU: ``on_device(limits)``."""
    def install(limits: DeviceLimits) -> None:
        monkeypatch.setattr(triton_backend, 'device_limits', lambda index=None: limits)
    return install


def choose(dtype=torch.float32, autocast=None, grad=True, sizes=PUBLISHED, name=None):
    """The backend and the products dtype that a CUDA call gets (``autocast``: the autocast dtype, as a policy)."""
    policy = precision_policy('cpu', autocast or dtype)  # the policy of those dtypes (the device type only names it)
    backend, chosen = select('cuda', dtype, policy, 10 ** 5, grad, 'eager', name, **sizes)
    return backend.name, str(chosen.products).replace('torch.', '')


def test_the_table_covers_every_target_and_declared_corner():
    assert {target for target, _, _ in SHARED_MEMORY} == set(TARGETS)
    assert {(m, d) for _, m, d in SHARED_MEMORY} == {(m, d) for m in (16, 64) for d in (16, 32, 64)}
    for entry in SHARED_MEMORY.values():
        assert set(entry) == set(launched_kernels(needs_grad=True))
        for kernel in KERNELS:  # the token kernels by products dtype, the m×m ones one figure each
            assert set(entry[kernel]) == {'float32', 'bfloat16', 'float16'}


@pytest.mark.parametrize('limits, published, corner_training, corner_inference', [
    (T4, 'triton', 'triton', 'triton'),
    (RTX_3090, 'triton', 'reference', 'triton'),
    (RTX_4090, 'triton', 'reference', 'triton'),
    (A100, 'triton', 'triton', 'triton'),
    (H100, 'triton', 'triton', 'triton'),
])
def test_each_target_takes_what_fits_its_shared_memory(on_device, limits, published, corner_training,
                                                       corner_inference):
    on_device(limits)
    assert choose(torch.float32, sizes=PUBLISHED)[0] == published
    assert choose(torch.float16, sizes=PUBLISHED) == (published, 'float16')
    assert choose(torch.float32, sizes=CORNER, grad=True)[0] == corner_training
    assert choose(torch.float32, sizes=CORNER, grad=False)[0] == corner_inference


def test_the_reason_names_the_bytes_the_kernel_and_the_device(on_device):
    on_device(RTX_4090)
    need, kernel = shared_memory_needed(89, 64, 64, 'float32', needs_grad=True)
    assert kernel == 'nystrom_bwd_kernel_dq_dv_dl' and need > RTX_4090.shared_memory_per_block
    with pytest.raises(DispatchError) as err:
        choose(torch.float32, sizes=CORNER, name='triton')
    assert str(err.value) == (
        f"soft_attention: backend 'triton' needs {need:,} B of shared memory per block at m = 64, d = 64 "
        "(nystrom_bwd_kernel_dq_dv_dl, float32 products); this NVIDIA GeForce RTX 4090 (sm_89) allows 101,376")
    # the automatic choice falls back to the reference math, which runs anywhere
    assert choose(torch.float32, sizes=CORNER) == ('reference', 'float32')


def test_no_bfloat16_kernels_on_turing(on_device):
    on_device(T4)
    # bfloat16 inputs, or bfloat16 autocast over float32 ones: the reference math (in bfloat16 products)
    assert choose(torch.bfloat16) == ('reference', 'bfloat16')
    assert choose(torch.float32, autocast=torch.bfloat16) == ('reference', 'bfloat16')
    with pytest.raises(DispatchError, match=r"backend 'triton' has no bfloat16 kernels below sm_80 \(this Tesla T4 "
                                            r"\(sm_75\)\)"):
        choose(torch.bfloat16, name='triton')
    # float16 (mmdet's --amp on a T4) and float32 get the kernels
    assert choose(torch.float32, autocast=torch.float16) == ('triton', 'float16')
    assert choose(torch.float32) == ('triton', 'float32')


@pytest.mark.parametrize('limits', [B200, RTX_5090, V100])
def test_a_capability_the_kernels_are_not_built_for_gets_the_reference_math(on_device, limits):
    on_device(limits)
    assert choose(torch.float32) == ('reference', 'float32')
    with pytest.raises(DispatchError) as err:
        choose(torch.float32, name='triton')
    assert str(err.value) == (f"soft_attention: backend 'triton' is built and checked for sm_75, sm_80, sm_86, sm_89, "
                              f"sm_90, not this {limits.name} (sm_{limits.target})")


def test_each_decision_is_the_table_against_the_limit():
    """Every target, corner, products dtype and direction: accepted exactly where the largest launch fits."""
    for target in TARGETS:
        limits = DeviceLimits(f'sm_{target}', divmod(target, 10), SHARED_MEMORY_PER_BLOCK[target])
        for m in (1, 20, 49, 64):
            for d in (8, 16, 32, 64):
                for products in (torch.float32, torch.bfloat16, torch.float16):
                    for grad in (False, True):
                        reasons = launch_reasons(limits, products, products, m, d, d, grad)
                        name = str(products).replace('torch.', '')
                        need, _ = shared_memory_needed(target, m, d, name, grad)
                        bfloat16_refused = products == torch.bfloat16 and target < 80
                        assert bool(reasons) == (need > limits.shared_memory_per_block or bfloat16_refused), \
                            (target, m, d, products, grad, reasons)


def test_sizes_between_the_table_rows_take_the_next_larger_row():
    # m = 20 pads to 32, which the table does not hold: the m = 64 row (an upper bound) decides
    assert shared_memory_needed(86, 20, 32, 'float32', True) == shared_memory_needed(86, 64, 32, 'float32', True)
    assert shared_memory_needed(86, 1, 8, 'float32', True) == shared_memory_needed(86, 16, 16, 'float32', True)
    with pytest.raises(KeyError):
        shared_memory_needed(100, 49, 32, 'float32', True)


def test_the_blocks_of_each_target():
    assert [kernel_block('nystrom_fwd_kernel_context', t) for t in (None, 75, 80, 86, 89, 90)] == [64, 32, 64, 32, 32,
                                                                                                 64]
    assert [kernel_block('nystrom_fwd_kernel_o', t) for t in (None, 75, 80, 86, 89, 90)] == [64, 32, 64, 64, 64, 64]
    assert {kernel_block('nystrom_bwd_kernel_dq_dv_dl', t) for t in (None, *TARGETS)} == {16}


def test_the_device_is_read_once_for_every_kernel(monkeypatch):
    from soft_mm.ops import triton_route
    reads = []

    def read(index):
        reads.append(index)
        return RTX_3090
    monkeypatch.setattr(triton_route, '_DEVICES', {})
    monkeypatch.setattr(triton_route, '_read_limits', read)
    assert device_limits(1) is RTX_3090 and device_limits(1) is RTX_3090 and str(device_limits(1)) == \
        'NVIDIA GeForce RTX 3090 (sm_86)'
    # the layers' kernels read the same record: one reader of a device for the package
    assert triton_route.cuda_target(torch.device('cuda', 1)) == 86
    assert reads == [1]


@pytest.mark.parametrize('capability, takes_float32, takes_bfloat16', [
    ((7, 5), True, False), ((8, 0), True, True), ((8, 6), True, True), ((8, 9), True, True), ((9, 0), True, True),
    ((7, 0), False, False), ((10, 0), False, False), ((12, 0), False, False)])
def test_the_layers_fused_kernels_run_on_the_same_targets(monkeypatch, capability, takes_float32, takes_bfloat16):
    # the blocks' fused kernels (add + LayerNorm) check the device as the SOFT op's backend does: its targets, no
    # bfloat16 below sm_80 (tests/ops/test_triton_cubins.py compiles them for every target without spills)
    from types import SimpleNamespace

    from soft_mm.ops import triton_route

    assert triton_route.TARGETS == TARGETS  # (config.py repeats them: plain Python, read by the cubin tool)
    monkeypatch.setattr(triton_route, '_DEVICES', {})
    monkeypatch.setattr(triton_route, '_read_limits',
                        lambda index: triton_route.DeviceLimits('a GPU', capability, 101_376))
    cuda = torch.device('cuda', 0)
    float32, bfloat16 = (SimpleNamespace(device=cuda, dtype=dtype) for dtype in (torch.float32, torch.bfloat16))
    assert triton_route.takes_triton(float32) is takes_float32
    assert triton_route.takes_triton(bfloat16, float32) is takes_bfloat16
    assert triton_route.takes_triton(float32, float32) is takes_float32
