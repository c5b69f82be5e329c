"""soft_mm.ops.triton_cubins: every Triton kernel the backend launches (the m×m one included), in every dtype
combination the precision policy hands it, compiled on this CPU machine to real cubins for sm_80 (Ampere) and sm_90
(Hopper) — the GPU code with the real bfloat16 branches, not the interpreter's emulation — with 0 spilled registers at
d = 32."""
import pytest

from soft_mm.ops.triton_config import BLOCK_N, BLOCK_N_BACKWARD, NUM_WARPS, middle_warps
from soft_mm.ops.triton_cubins import KERNELS, LAUNCH_DTYPES, MIDDLE_VARIANTS, format_table, resource_usage
from soft_mm.ops.triton_nystrom import triton_available

pytestmark = pytest.mark.skipif(not triton_available(),
                                reason='triton is not installed (bash tools/install.sh adds it)')


@pytest.mark.slow  # about 50 s of compilation on 2 cores when triton's cache is cold (about 2 s when warm)
def test_every_kernel_compiles_for_ampere_and_hopper_without_spills_at_head_dim_32():
    rows = resource_usage(archs=(80, 90), num_landmarks=49, head_dim=32)
    archs = ('sm_80', 'sm_90')
    expected = {(kernel, *dtypes, arch) for kernel in KERNELS for dtypes in LAUNCH_DTYPES for arch in archs}
    # the m×m kernel (float32 whatever the inputs), plain and SOFT-Norm
    expected |= {(name, 'fp32', '-', 'fp32', arch) for name, _ in MIDDLE_VARIANTS for arch in archs}
    assert {(r['kernel'], r['q'], r['v'], r['products'], r['arch']) for r in rows} == expected and len(rows) == 46
    for row in rows:
        assert 0 < row['registers'] <= 255, row
        assert row['stack_bytes'] == 0 and row['local_bytes'] == 0, row  # no spilled register
        if row['kernel'].startswith('nystrom_middle'):
            assert row['num_warps'] == middle_warps(49) == 8 and row['block'] is None
            assert row['tensor_core_instructions'] == [], row  # IEEE float32: the iteration amplifies rounding
            continue
        assert row['num_warps'] == NUM_WARPS
        assert row['block'] == (BLOCK_N_BACKWARD if row['kernel'] == 'backward' else BLOCK_N)
        # the real low-precision branch: bfloat16 / float16 tensor-core products accumulating in float32 (sm_90:
        # wgmma where the block has 64 rows), and none in float32 (IEEE FMAs: no TF32)
        instructions = row['tensor_core_instructions']
        if row['products'] == 'fp32':
            assert instructions == [], row
        else:
            low = {'bf16': 'bf16', 'fp16': 'f16'}[row['products']]
            assert instructions and all(f'.f32.{low}.{low}' in i for i in instructions), row
            assert any(i.startswith('wgmma') for i in instructions) == (row['arch'] == 'sm_90'
                                                                         and row['kernel'] != 'backward'), row
    table = format_table(rows).splitlines()
    assert len(table) == 1 + 23 and 'sm_80 regs / spill B' in table[0] and 'sm_90 regs / spill B' in table[0]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r'archs must be compute capabilities >= 75 such as 80 or 90, got \(70,\)'):
        resource_usage(archs=(70,))
    with pytest.raises(ValueError, match=r"head_dim must be an int in 1..128 \(the kernels' limit\), got 129"):
        resource_usage(head_dim=129)


def test_the_table_puts_each_architecture_in_a_column():
    rows = [dict(kernel='kt_x', q='fp32', v='fp32', products='fp32', arch=arch, registers=regs, stack_bytes=stack,
                 local_bytes=0) for arch, regs, stack in (('sm_90', 94, 8), ('sm_80', 128, 0))]
    assert format_table(rows).splitlines()[1].split() == ['kt_x', 'fp32', 'fp32', 'fp32', '128', '/', '0', '94', '/',
                                                          '8']
