"""The Triton backend on every GPU a detection user trains on: a fake device of each kind (capability, opt-in shared
memory per block, NVIDIA or AMD) and the dispatcher's decision and reason for it, at the published sizes and at the
largest declared corner, in each dtype, with and without a backward; from the table of :mod:`~soft_mm.ops.soft.backends.
triton.shared_memory` (which tests/ops/test_triton_cubins.py holds against the compiled kernels). The decisions table
of docs/advanced/precision_and_backends.md is held here, row by row."""
import re
from types import SimpleNamespace

import pytest
import torch
from helpers.op_checks import see_the_installed_triton, triton_kernels
from helpers.repo import ROOT

import soft_mm.ops.soft.backends.triton.backend as triton_backend
from soft_mm.ops import triton_route
from soft_mm.ops.precision.soft_policy import precision_policy
from soft_mm.ops.soft.backends.triton.nystrom_config import (
    MAX_HEAD_DIM,
    MAX_LANDMARKS,
    TOKEN_KERNELS,
    kernel_block,
    kernel_stages,
)
from soft_mm.ops.soft.backends.triton.nystrom_limits import launch_reasons, launched_kernels, shared_memory_needed
from soft_mm.ops.soft.backends.triton.nystrom_shared_memory import SHARED_MEMORY
from soft_mm.ops.soft.dispatch import DispatchError, select
from soft_mm.ops.triton_route import DeviceLimits, device_limits
from soft_mm.ops.triton_targets import BFLOAT16_MIN_TARGET, SHARED_MEMORY_PER_BLOCK, TARGETS

pytestmark = triton_kernels  # (the dispatcher takes the backend only with a triton the kernels can use)

T4 = DeviceLimits('Tesla T4', (7, 5), 65_536)
RTX_3090 = DeviceLimits('NVIDIA GeForce RTX 3090', (8, 6), 101_376)
RTX_4090 = DeviceLimits('NVIDIA GeForce RTX 4090', (8, 9), 101_376)
A100 = DeviceLimits('NVIDIA A100-SXM4-80GB', (8, 0), 166_912)
H100 = DeviceLimits('NVIDIA H100 80GB HBM3', (9, 0), 232_448)
B200 = DeviceLimits('NVIDIA B200', (10, 0), 232_448)
B300 = DeviceLimits('NVIDIA B300 SXM6 AC', (10, 3), 232_448)
RTX_5090 = DeviceLimits('NVIDIA GeForce RTX 5090', (12, 0), 101_376)
DGX_SPARK = DeviceLimits('NVIDIA GB10', (12, 1), 101_376)
V100 = DeviceLimits('Tesla V100-SXM2-32GB', (7, 0), 98_304)
ORIN = DeviceLimits('Orin', (8, 7), 166_912)  # Jetson AGX Orin: sm_87, not a target
# AMD GPUs under torch's ROCm build: torch.cuda reports a capability that looks like an NVIDIA one
MI250X = DeviceLimits('AMD Instinct MI250X', (9, 0), 65_536, 'rocm', 'gfx90a')
MI300X = DeviceLimits('AMD Instinct MI300X', (9, 4), 65_536, 'rocm', 'gfx942')
PUBLISHED = dict(num_landmarks=49, head_dim=32, value_dim=32)
CORNER = dict(num_landmarks=MAX_LANDMARKS, head_dim=MAX_HEAD_DIM, value_dim=MAX_HEAD_DIM)
BUILT = 'sm_75, sm_80, sm_86, sm_89, sm_90, sm_100, sm_103, sm_120, sm_121'


@pytest.fixture(autouse=True)
def installed_triton(monkeypatch):
    see_the_installed_triton(monkeypatch)


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
        for kernel in TOKEN_KERNELS:  # the token kernels by products dtype, the m×m ones one figure each
            assert set(entry[kernel]) == {'float32', 'bfloat16', 'float16'}


@pytest.mark.parametrize('limits, published, corner_training, corner_inference', [
    (T4, 'triton', 'triton', 'triton'),
    (RTX_3090, 'triton', 'reference', 'triton'),
    (RTX_4090, 'triton', 'reference', 'triton'),
    (A100, 'triton', 'triton', 'triton'),
    (H100, 'triton', 'triton', 'triton'),
    (B200, 'triton', 'triton', 'triton'),
    (B300, 'triton', 'triton', 'triton'),
    # Blackwell's unpipelined backward asks for far less (the m×m backward's 81,920 B is the most at m = d = 64), so
    # the GeForce parts train at the corner where Ampere's and Ada's (101,376 B too) do not
    (RTX_5090, 'triton', 'triton', 'triton'),
    (DGX_SPARK, 'triton', 'triton', 'triton'),
])
def test_each_target_takes_what_fits_its_shared_memory(on_device, limits, published, corner_training,
                                                       corner_inference):
    on_device(limits)
    assert choose(torch.float32, sizes=PUBLISHED)[0] == published
    assert choose(torch.float16, sizes=PUBLISHED) == (published, 'float16')
    assert choose(torch.float32, sizes=CORNER, grad=True)[0] == corner_training
    assert choose(torch.float32, sizes=CORNER, grad=False)[0] == corner_inference


def test_the_rtx_5090_declines_a_call_whose_kernel_needs_more_than_its_shared_memory(on_device, monkeypatch):
    # at the declared sizes every sm_120 kernel fits 101,376 B (the most: 81,920); a table that says a kernel needs
    # more (another triton's code, a larger tile) turns the call away, on sm_120 as on every target
    from soft_mm.ops.soft.backends.triton import nystrom_limits
    assert max(shared_memory_needed(120, m, d, products, True)[0] for m in (1, 49, 64) for d in (16, 32, 64)
               for products in ('float32', 'bfloat16', 'float16')) == 81_920
    on_device(RTX_5090)
    entry = dict(SHARED_MEMORY[(120, 64, 32)], nystrom_middle_bwd_kernel_dl=101_377)
    monkeypatch.setitem(nystrom_limits.SHARED_MEMORY, (120, 64, 32), entry)
    assert choose(torch.bfloat16, grad=True) == ('reference', 'bfloat16')
    assert choose(torch.bfloat16, grad=False) == ('triton', 'bfloat16')  # (the forward's kernels fit)
    with pytest.raises(DispatchError, match=r"needs 101,377 B of shared memory per block at m = 49, d = 32 "
                                            r"\(nystrom_middle_bwd_kernel_dl, bfloat16 products\); this NVIDIA GeForce "
                                            r"RTX 5090 \(sm_120\) allows 101,376"):
        choose(torch.bfloat16, name='triton')


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


@pytest.mark.parametrize('limits', [V100, ORIN, DeviceLimits('NVIDIA future GPU', (13, 0), 232_448)])
def test_a_capability_the_kernels_are_not_built_for_gets_the_reference_math(on_device, limits):
    on_device(limits)
    assert choose(torch.float32) == ('reference', 'float32')
    with pytest.raises(DispatchError) as err:
        choose(torch.float32, name='triton')
    assert str(err.value) == (f"soft_attention: backend 'triton' is built and checked for {BUILT}, not this "
                              f"{limits.name} (sm_{limits.target})")


@pytest.mark.parametrize('limits', [MI250X, MI300X])
def test_an_amd_gpu_is_never_taken_for_the_nvidia_gpu_of_its_capability(on_device, limits):
    # an MI250X under ROCm reports capability 9.0 (an H100's) and 65,536 B: declined as what it is, for every call
    on_device(limits)
    for grad in (False, True):
        for sizes in (PUBLISHED, CORNER):
            assert choose(torch.float32, grad=grad, sizes=sizes) == ('reference', 'float32')
            assert choose(torch.float32, autocast=torch.bfloat16, grad=grad, sizes=sizes) == ('reference', 'bfloat16')
    with pytest.raises(DispatchError) as err:
        choose(torch.float32, name='triton', grad=False)
    assert str(err.value) == (
        f"soft_attention: backend 'triton' is built and checked for NVIDIA GPUs ({BUILT}), not this {limits.name} "
        f"({limits.arch}, ROCm): an AMD GPU, whatever capability torch reports for it "
        f"({limits.capability[0]}.{limits.capability[1]})")


def test_a_rocm_device_is_read_as_one(monkeypatch):
    # torch's ROCm build: torch.version.hip is a string and torch.cuda the HIP device API, its properties an AMD GPU's
    props = SimpleNamespace(name='AMD Instinct MI250X', major=9, minor=0, shared_memory_per_block_optin=65_536,
                            gcnArchName='gfx90a:sramecc+:xnack-')
    monkeypatch.setattr(torch.cuda, 'get_device_properties', lambda index: props)
    monkeypatch.setattr(torch.version, 'hip', '6.4.43482', raising=False)
    assert triton_route._read_limits(0) == MI250X and str(MI250X) == 'AMD Instinct MI250X (gfx90a, ROCm)'
    monkeypatch.setattr(torch.version, 'hip', None)
    assert triton_route._read_limits(0) == DeviceLimits('AMD Instinct MI250X', (9, 0), 65_536)  # (as if NVIDIA's)
    with pytest.raises(ValueError, match=r"platform must be one of \('cuda', 'rocm'\), got 'hip'"):
        DeviceLimits('a GPU', (9, 0), 65_536, 'hip')


@pytest.mark.parametrize('limits', [B200, B300, RTX_5090, DGX_SPARK])
def test_blackwell_is_declined_under_a_triton_it_is_not_checked_with(on_device, monkeypatch, limits):
    # the Blackwell targets were compiled and checked with triton 3.8 (ptxas 12.9: the first that knows sm_103 and
    # sm_121); under an older one (the GPU image's 3.6) such a GPU runs the reference math
    on_device(limits)
    monkeypatch.setattr(triton_route, 'TRITON_VERSION', (3, 6))
    assert choose(torch.float32) == ('reference', 'float32')
    with pytest.raises(DispatchError) as err:
        choose(torch.float32, name='triton')
    assert str(err.value) == (f"soft_attention: backend 'triton' is checked on sm_{limits.target} with triton >= 3.8 "
                              f"(found 3.6), not on this {limits}")
    monkeypatch.setattr(triton_route, 'TRITON_VERSION', (3, 8))
    assert choose(torch.float32) == ('triton', 'float32')


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
        shared_memory_needed(87, 49, 32, 'float32', True)


def test_the_blocks_and_stages_of_each_target():
    targets = (None, 75, 80, 86, 89, 90, 100, 103, 120, 121)
    assert [kernel_block('nystrom_fwd_kernel_context', t) for t in targets] == [64, 32, 64, 32, 32, 64, 16, 16, 32, 32]
    assert [kernel_block('nystrom_fwd_kernel_o', t) for t in targets] == [64, 32, 64, 64, 64, 64, 64, 64, 64, 64]
    assert {kernel_block('nystrom_bwd_kernel_dq_dv_dl', t) for t in targets} == {16}
    # Blackwell runs the backward's loop unpipelined (its loads in flight spilled), every other kernel triton's 3 stages
    assert [kernel_stages('nystrom_bwd_kernel_dq_dv_dl', t) for t in targets] == [3, 3, 3, 3, 3, 3, 1, 1, 1, 1]
    assert {kernel_stages(k, t) for k in ('nystrom_fwd_kernel_context', 'nystrom_fwd_kernel_o') for t in targets} == {3}


def test_the_device_is_read_once_for_every_kernel(monkeypatch):
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
    ((10, 0), True, True), ((10, 3), True, True), ((12, 0), True, True), ((12, 1), True, True),
    ((7, 0), False, False), ((8, 7), False, False), ((11, 0), False, False)])
def test_the_layers_fused_kernels_run_on_the_same_targets(monkeypatch, capability, takes_float32, takes_bfloat16):
    # the blocks' fused kernels (add + LayerNorm) check the device as the SOFT op's backend does: its targets, no
    # bfloat16 below sm_80 (tests/ops/test_triton_cubins.py compiles them for every target without spills)

    monkeypatch.setattr(triton_route, '_DEVICES', {})
    monkeypatch.setattr(triton_route, '_read_limits',
                        lambda index: triton_route.DeviceLimits('a GPU', capability, 101_376))
    cuda = torch.device('cuda', 0)
    taken = triton_route.triton_dtypes(cuda)
    assert (torch.float32 in taken, torch.float16 in taken, torch.bfloat16 in taken) == (
        takes_float32, takes_float32, takes_bfloat16)
    # and never an AMD GPU, whatever capability it reports
    monkeypatch.setattr(triton_route, '_DEVICES', {})
    monkeypatch.setattr(triton_route, '_read_limits', lambda index: DeviceLimits('an AMD GPU', capability, 65_536,
                                                                               'rocm', 'gfx90a'))
    assert triton_route.triton_dtypes(cuda) == ()


# The decisions table of docs/advanced/precision_and_backends.md: each row a GPU (the names its first column gives)
TABLE_GPUS = {'T4, RTX 20xx': T4, 'V100': V100, 'A100, A800': A100, 'RTX 30xx, A10, A40, A6000': RTX_3090,
              'Jetson AGX Orin': ORIN, 'RTX 40xx, L4, L40S': RTX_4090, 'H100, H200, H20': H100, 'B200, GB200': B200,
              'B300, GB300': B300, 'RTX 50xx, RTX PRO 6000 Blackwell': RTX_5090, 'DGX Spark (GB10)': DGX_SPARK,
              'MI250X': MI250X, 'MI300X': MI300X}
TABLE_HEADER = ('| GPU (target, shared memory per block) | m = 49, d = 32: training | m = 49, d = 32: inference '
                '| m = d = 64: training | m = d = 64: inference |')
_AUTOCASTS = (('float32', None), ('bfloat16', torch.bfloat16), ('float16', torch.float16))


def _short_reason(reason: str) -> str:
    """The Triton backend's refusal, as a table cell says it."""
    needs = re.match(r'needs ([\d,]+) B of shared memory', reason)
    for start, short in (('is built and checked for NVIDIA GPUs', 'an AMD GPU'),
                         ('is built and checked for', 'not a target'),
                         ('has no bfloat16 kernels', f'no bfloat16 below sm_{BFLOAT16_MIN_TARGET}'),
                         ('is checked on sm_', 'triton too old')):
        if reason.startswith(start):
            return short
    assert needs, reason
    return f'needs {needs.group(1)} B'


def decision_cell(sizes: dict, grad: bool) -> str:
    """What a call of float32 inputs, alone or under bfloat16 or float16 autocast, gets on the (fake) device: one
    backend for all three, or each with its dtypes; the reference math with the Triton backend's reason."""
    groups: dict[str, list[str]] = {}
    for name, autocast in _AUTOCASTS:
        backend, products = choose(torch.float32, autocast=autocast, grad=grad, sizes=sizes)
        label = 'Triton'
        if backend != 'triton':
            with pytest.raises(DispatchError) as err:
                choose(torch.float32, autocast=autocast, grad=grad, sizes=sizes, name='triton')
            # (float16 products where no backend takes them: the whole op in float32)
            computed = ', in float32' if name == 'float16' and products == 'float32' else ''
            reason = _short_reason(str(err.value).split('backend ' + repr('triton') + ' ', 1)[1])
            label = f'reference{computed} ({reason})'
        groups.setdefault(label, []).append(name)
    if len(groups) == 1:
        return next(iter(groups))
    return '; '.join(f'{", ".join(names)}: {label}' for label, names in groups.items())


def _row_label(names: str, limits: DeviceLimits) -> str:
    if limits.platform == 'rocm':
        major, minor = limits.capability
        return f'{names} ({limits.arch}, ROCm, reports {major}.{minor}; {limits.shared_memory_per_block:,} B)'
    return f'{names} (sm_{limits.target}, {limits.shared_memory_per_block:,} B)'


def _documented_rows() -> list[str]:
    lines = (ROOT / 'docs' / 'advanced' / 'precision_and_backends.md').read_text().splitlines()
    start = lines.index(TABLE_HEADER) + 2
    return [line for line in lines[start:start + len(TABLE_GPUS) + 1] if line.startswith('|')]


@pytest.mark.parametrize('names', list(TABLE_GPUS))
def test_each_row_of_the_documented_decisions_table_is_the_dispatcher_s(on_device, names):
    limits = TABLE_GPUS[names]
    on_device(limits)
    cells = [decision_cell(sizes, grad) for sizes in (PUBLISHED, CORNER) for grad in (True, False)]
    expected = f'| {_row_label(names, limits)} | ' + ' | '.join(cells) + ' |'
    rows = _documented_rows()
    assert expected in rows, '\n'.join([expected, *rows])


def test_the_documented_decisions_table_has_a_row_for_every_gpu_and_no_other():
    rows = _documented_rows()
    assert [row.split(' | ')[0][2:] for row in rows] == [_row_label(n, g) for n, g in TABLE_GPUS.items()]
    # every target, and every way of being declined, appears
    assert {g.target for g in TABLE_GPUS.values() if g.built_for} == set(TARGETS)


@pytest.mark.parametrize('metadata, expected', [
    ({'triton': '3.8.0'}, (3, 8)),
    ({'pytorch-triton': '3.8.0+git7f8c1e2'}, (3, 8)),  # PyTorch nightlies' triton: no 'triton' distribution
    ({}, (3, 9)),  # a build from source without metadata: the package's own __version__ line
])
def test_triton_s_version_is_read_where_its_metadata_is(monkeypatch, tmp_path, metadata, expected):
    import importlib.machinery
    import importlib.metadata
    import importlib.util

    package = tmp_path / 'triton'
    package.mkdir()
    (package / '__init__.py').write_text("__version__ = '3.9.0'\nraise ImportError('imported')\n")

    def version(name):
        if name not in metadata:
            raise importlib.metadata.PackageNotFoundError(name)
        return metadata[name]

    monkeypatch.setattr(importlib.metadata, 'version', version)
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name: importlib.machinery.ModuleSpec(
        name, None, origin=str(package / '__init__.py')) if name == 'triton' else None)
    assert triton_route._installed_triton() == expected  # (the package itself never imported: it would raise)


def test_the_version_of_a_blackwell_ready_triton_without_metadata_takes_blackwell(monkeypatch):
    """A B200 with triton 3.8 from a source build (no metadata): read from its version line, not taken as the floor
    (3.4), so the device is not refused with "found 3.4"."""
    monkeypatch.setattr(triton_route, 'TRITON_VERSION', (3, 8))
    assert triton_route.device_reasons(DeviceLimits('NVIDIA B200', (10, 0), 232_448), bfloat16=True) == []
    monkeypatch.setattr(triton_route, 'TRITON_VERSION', (3, 4))
    assert 'found 3.4' in triton_route.device_reasons(DeviceLimits('NVIDIA B200', (10, 0), 232_448), True)[0]


def test_float16_run_in_float32_is_announced_once_per_device_and_reason(on_device, monkeypatch):
    """A V100 (not a target) under float16 autocast: no backend there stores float16 products' sums in float32, so the
    op runs in float32, and the automatic choice says so once, with every backend's reason."""
    import warnings

    from soft_mm.ops.soft import dispatch

    monkeypatch.setattr(dispatch, '_ANNOUNCED', set())
    monkeypatch.setattr(dispatch, '_DECISIONS', {})
    on_device(V100)
    policy = precision_policy('cpu', torch.float16)
    with pytest.warns(dispatch.BackendFallbackWarning) as record:
        backend, chosen = dispatch.decide('cuda', torch.float32, policy, 10 ** 5, True, device_index=0, **PUBLISHED)
    assert backend.name == 'reference' and chosen.products == torch.float32
    messages = [str(w.message) for w in record]
    assert messages[0].startswith(
        "soft_attention on cuda:0: float16 products are not taken here (the 'triton' backend is built and checked "
        f"for {BUILT}, not this Tesla V100-SXM2-32GB (sm_70); the 'reference' backend has no float16 products with "
        "float32 accumulation); the op runs in float32 (said once per device and reason"), messages
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        dispatch.decide('cuda', torch.float32, policy, 10 ** 5, False, device_index=0, **PUBLISHED)  # said already
    # an H100 takes the float16 products: nothing to say
    monkeypatch.setattr(dispatch, '_DECISIONS', {})
    on_device(H100)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert dispatch.decide('cuda', torch.float32, policy, 10 ** 5, True, device_index=0, **PUBLISHED)[1].products \
            == torch.float16
