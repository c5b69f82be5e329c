"""triton_cubins: every Triton kernel the backend launches (the m×m one included), in every dtype
combination the precision policy hands it, compiled on this CPU machine to real cubins for every target the backend is
built for (``triton_targets.TARGETS``, each from the triton of ``TARGET_MIN_TRITON``), each with its own blocks and
pipeline stages — the GPU code with the real bfloat16 branches, not the
interpreter's emulation — with 0 spilled registers at the published sizes from triton 3.6 (sm_75 and Blackwell: 3.8;
older code generation spills 8-88 B in the backward: correct, slower) wherever the kernels are taken, and at every size
the backend declares the shared memory each kernel asks for, which the dispatcher's table holds and decides with."""
import importlib.metadata
import re

import pytest
from helpers.op_checks import triton_kernels
from triton_cubins import (
    CHECKED_ARCHS,
    CONV_ADD_FILTERS,
    CONV_ADD_HEAD_DIMS,
    CONV_ADD_VARIANTS,
    DECLARED_HEAD_DIMS,
    DECLARED_LANDMARKS,
    GROUP_KERNELS,
    LAUNCH_DTYPES,
    LAYER_KERNELS,
    LAYER_VARIANTS,
    LAYER_WIDTHS,
    MIDDLE_BACKWARD_VARIANTS,
    MIDDLE_VARIANTS,
    TOKEN_KERNELS,
    conv_add_resource_usage,
    format_layer_table,
    format_shared_memory,
    format_table,
    kernel_sources,
    layer_resource_usage,
    resource_usage,
    shared_memory_table,
)

from soft_mm.ops.soft.backends.triton.nystrom_config import (
    MAX_HEAD_DIM,
    MAX_LANDMARKS,
    NUM_WARPS,
    kernel_block,
    kernel_stages,
    middle_warps,
    padded,
)
from soft_mm.ops.soft.backends.triton.nystrom_limits import launch_reasons, launched_kernels
from soft_mm.ops.soft.backends.triton.nystrom_shared_memory import SHARED_MEMORY, SOURCES, TRITON
from soft_mm.ops.triton_route import TRITON_VERSION, DeviceLimits
from soft_mm.ops.triton_targets import BFLOAT16_MIN_TARGET, SHARED_MEMORY_PER_BLOCK, TARGET_MIN_TRITON, TARGETS

pytestmark = triton_kernels
# the oldest triton whose cubins spill no register at the published sizes, per target: 3.6 (the GPU image's) for
# sm_80..sm_90; sm_75 3.8 (the newest: triton 3.6 spills 8 B in its float16-products backward, where every dot is FMAs);
# Blackwell 3.8, the oldest it is compiled and checked with (triton_targets.TARGET_MIN_TRITON)
SPILL_FREE_TRITON = {75: (3, 8), 80: (3, 6), 86: (3, 6), 89: (3, 6), 90: (3, 6), 100: (3, 8), 103: (3, 8),
                     120: (3, 8), 121: (3, 8)}
# the targets whose forward kernels multiply on the tensor cores through wgmma (Hopper) and tcgen05 (data-centre
# Blackwell), where the block of the product has 64 rows; the others (and every backward) through mma.sync
WGMMA_TARGETS, TCGEN05_TARGETS = (90,), (100, 103)
PUBLISHED = (49, 32)  # the sizes every variant runs at: m = 49 landmarks (a 7×7 grid), head dim 32
# 28 a size and target: 3 token kernels × 7 dtype combinations, 2 + 2 m×m ones, 3 that finish the split sums
LAUNCHES = (len(TOKEN_KERNELS) * len(LAUNCH_DTYPES) + len(MIDDLE_VARIANTS) + len(MIDDLE_BACKWARD_VARIANTS)
            + len(GROUP_KERNELS))
_PRODUCTS = {'fp32': 'float32', 'bf16': 'bfloat16', 'fp16': 'float16'}


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r'\d+', version)[:3])


def _configuration(target: int) -> tuple:
    """What a target's kernels are compiled with besides the sizes: each token kernel's block and pipeline stages."""
    return tuple((kernel_block(k, target), kernel_stages(k, target)) for k in TOKEN_KERNELS)


# the checked targets by launch configuration: the first of each compiles the largest corner, the others are held to it
CONFIGURATIONS: dict[tuple, list[int]] = {}
for _target in CHECKED_ARCHS:
    CONFIGURATIONS.setdefault(_configuration(_target), []).append(_target)


def _table_entries(target: int) -> dict:
    return {(m, d): entry for (t, m, d), entry in SHARED_MEMORY.items() if t == target}


def _held_to_the_table(rows: list[dict]) -> None:
    """The compiled rows give the table's figures: exactly from the triton that wrote it, at most them from another
    (the decisions are then safe, never a launch that does not fit)."""
    exact = _release(importlib.metadata.version('triton')) == _release(TRITON)
    for key, entry in shared_memory_table(rows).items():
        held = SHARED_MEMORY[key]
        if exact:
            assert entry == held, key
        for kernel, need in entry.items():
            for products, bytes_ in (need.items() if isinstance(need, dict) else [(None, need)]):
                assert bytes_ <= (held[kernel] if products is None else held[kernel][products]), (key, kernel)


def test_the_tool_compiles_every_target_the_installed_triton_is_checked_with():
    assert tuple(t for t in TARGETS if TARGET_MIN_TRITON.get(t, (0,)) <= TRITON_VERSION) == CHECKED_ARCHS
    assert set(TARGET_MIN_TRITON) == {100, 103, 120, 121} and set(SPILL_FREE_TRITON) == set(TARGETS)
    if TRITON_VERSION >= (3, 8):
        assert CHECKED_ARCHS == TARGETS


def test_the_table_was_compiled_from_these_kernel_sources_and_holds_every_declared_corner():
    # an edit to the kernels, their blocks, stages or warps, the targets or the modules the kernels import makes the
    # table stale: `python benchmarks/triton_cubins.py --write-table` compiles every corner again (--check-table
    # compares)
    assert kernel_sources() == SOURCES, 'stale: run python benchmarks/triton_cubins.py --write-table'
    assert set(SHARED_MEMORY) == {(t, padded(m), padded(d)) for t in TARGETS for m in DECLARED_LANDMARKS
                                  for d in DECLARED_HEAD_DIMS}
    # the targets of one launch configuration ask for the same shared memory at every corner (sm_90's wgmma tiles for
    # what sm_80's mma.sync ones do), which is why the compiled sample below takes one target of each
    if CHECKED_ARCHS == TARGETS:
        assert sorted(CONFIGURATIONS.values()) == [[75], [80, 90], [86, 89], [100, 103], [120, 121]]
    for targets in CONFIGURATIONS.values():
        assert all(_table_entries(t) == _table_entries(targets[0]) for t in targets), targets


def test_the_dispatcher_takes_a_call_exactly_where_the_tables_figures_fit():
    # for every target the installed triton is checked with, corner, products dtype and direction: the dispatcher (a
    # fake device of that target with its opt-in limit) takes the call exactly where every kernel the call launches
    # fits, by the table (Blackwell below triton 3.8: declined whatever it fits, tests/ops/test_triton_targets.py)
    import torch
    dtypes = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}
    for target in CHECKED_ARCHS:
        limit = SHARED_MEMORY_PER_BLOCK[target]
        device = DeviceLimits(f'sm_{target} device', divmod(target, 10), limit)
        for m in DECLARED_LANDMARKS:
            for d in DECLARED_HEAD_DIMS:
                entry = SHARED_MEMORY[(target, padded(m), padded(d))]
                for products, dtype in dtypes.items():
                    for needs_grad in (False, True):
                        kernels = launched_kernels(needs_grad)
                        assert set(kernels) <= set(entry), (target, m, d)
                        needs = [need if isinstance(need, int) else need[products]
                                 for kernel, need in entry.items() if kernel in kernels]
                        fits = max(needs) <= limit and not (products == 'bfloat16' and target < BFLOAT16_MIN_TARGET)
                        reasons = launch_reasons(device, dtype, dtype, m, d, d, needs_grad)
                        assert fits == (not reasons), (target, m, d, products, needs_grad, reasons)


@pytest.mark.slow  # 140 compilations (28 launches × 5 targets): about 2 minutes when triton's cache is cold
def test_the_largest_corner_compiles_to_the_tables_figures_for_each_launch_configuration():
    representatives = tuple(targets[0] for targets in CONFIGURATIONS.values())
    rows = resource_usage(archs=representatives, num_landmarks=MAX_LANDMARKS, head_dim=MAX_HEAD_DIM)
    assert len(rows) == LAUNCHES * len(representatives)
    _held_to_the_table(rows)
    # the largest declared tiles nearly fill an A100 (observed 163,840 of 166,912 B) and fit every kernel an A100 and
    # an H100 launch (sm_90 asks for sm_80's figures: above)
    a100 = [r['dynamic_shared_bytes'] for r in rows if r['arch'] == 'sm_80']
    assert 0.9 * SHARED_MEMORY_PER_BLOCK[80] < max(a100) <= SHARED_MEMORY_PER_BLOCK[80]


@pytest.mark.slow  # 252 compilations (28 launches × 9 targets): about 2 minutes when triton's cache is cold
def test_the_published_size_compiles_for_every_target_without_spills_to_the_tables_figures():
    rows = resource_usage(archs=CHECKED_ARCHS, num_landmarks=PUBLISHED[0], head_dim=PUBLISHED[1])
    _held_to_the_table(rows)
    archs = tuple(f'sm_{t}' for t in CHECKED_ARCHS)
    expected = {(kernel, *dtypes, arch) for kernel in TOKEN_KERNELS for dtypes in LAUNCH_DTYPES for arch in archs}
    # the m×m kernel and its backward (float32 whatever the inputs), plain and SOFT-Norm
    group_names = [*(name for name, _ in MIDDLE_VARIANTS + MIDDLE_BACKWARD_VARIANTS), *GROUP_KERNELS]
    expected |= {(name, 'fp32', '-', 'fp32', arch) for name in group_names for arch in archs}
    assert {(r['kernel'], r['q'], r['v'], r['products'], r['arch']) for r in rows} == expected
    assert len(rows) == LAUNCHES * len(CHECKED_ARCHS)
    for row in rows:
        target = int(row['arch'][3:])
        assert 0 < row['registers'] <= 255, row
        taken = target >= BFLOAT16_MIN_TARGET or 'bf16' not in (row['q'], row['products'])
        if SPILL_FREE_TRITON[target] <= TRITON_VERSION and taken:  # no spilled register wherever the kernels are taken
            assert row['stack_bytes'] == 0 and row['local_bytes'] == 0, row
        elif taken:  # older triton (3.4 on torch 2.8-2.10; 3.6 on sm_75): the backward spills a little, nothing else
            spilled = row['stack_bytes'] + row['local_bytes']
            assert spilled <= 128 and (row['kernel'] == 'nystrom_bwd_kernel_dq_dv_dl' or spilled == 0), row
        if row['kernel'].startswith('nystrom_middle_') or row['kernel'] in GROUP_KERNELS:
            assert row['num_warps'] == middle_warps(49) == 8 and row['block'] is None
            assert row['tensor_core_instructions'] == [], row  # IEEE float32: the iteration amplifies rounding
            continue
        assert row['num_warps'] == NUM_WARPS
        assert row['block'] == kernel_block(row['kernel'], target)
        assert row['num_stages'] == kernel_stages(row['kernel'], target)
        # the real low-precision branch: bfloat16 / float16 tensor-core products accumulating in float32 (sm_90:
        # wgmma where the block has 64 rows; sm_100 / sm_103: tcgen05, whose operand dtypes are in its instruction
        # descriptor, kind::f16 for both), and none in float32 (IEEE FMAs: no TF32); on sm_75 triton writes every dot
        # as FMAs (the operands still rounded to float16 first, the same products)
        instructions = row['tensor_core_instructions']
        if row['products'] == 'fp32' or not taken or target == 75:
            assert (row['products'] != 'fp32' and target != 75) or instructions == [], row
            continue
        low = {'bf16': 'bf16', 'fp16': 'f16'}[row['products']]
        assert instructions and all(f'.f32.{low}.{low}' in i or i == 'tcgen05.mma.cta_group::1.kind::f16'
                                    for i in instructions), row
        backward = row['kernel'] == 'nystrom_bwd_kernel_dq_dv_dl'
        assert any(i.startswith('wgmma') for i in instructions) == (target in WGMMA_TARGETS and not backward), row
        assert any(i.startswith('tcgen05') for i in instructions) == (target in TCGEN05_TARGETS and not backward), row
    table = format_table(rows).splitlines()
    assert len(table) == 1 + LAUNCHES and all(f'{arch} regs / spill B / smem B' in table[0] for arch in archs)


@pytest.mark.slow  # 360 compilations: 2 kernels × 3 variants × 3 dtypes × 4 widths × 5 targets
def test_the_blocks_add_norm_kernels_compile_without_spills_for_a_target_of_each_generation():
    # the post-norm blocks' fused add + LayerNorm (with the branch's bias and stochastic depth's scale) and the landmark
    # sampler's LayerNorm + GELU at SOFT's widths (64, 128; 320 padded to 512) and the widest the kernels take (1,024),
    # with the rows per program of add_norm_config: no spilled register (at 16 rows of 512 channels the backward
    # spilled 24-104 B on every target), shared memory a few KiB (reductions only); on Turing, Ampere, Hopper and both
    # Blackwells (sm_86 and sm_89 compile as sm_80 does, with the same 255 registers a thread; sm_103 and sm_121 as
    # sm_100 and sm_120)
    generations = tuple(t for t in (75, 80, 90, 100, 120) if t in CHECKED_ARCHS)
    rows = layer_resource_usage(archs=generations)
    archs = {f'sm_{t}' for t in generations}
    assert {(r['kernel'], r['variant'], r['dtype'], r['arch'], r['width']) for r in rows} == {
        (kernel, variant, dtype, arch, width) for kernel in LAYER_KERNELS for variant in LAYER_VARIANTS
        for dtype in _PRODUCTS for arch in archs for width in LAYER_WIDTHS}
    for row in rows:
        assert row['stack_bytes'] == 0 and row['local_bytes'] == 0, row
        assert 0 < row['registers'] <= 255 and row['dynamic_shared_bytes'] <= 8192, row
        assert row['rows'] == {64: 16, 128: 8, 320: 2, 1024: 1}[row['width']], row
    table = format_layer_table(rows).splitlines()
    assert len(table) == 1 + len(LAYER_KERNELS) * len(LAYER_VARIANTS) * len(_PRODUCTS) * len(LAYER_WIDTHS)


@pytest.mark.slow  # 90 compilations: 3 launches × 3 filters × 2 head widths × 5 targets
def test_the_value_conv_kernels_compile_without_spills_for_a_target_of_each_generation():
    # the SOFT layers' value conv with the attention output added (forward), its input gradient (the filters turned)
    # and its filters' partial sums, at SOFT's filter sizes (9, 5, 3) and head widths 32 (SOFT's) and 128 (the widest
    # conv_add takes), bfloat16 (float16 and float32 differ in their loads' and stores' conversions only): no spilled
    # register, no shared memory beyond the filters' reductions; on Turing, Ampere, Hopper and both Blackwells
    generations = tuple(t for t in (75, 80, 90, 100, 120) if t in CHECKED_ARCHS)
    rows = conv_add_resource_usage(archs=generations, dtypes=('bf16',))
    assert {(r['variant'], r['arch'], r['kernel_size'], r['head_dim']) for r in rows} == {
        (variant, f'sm_{arch}', k, d) for variant in (*CONV_ADD_VARIANTS, 'filter gradient') for arch in generations
        for k in CONV_ADD_FILTERS for d in CONV_ADD_HEAD_DIMS}
    for row in rows:
        assert row['stack_bytes'] == 0 and row['local_bytes'] == 0, row
        assert 0 < row['registers'] <= 255 and row['dynamic_shared_bytes'] <= 1024, row


@pytest.mark.slow  # 8 compilations for sm_80
def test_the_declared_limits_are_the_largest_that_fit_an_a100():
    # one step beyond either limit (the next padded tile: m = 65..128, or d = 65..128) a kernel asks an A100 for more
    # than it has: the m×m kernel at m = 128 (observed 196,608 B), the token backward at d = 128 in every dtype
    middle, backward = MIDDLE_VARIANTS[0][0], TOKEN_KERNELS[-1]
    for num_landmarks, head_dim, kernel in ((MAX_LANDMARKS + 1, 32, middle), (49, MAX_HEAD_DIM + 1, backward)):
        rows = resource_usage(archs=(80,), num_landmarks=num_landmarks, head_dim=head_dim, kernels=(kernel,))
        assert {r['kernel'] for r in rows} == {kernel} and len(rows) == (1 if kernel == middle else len(LAUNCH_DTYPES))
        assert min(r['dynamic_shared_bytes'] for r in rows) > SHARED_MEMORY_PER_BLOCK[80], (num_landmarks, head_dim)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r'archs must be compute capabilities >= 75 such as 80 or 90, got \(70,\)'):
        resource_usage(archs=(70,))
    with pytest.raises(ValueError, match=r"widths must be ints in 1..1024 \(the kernels' limit\), got \(2048,\)"):
        layer_resource_usage(widths=(2048,))
    with pytest.raises(ValueError, match=r"dtypes must be of fp32, bf16, fp16, got \('fp64',\)"):
        conv_add_resource_usage(dtypes=('fp64',))
    with pytest.raises(ValueError, match=r"head_dim must be an int in 1..128 \(the kernels' limit\), got 129"):
        resource_usage(head_dim=129)
    with pytest.raises(ValueError, match=r"kernels must be names of nystrom_fwd_kernel_context, .*; got \('fwd',\)"):
        resource_usage(kernels=('fwd',))


def test_the_table_puts_each_architecture_in_a_column():
    kernel = 'nystrom_fwd_kernel_context'
    rows = [dict(kernel=kernel, q='fp32', v='fp32', products='fp32', arch=arch, registers=regs, stack_bytes=stack,
                 local_bytes=0, num_landmarks=49, head_dim=32, dynamic_shared_bytes=smem)
            for arch, regs, stack, smem in (('sm_90', 94, 8, 200_000), ('sm_80', 128, 0, 170_000))]
    assert format_table(rows).splitlines()[1].split() == [kernel, 'fp32', 'fp32', 'fp32', '49', '32', '128', '/', '0',
                                                          '/', '170000', '94', '/', '8', '/', '200000']
    # the largest request per size against each target's limit: over an A100's 166,912 B, within an H100's
    assert format_shared_memory(rows).splitlines()[1].split()[:8] == ['49', '32', '170,000', 'B', 'OVER',
                                                                      f'({kernel}', 'fp32/fp32)', '200,000']
