"""triton_cubins: every Triton kernel the backend launches (the m×m one included), in every dtype
combination the precision policy hands it, compiled on this CPU machine to real cubins for sm_80 (Ampere) and sm_90
(Hopper) — the GPU code with the real bfloat16 branches, not the interpreter's emulation — with 0 spilled registers at
the published sizes from triton 3.6 (triton 3.4's code generation spills 8-88 B in the backward: correct, slower), and
at every size the backend declares a launch that fits each target's shared memory."""
import pytest
from op_checks import triton_kernels
from triton_cubins import (
    KERNELS,
    LAUNCH_DTYPES,
    MIDDLE_VARIANTS,
    format_shared_memory,
    format_table,
    resource_usage,
)

from soft_mm.ops.soft.backends.triton.backend import TRITON_VERSION
from soft_mm.ops.soft.backends.triton.config import (
    BLOCK_N,
    BLOCK_N_BACKWARD,
    MAX_HEAD_DIM,
    MAX_LANDMARKS,
    NUM_WARPS,
    SHARED_MEMORY_PER_BLOCK,
    middle_warps,
)

pytestmark = triton_kernels
# the oldest triton whose cubins spill no register at the published sizes (3.6: the GPU image's; 3.8 the newest)
SPILL_FREE_TRITON = (3, 6)


PUBLISHED = (49, 32)  # the sizes every variant runs at: m = 49 landmarks (a 7×7 grid), head dim 32
# every corner the backend declares it takes: m = 1 (16 padded), 49, 64 (64 padded); d = 16, 32, 64
DECLARED_LANDMARKS = (1, 49, MAX_LANDMARKS)
DECLARED_HEAD_DIMS = (16, 32, MAX_HEAD_DIM)


@pytest.mark.slow  # 276 compilations (6 padded sizes × 23 launches × 2 targets): minutes when triton's cache is cold
@pytest.mark.parametrize('head_dim', DECLARED_HEAD_DIMS)  # a third each: xdist's workers compile them side by side
def test_every_declared_corner_compiles_for_ampere_and_hopper_and_fits_their_shared_memory(head_dim):
    rows = resource_usage(archs=(80, 90), num_landmarks=DECLARED_LANDMARKS, head_dim=head_dim)
    assert len(rows) == 46 * len(DECLARED_LANDMARKS)
    for row in rows:  # what a launch asks for (the compiled metadata), within each target's opt-in limit per block
        assert row['dynamic_shared_bytes'] <= SHARED_MEMORY_PER_BLOCK[int(row['arch'][3:])], row
    corners = format_shared_memory(rows).splitlines()
    assert len(corners) == 1 + len(DECLARED_LANDMARKS) and all(line.count('fits') == 2 for line in corners[1:])
    if head_dim == MAX_HEAD_DIM:
        # the largest declared tiles nearly fill an A100 (observed 163,840 of 166,912 B at m = d = 64)
        assert max(r['dynamic_shared_bytes'] for r in rows if r['arch'] == 'sm_80') > 0.9 * SHARED_MEMORY_PER_BLOCK[80]
    if head_dim != PUBLISHED[1]:
        return
    published = [r for r in rows if (r['num_landmarks'], r['head_dim']) == PUBLISHED]
    archs = ('sm_80', 'sm_90')
    expected = {(kernel, *dtypes, arch) for kernel in KERNELS for dtypes in LAUNCH_DTYPES for arch in archs}
    # the m×m kernel (float32 whatever the inputs), plain and SOFT-Norm
    expected |= {(name, 'fp32', '-', 'fp32', arch) for name, _ in MIDDLE_VARIANTS for arch in archs}
    assert {(r['kernel'], r['q'], r['v'], r['products'], r['arch']) for r in published} == expected
    assert len(published) == 46
    for row in published:
        assert 0 < row['registers'] <= 255, row
        if TRITON_VERSION >= SPILL_FREE_TRITON:  # no spilled register
            assert row['stack_bytes'] == 0 and row['local_bytes'] == 0, row
        else:  # triton 3.4 (torch 2.8-2.10): the backward spills a little, the other kernels nothing
            spilled = row['stack_bytes'] + row['local_bytes']
            assert spilled <= 128 and (row['kernel'] == 'nystrom_bwd_kernel_dq_dv_dl' or spilled == 0), row
        if row['kernel'].startswith('nystrom_middle_fwd_kernel'):
            assert row['num_warps'] == middle_warps(49) == 8 and row['block'] is None
            assert row['tensor_core_instructions'] == [], row  # IEEE float32: the iteration amplifies rounding
            continue
        assert row['num_warps'] == NUM_WARPS
        assert row['block'] == (BLOCK_N_BACKWARD if row['kernel'] == 'nystrom_bwd_kernel_dq_dv_dl' else BLOCK_N)
        # the real low-precision branch: bfloat16 / float16 tensor-core products accumulating in float32 (sm_90:
        # wgmma where the block has 64 rows), and none in float32 (IEEE FMAs: no TF32)
        instructions = row['tensor_core_instructions']
        if row['products'] == 'fp32':
            assert instructions == [], row
        else:
            low = {'bf16': 'bf16', 'fp16': 'f16'}[row['products']]
            assert instructions and all(f'.f32.{low}.{low}' in i for i in instructions), row
            backward = row['kernel'] == 'nystrom_bwd_kernel_dq_dv_dl'
            assert any(i.startswith('wgmma') for i in instructions) == (row['arch'] == 'sm_90' and not backward), row
    table = format_table(published).splitlines()
    assert len(table) == 1 + 23 and 'sm_80 regs / spill B / smem B' in table[0] and 'sm_90' in table[0]


@pytest.mark.slow  # 46 compilations for sm_80
def test_the_declared_limits_are_the_largest_that_fit_an_a100():
    # one step beyond either limit (the next padded tile: m = 65..128, or d = 65..128) some kernel asks an A100 for
    # more than it has (observed: the m×m kernel 196,608 B at m = 128; every backward over 166,912 B at d = 128)
    for num_landmarks, head_dim in ((MAX_LANDMARKS + 1, 32), (49, MAX_HEAD_DIM + 1)):
        rows = resource_usage(archs=(80,), num_landmarks=num_landmarks, head_dim=head_dim)
        assert max(r['dynamic_shared_bytes'] for r in rows) > SHARED_MEMORY_PER_BLOCK[80], (num_landmarks, head_dim)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r'archs must be compute capabilities >= 75 such as 80 or 90, got \(70,\)'):
        resource_usage(archs=(70,))
    with pytest.raises(ValueError, match=r"head_dim must be an int in 1..128 \(the kernels' limit\), got 129"):
        resource_usage(head_dim=129)


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
