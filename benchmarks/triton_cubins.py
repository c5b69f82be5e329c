"""The Triton backend's kernels compiled ahead of time for GPUs this machine need not have: registers and spills.

Every kernel that :mod:`soft_mm.ops.soft.backends.triton.backend` can launch (``nystrom_fwd_kernel_context``,
``nystrom_fwd_kernel_o``, ``nystrom_bwd_kernel_dq_dv_dl`` in every dtype combination the precision policy hands them,
:data:`LAUNCH_DTYPES`; ``nystrom_middle_fwd_kernel``, the m×m part, float32, plain and SOFT-Norm:
:data:`MIDDLE_VARIANTS`) is compiled by ``triton.compile(ASTSource(...), target=GPUTarget('cuda', arch, 32))`` to a
cubin for each target architecture (sm_80 Ampere, sm_90 Hopper by default) — the real GPU code, with the real bfloat16
branches, not the interpreter's emulation — and ``cuobjdump --dump-resource-usage`` (shipped in triton's wheel, as
``ptxas`` is) reads each cubin's registers per thread and the bytes of stack frame (where ptxas puts spilled registers:
``ptxas -v`` reports as many spill-store bytes), local memory and shared memory per program. 0 stack and local bytes: no
spills.  The compilation runs in a child process with ``TRITON_INTERPRET`` unset (in a process that interprets, triton's
own library functions are decorated for the interpreter and cannot be compiled); this file imports only triton and the
standard library, so the child starts in a second. Integer arguments are compiled as plain ``i32`` (a real launch may
specialise a stride of 1 or a multiple of 16, which only removes instructions).

    python benchmarks/triton_cubins.py [--arch 80 90] [--landmarks 49 ...] [--head-dim 32 ...] [--json]

Besides registers and spills it reads each kernel's dynamic shared memory from the compiled metadata
(``metadata.shared``): what a launch asks for, which must fit the device's opt-in limit per block (an A100's
166,912 B, an H100's 232,448 B); cuobjdump reports only the static part. Several sizes give every (m, d) corner and a
second table of the largest request per corner.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ['ARCHS', 'KERNELS', 'LAUNCH_DTYPES', 'MIDDLE_VARIANTS', 'format_shared_memory', 'format_table', 'limit',
           'resource_usage']

ARCHS = (80, 90)
KERNELS = ('nystrom_fwd_kernel_context', 'nystrom_fwd_kernel_o', 'nystrom_bwd_kernel_dq_dv_dl')
# (q, v, products) of every launch the precision policy can make: float32 everything; bfloat16 or float16 products
# with q in float32 (under autocast), bfloat16 or float16 (the inputs' dtype, whichever products are forced) and v
# cast to the products' dtype
LAUNCH_DTYPES = (('fp32', 'fp32', 'fp32'),
                 *((q, products, products) for products in ('bf16', 'fp16') for q in ('fp32', 'bf16', 'fp16')))
# the m×m kernel's rows: (its name in the table, SOFT_NORM); its tensors are float32 whatever the inputs' dtype
MIDDLE_VARIANTS = (('nystrom_middle_fwd_kernel', False), ('nystrom_middle_fwd_kernel_norm', True))
_DTYPE_NAMES = {'fp32': 'float32', 'bf16': 'bfloat16', 'fp16': 'float16'}
# pointer arguments in q's or v's dtype; every other pointer is float32 (landmarks, middle, partial sums)
_Q_POINTERS = ('q_ptr', 'dq_ptr')
_V_POINTERS = ('x_ptr', 'v_ptr', 'do_ptr', 'o_ptr', 'dv_ptr')
_TRITON_BACKEND = Path(__file__).resolve().parents[1] / 'soft_mm/ops/soft/backends/triton'
_KERNELS_FILE = _TRITON_BACKEND / 'kernels.py'


def _load(name: str, path: Path):
    """A module of the Triton backend loaded by its path (without importing the soft_mm package, or torch)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_CONFIG = _load('soft_mm_triton_config', _TRITON_BACKEND / 'config.py')


def _tool(name: str) -> str:
    """Path of a CUDA binary shipped in triton's wheel (``cuobjdump``, ``ptxas``)."""
    import triton
    try:
        return getattr(triton.knobs.nvidia, name).path
    except AttributeError:  # triton before knobs
        return str(Path(triton.__file__).parent / 'backends' / 'nvidia' / 'bin' / name)


def _signature(fn, q: str, v: str, products: str, num_landmarks: int, head_dim: int) -> tuple[dict, dict]:
    """``ASTSource``'s signature and constants of a launch of ``fn`` (as :mod:`.triton_nystrom` launches it)."""
    pad = _CONFIG.padded
    signature, constants = {}, dict(BLOCK=_CONFIG.KERNEL_BLOCKS[fn.__name__], MP=pad(num_landmarks),
                                     DP=pad(head_dim), DVP=pad(head_dim),
                                     PRODUCTS=_CONFIG.PRODUCTS_CODES[_DTYPE_NAMES[products]], INTERPRET=False)
    for name in fn.arg_names:
        if name in constants:
            signature[name] = 'constexpr'
        elif name.endswith('_ptr'):
            signature[name] = '*' + (q if name in _Q_POINTERS else v if name in _V_POINTERS else 'fp32')
        else:
            signature[name] = 'i32'
    return signature, constants


def _middle_signature(fn, soft_norm: bool, num_landmarks: int, head_dim: int) -> tuple[dict, dict]:
    """``ASTSource``'s signature and constants of a launch of ``nystrom_middle_fwd_kernel``."""
    constants = dict(MP=_CONFIG.padded(num_landmarks), DP=_CONFIG.padded(head_dim), SOFT_NORM=soft_norm,
                     INTERPRET=False)
    floats = ('ridge', 'floor')
    signature = {name: 'constexpr' if name in constants else '*fp32' if name.endswith('_ptr')
                 else 'fp32' if name in floats else 'i32' for name in fn.arg_names}
    return signature, constants


def _parse_resources(text: str) -> dict[str, int]:
    """``REG:252 STACK:0 SHARED:0 LOCAL:0 ...`` of cuobjdump's one function -> ``{'registers': 252, ...}``."""
    fields = dict(re.findall(r'(\w+):(\d+)', text.split('Function', 1)[1]))
    return dict(registers=int(fields['REG']), stack_bytes=int(fields['STACK']), local_bytes=int(fields['LOCAL']),
                shared_bytes=int(fields['SHARED']))


def _compile_corners(archs: tuple[int, ...], landmarks: tuple[int, ...], head_dims: tuple[int, ...]) -> list[dict]:
    """The table of every (m, d) corner, compiled in this process (which must not interpret): each padded size once,
    its rows repeated for every corner that pads to it."""
    compiled: dict[tuple[int, int], list[dict]] = {}
    rows = []
    for num_landmarks in landmarks:
        for head_dim in head_dims:
            key = (_CONFIG.padded(num_landmarks), _CONFIG.padded(head_dim))
            if key not in compiled:
                compiled[key] = _compile_all(archs, num_landmarks, head_dim)
            rows += [dict(row, num_landmarks=num_landmarks, head_dim=head_dim) for row in compiled[key]]
    return rows


def _compile_all(archs: tuple[int, ...], num_landmarks: int, head_dim: int) -> list[dict]:
    """The table at one size, compiled in this process (which must not interpret)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernels = _load('soft_mm_triton_kernels_aot', _KERNELS_FILE)
    launches = []  # (table name, kernel, q, v, products, signature, constants, warps)
    for name in KERNELS:
        fn = getattr(kernels, name)
        for q, v, products in LAUNCH_DTYPES:
            launches.append((name, fn, q, v, products,
                             *_signature(fn, q, v, products, num_landmarks, head_dim), _CONFIG.NUM_WARPS))
    for label, soft_norm in MIDDLE_VARIANTS:
        fn = kernels.nystrom_middle_fwd_kernel
        launches.append((label, fn, 'fp32', '-', 'fp32', *_middle_signature(fn, soft_norm, num_landmarks, head_dim),
                         _CONFIG.middle_warps(num_landmarks)))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for label, fn, q, v, products, signature, constants, warps in launches:
            for arch in archs:
                compiled = triton.compile(ASTSource(fn, signature, constants), target=GPUTarget('cuda', arch, 32),
                                          options=dict(num_warps=warps))
                cubin = Path(folder) / f'{label}_{arch}.cubin'
                cubin.write_bytes(compiled.asm['cubin'])
                dump = subprocess.run([_tool('cuobjdump'), '--dump-resource-usage', str(cubin)], check=True,
                                      capture_output=True, text=True).stdout
                mma = sorted(set(re.findall(r'(?:wgmma\.mma_async|mma\.sync)\.\S+', compiled.asm['ptx'])))
                rows.append(dict(kernel=label, q=q, v=v, products=products, arch=f'sm_{arch}',
                                 num_landmarks=num_landmarks, head_dim=head_dim, num_warps=warps,
                                 block=constants.get('BLOCK'), tensor_core_instructions=mma,
                                 dynamic_shared_bytes=int(compiled.metadata.shared), **_parse_resources(dump)))
    return rows


def resource_usage(archs: tuple[int, ...] = ARCHS, num_landmarks: int | tuple[int, ...] = 49,
                   head_dim: int | tuple[int, ...] = 32, timeout: float = 1800) -> list[dict]:
    """One row per kernel, dtype combination, architecture and size: ``kernel``, ``q``, ``v``, ``products``,
    ``arch``, ``num_landmarks``, ``head_dim``, ``registers`` (per thread), ``stack_bytes`` (spilled registers; 0 =
    none), ``local_bytes``, ``shared_bytes`` (cuobjdump's static shared memory), ``dynamic_shared_bytes`` (the shared
    memory a launch asks for, from the compiled metadata: what must fit the device's limit per block),
    ``num_warps``, ``block`` and ``tensor_core_instructions`` (the PTX's ``mma.sync`` / ``wgmma`` instructions, e.g.
    ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``; none where the products are IEEE float32 FMAs).

    Compiled in a child process without ``TRITON_INTERPRET`` (see the module docstring); needs triton, no GPU.
    ``num_landmarks`` (m) and ``head_dim`` (d = d_v), an int or a tuple of them (every pair: the corners), set the
    padded tile sizes, as a launch at those sizes does.

    Raises:
        ValueError: an architecture is not one of triton's CUDA targets (>= 75), or a size is out of 1..128.
        RuntimeError: the compilation failed (its output in the message).
    """
    archs = tuple(archs)
    if not archs or any(isinstance(a, bool) or not isinstance(a, int) or a < 75 for a in archs):
        raise ValueError(f'resource_usage: archs must be compute capabilities >= 75 such as 80 or 90, got {archs!r}')
    sizes = {}
    for name, value in (('num_landmarks', num_landmarks), ('head_dim', head_dim)):
        sizes[name] = tuple(value) if isinstance(value, (tuple, list)) else (value,)
        for size in sizes[name]:
            if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 128:
                raise ValueError(f'resource_usage: {name} must be an int in 1..128 (the kernels\' limit), '
                                 f'got {size!r}')
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    command = [sys.executable, str(Path(__file__).resolve()), '--json', '--landmarks',
               *map(str, sizes['num_landmarks']), '--head-dim', *map(str, sizes['head_dim']), '--arch',
               *map(str, archs)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f'compiling the Triton kernels failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}')
    return json.loads(proc.stdout)


def format_table(rows: list[dict]) -> str:
    """The rows as a text table: one line per kernel, dtypes and size (m, d); per architecture the registers per
    thread, the spilled bytes (stack frame plus local memory) and the dynamic shared memory a launch asks for."""
    archs = sorted({row['arch'] for row in rows}, key=lambda a: int(a[3:]))
    by_key: dict[tuple, dict] = {}
    for row in rows:
        key = (row['kernel'], row['q'], row['v'], row['products'], row.get('num_landmarks'), row.get('head_dim'))
        by_key.setdefault(key, {})[row['arch']] = row
    head = f'{"kernel":<19} {"q":<5} {"v":<5} {"products":<9} {"m":>4} {"d":>4}'
    lines = [head + ''.join(f'{arch + " regs / spill B / smem B":>32}' for arch in archs)]
    for (kernel, q, v, products, m, d), per_arch in by_key.items():
        cells = ''.join(f'{r["registers"]:>14} / {r["stack_bytes"] + r["local_bytes"]:<5} / '
                        f'{r.get("dynamic_shared_bytes", "-"):<7}' if r else f'{"-":>32}'
                        for r in (per_arch.get(arch) for arch in archs))
        lines.append(f'{kernel:<19} {q:<5} {v:<5} {products:<9} {m if m else "-":>4} {d if d else "-":>4}{cells}')
    return '\n'.join(lines)


def format_shared_memory(rows: list[dict]) -> str:
    """Per size (m, d) and architecture, the largest dynamic shared memory any kernel asks for and whether it fits
    that architecture's limit per block (:data:`~soft_mm.ops.soft.backends.triton.config.SHARED_MEMORY_PER_BLOCK`)."""
    archs = sorted({row['arch'] for row in rows}, key=lambda a: int(a[3:]))
    largest: dict[tuple[int, int], dict[str, dict]] = {}
    for row in rows:
        per_arch = largest.setdefault((row['num_landmarks'], row['head_dim']), {})
        if row['arch'] not in per_arch or row['dynamic_shared_bytes'] > per_arch[row['arch']]['dynamic_shared_bytes']:
            per_arch[row['arch']] = row
    lines = [f'{"m":>4} {"d":>4}' + ''.join(f'{arch + " (limit " + format(limit(arch), ",") + " B)":>44}'
                                           for arch in archs)]
    for (m, d), per_arch in sorted(largest.items()):
        cells = ''
        for arch in archs:
            row = per_arch[arch]
            fits = 'fits' if row['dynamic_shared_bytes'] <= limit(arch) else 'OVER'
            cell = f'{format(row["dynamic_shared_bytes"], ","):>12} B {fits:<4} ({row["kernel"]} {row["q"]}/{row["v"]})'
            cells += cell.rjust(44)
        lines.append(f'{m:>4} {d:>4}{cells}')
    return '\n'.join(lines)


def limit(arch: str) -> int:
    """The opt-in shared memory per block of ``'sm_80'`` or ``'sm_90'``, bytes."""
    return _CONFIG.SHARED_MEMORY_PER_BLOCK[int(arch[3:])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--arch', type=int, nargs='+', default=list(ARCHS), help='compute capabilities, e.g. 80 90')
    parser.add_argument('--landmarks', type=int, nargs='+', default=[49],
                        help='m, one or more (padded to a power of two >= 16)')
    parser.add_argument('--head-dim', type=int, nargs='+', default=[32], help='d = d_v, one or more (padded likewise)')
    parser.add_argument('--json', action='store_true', help='print the rows as JSON instead of the tables')
    args = parser.parse_args(argv)
    if os.environ.get('TRITON_INTERPRET', '0') == '1':
        rows = resource_usage(tuple(args.arch), tuple(args.landmarks), tuple(args.head_dim))
    else:
        rows = _compile_corners(tuple(args.arch), tuple(args.landmarks), tuple(args.head_dim))
    print(json.dumps(rows) if args.json else format_table(rows) + '\n\n' + format_shared_memory(rows))
    return 0


if __name__ == '__main__':
    sys.exit(main())
