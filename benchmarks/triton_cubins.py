"""The Triton backend's kernels compiled ahead of time for GPUs this machine need not have: registers, spills and shared
memory, and the table of shared memory the dispatcher decides with.

Every kernel the SOFT op declares (``KERNELS`` of :mod:`soft_mm.ops.soft.backends.triton.nystrom_config`: the token
kernels, ``TOKEN_KERNELS``, in every dtype combination the precision policy hands them, ``LAUNCH_DTYPES``; the m×m
kernel and its backward, float32, plain and SOFT-Norm: ``MIDDLE_VARIANTS``, ``MIDDLE_BACKWARD_VARIANTS``; the float32
kernels that finish the split reductions, ``GROUP_KERNELS``) is
compiled by ``triton.compile(ASTSource(...), target=GPUTarget('cuda', arch, 32))`` to a cubin for each target
architecture (by default every target of ``triton_targets.TARGETS`` that the installed triton is checked with,
``triton_targets.TARGET_MIN_TRITON``), each with its own launch configuration (the blocks of
``nystrom_config.kernel_block``, the pipeline stages of ``nystrom_config.kernel_stages``) — the real GPU code, with the
real bfloat16 branches, not the interpreter's emulation — and ``cuobjdump --dump-resource-usage`` (shipped in triton's
wheel, as ``ptxas`` is) reads each cubin's registers per thread and the bytes of stack frame (where ptxas puts spilled
registers: ``ptxas -v`` reports as many spill-store bytes), local memory and shared memory per program. 0 stack and
local bytes: no spills. The
compilation runs in a child process with ``TRITON_INTERPRET`` unset (in a process that interprets, triton's own library
functions are decorated for the interpreter and cannot be compiled); this file imports only triton and the standard
library, and soft_mm's plain-Python and Triton-only modules from their files without the package (:func:`_load`), so
the child starts in a second. Integer arguments are compiled as plain ``i32`` (a real launch may specialise
a stride of 1 or a multiple of 16, which only removes instructions; the shared memory is the same, checked at the
published sizes on sm_80, sm_86 and sm_90).

    python benchmarks/triton_cubins.py [--arch 75 80 86 89 90 100 103 120 121] [--landmarks 49 ...] [--head-dim 32 ...]
        [--json]
    python benchmarks/triton_cubins.py --write-table   # regenerate .../backends/triton/nystrom_shared_memory.py
    python benchmarks/triton_cubins.py --check-table   # compile it again and compare (exit 1 where it differs)
    python benchmarks/triton_cubins.py --layers [--width 64 128 320 1024]   # the blocks' add + LayerNorm kernels

Besides registers and spills it reads each kernel's dynamic shared memory from the compiled metadata
(``metadata.shared``): what a launch asks for, which must fit the device's opt-in limit per block
(``triton_targets.SHARED_MEMORY_PER_BLOCK``); cuobjdump reports only the static part.
Several sizes give every (m, d) corner and a second table of the largest request per corner. ``--write-table``
compiles the backend's declared corners (m = 1, 49, 64; d = 16, 32, 64) for every target and writes the largest
request per target, padded size, kernel and products dtype as the module the dispatcher reads
(:mod:`soft_mm.ops.soft.backends.triton.nystrom_limits`), with the sha256 of the kernel sources it was compiled from
(:func:`kernel_sources`); ``--check-table`` compiles them again and compares. ``tests/ops/test_triton_cubins.py``
holds the hash, and compiles the published size for every target and the largest corner for one target of each
launch configuration, which must give the table's figures.

``--layers`` compiles the blocks' fused add + LayerNorm kernels instead (``KERNELS`` of
:mod:`soft_mm.ops.functional.add_norm.add_norm_config`, in each flag set the models launch,
``LAYER_VARIANTS``, the stream in float32, bfloat16 or float16) at the given row widths, with the rows per program
that :mod:`soft_mm.ops.functional.add_norm.add_norm_config` gives each width.

``--conv-add`` compiles the SOFT layers' fused value conv instead (:mod:`soft_mm.ops.functional.head_conv_kernels`: its
forward, its input gradient and its filters' partial sums) at SOFT's filter sizes and head widths, in the ``--dtype``
values, with the tokens per program of :mod:`soft_mm.ops.functional.head_conv_config`.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import importlib.metadata
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path

__all__ = ['ARCHS', 'CHECKED_ARCHS', 'CONV_ADD_FILTERS', 'CONV_ADD_HEAD_DIMS', 'CONV_ADD_VARIANTS',
           'DECLARED_HEAD_DIMS', 'DECLARED_LANDMARKS', 'GROUP_KERNELS', 'LAUNCH_DTYPES', 'LAYER_KERNELS',
           'LAYER_VARIANTS', 'LAYER_WIDTHS', 'MIDDLE_BACKWARD_VARIANTS', 'MIDDLE_VARIANTS', 'TOKEN_KERNELS',
           'conv_add_resource_usage', 'format_shared_memory', 'format_table', 'kernel_sources',
           'layer_resource_usage', 'limit', 'resource_usage', 'shared_memory_table', 'table_module']

_DTYPE_NAMES = {'fp32': 'float32', 'bf16': 'bfloat16', 'fp16': 'float16'}
# the token kernels' token tensors, each a (pointer, (b, h, n, d) strides) tuple, in q's or v's dtype; their sizes
# (H, N, M, D, DV); their tuples of float32 pointers; every other pointer is float32 (landmarks, middle, partial sums)
_Q_TENSORS = ('q', 'dq')
_V_TENSORS = ('x', 'v', 'do', 'o', 'dv')
_TOKEN_SIZES = ('i32',) * 5
_FLOAT32_PAIRS = ('factors', 'partials')
# the PTX of a tensor-core product: mma.sync (sm_75..sm_120), wgmma (sm_90), tcgen05.mma (sm_100: its operand dtypes
# are in the instruction descriptor, ``kind::f16`` for both bfloat16 and float16)
_TENSOR_CORE_INSTRUCTIONS = r'(?:wgmma\.mma_async|mma\.sync|tcgen05\.mma)\.\S+'
_OPS = Path(__file__).resolve().parents[1] / 'soft_mm/ops'
_TRITON_BACKEND = _OPS / 'soft/backends/triton'
# soft_mm's folder imported under this name by _load: its modules import each other, its __init__ files are not run
_BY_PATH = '_soft_mm_by_path'


def _load(module: str):
    """soft_mm's module ``module`` (its dotted path inside the package, e.g. ``'ops.triton_targets'``: a plain-Python
    or Triton-only module) imported from its file without the soft_mm package, so without torch: each package on the
    way an empty module over its folder (its ``__init__`` not run), all under the top-level name :data:`_BY_PATH`
    rather than ``soft_mm`` (a process may import the real package beside it). The module's relative imports resolve
    there (the kernels' ``triton_interpreter``)."""
    parts = module.split('.')
    for depth in range(len(parts)):
        name = '.'.join([_BY_PATH, *parts[:depth]])
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(_OPS.parent.joinpath(*parts[:depth]))]
            sys.modules[name] = package
    return importlib.import_module(f'{_BY_PATH}.{module}')


def _installed_triton() -> tuple[int, ...]:
    """The installed triton's (major, minor), from its package metadata (without importing it)."""
    try:
        return tuple(int(part) for part in re.findall(r'\d+', importlib.metadata.version('triton'))[:2])
    except importlib.metadata.PackageNotFoundError:
        return (0, 0)


_TARGETS = _load('ops.triton_targets')
_CONFIG = _load('ops.soft.backends.triton.nystrom_config')
_KERNELS = 'ops.soft.backends.triton.nystrom_kernels'
ARCHS = _TARGETS.TARGETS
# the targets the installed triton is checked with (triton_targets.TARGET_MIN_TRITON), the default
CHECKED_ARCHS = tuple(arch for arch in ARCHS if _installed_triton() >= _TARGETS.TARGET_MIN_TRITON.get(arch, (0,)))
TOKEN_KERNELS = _CONFIG.TOKEN_KERNELS
LAUNCH_DTYPES = _CONFIG.LAUNCH_DTYPES
# the m×m kernels' rows: (the name in the table, SOFT_NORM); their tensors are float32 whatever the inputs' dtype
MIDDLE_VARIANTS = _CONFIG.MIDDLE_KERNELS
MIDDLE_BACKWARD_VARIANTS = _CONFIG.MIDDLE_BACKWARD_KERNELS
GROUP_KERNELS = _CONFIG.GROUP_KERNELS
# every corner the backend declares it takes: m = 1 (16 padded), 49, 64 (64 padded); d = 16, 32, 64
DECLARED_LANDMARKS = (1, 49, _CONFIG.MAX_LANDMARKS)
DECLARED_HEAD_DIMS = (16, 32, _CONFIG.MAX_HEAD_DIM)
_TABLE_FILE = _TRITON_BACKEND / 'nystrom_shared_memory.py'
# what the table's figures are compiled from besides triton: the kernels, their blocks, stages and warps, the targets
# and the modules the kernels import (the table holds the hash of these files, :func:`kernel_sources`)
_TABLE_SOURCES = (_KERNELS, 'ops.soft.backends.triton.nystrom_config', 'ops.triton_targets', 'ops.triton_interpreter')
_ADD_NORM = _load('ops.functional.add_norm.add_norm_config')
LAYER_KERNELS = _ADD_NORM.KERNELS
# SOFT's post-norm widths (stages 1 and 2: 64, 128; stage 3: 288-352, padded to 512) and the widest the kernels take
LAYER_WIDTHS = (64, 128, 320, _ADD_NORM.MAX_ADD_NORM_WIDTH)
# the tensors of the stream (the addends but the branch's bias, the output and their gradients) in the stream's dtype
# (S), the rest float32 (F); the kernels' tuples of pointers: the addends (x, r, bb, sc), the norm's (w, b), the
# gradients received (dy, dsum) and written (ds, dx); the sizes (R, C, T)
_STREAM_POINTERS = ('y_ptr', 'sum_ptr')
_LAYER_TUPLES = {'addends': 'SSFS', 'norm': 'FF', 'grads_in': 'SS', 'grads_out': 'SS'}
_LAYER_SIZES = ('i32',) * 3
LAYER_VARIANTS = _ADD_NORM.LAUNCH_VARIANTS


def _code(path: Path) -> str:
    """The code of a module's file without its comments, docstrings and layout (``ast.dump`` of the docstring-less
    tree): what compiling it depends on."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, 'body', None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def kernel_sources() -> str:
    """The sha256 of the code the shared-memory table is compiled from (:data:`_TABLE_SOURCES`; comments and
    docstrings aside): an edit to it makes the held table stale until ``--write-table`` compiles it again."""
    digest = hashlib.sha256()
    for module in _TABLE_SOURCES:
        code = _code(_OPS.parent.joinpath(*module.split('.')).with_suffix('.py'))
        digest.update(f'{module}\0{code}\0'.encode())
    return digest.hexdigest()


def _tool(name: str) -> str:
    """Path of a CUDA binary shipped in triton's wheel (``cuobjdump``, ``ptxas``)."""
    import triton
    try:
        return getattr(triton.knobs.nvidia, name).path
    except AttributeError:  # triton before knobs
        return str(Path(triton.__file__).parent / 'backends' / 'nvidia' / 'bin' / name)


def _signature(fn, q: str, v: str, products: str, num_landmarks: int, head_dim: int, arch: int,
               ) -> tuple[dict, dict]:
    """``ASTSource``'s signature and constants of a launch of ``fn`` on ``arch`` (as the backend launches it)."""
    pad = _CONFIG.padded
    signature, constants = {}, dict(BLOCK=_CONFIG.kernel_block(fn.__name__, arch), MP=pad(num_landmarks),
                                     DP=pad(head_dim), DVP=pad(head_dim),
                                     PRODUCTS=_CONFIG.PRODUCTS_CODES[_DTYPE_NAMES[products]])
    for name in fn.arg_names:
        if name in constants:
            signature[name] = 'constexpr'
        elif name in _Q_TENSORS or name in _V_TENSORS:  # (pointer, its (b, h, n, d) strides)
            signature[name] = ('*' + (q if name in _Q_TENSORS else v), ('i32',) * 4)
        elif name == 'sizes':
            signature[name] = _TOKEN_SIZES
        elif name in _FLOAT32_PAIRS:
            signature[name] = ('*fp32', '*fp32')
        else:
            signature[name] = '*fp32' if name.endswith('_ptr') else 'i32'
    return signature, constants


def _middle_signature(fn, soft_norm: bool, num_landmarks: int, head_dim: int) -> tuple[dict, dict]:
    """``ASTSource``'s signature and constants of a launch of a float32 kernel with one program per group (the m×m
    kernels, those of :data:`GROUP_KERNELS`)."""
    constants = dict(MP=_CONFIG.padded(num_landmarks), DP=_CONFIG.padded(head_dim), DVP=_CONFIG.padded(head_dim),
                     SOFT_NORM=soft_norm)
    constants = {name: value for name, value in constants.items() if name in fn.arg_names}
    floats = ('ridge', 'floor')
    signature = {name: 'constexpr' if name in constants else '*fp32' if name.endswith('_ptr')
                 else 'fp32' if name in floats else 'i32' for name in fn.arg_names}
    return signature, constants


def _parse_resources(text: str) -> dict[str, int]:
    """``REG:252 STACK:0 SHARED:0 LOCAL:0 ...`` of cuobjdump's one function -> ``{'registers': 252, ...}``."""
    fields = dict(re.findall(r'(\w+):(\d+)', text.split('Function', 1)[1]))
    return dict(registers=int(fields['REG']), stack_bytes=int(fields['STACK']), local_bytes=int(fields['LOCAL']),
                shared_bytes=int(fields['SHARED']))


def _compile_corners(archs: tuple[int, ...], landmarks: tuple[int, ...], head_dims: tuple[int, ...],
                     only: tuple[str, ...] | None = None) -> list[dict]:
    """The table of every (m, d) corner, compiled in this process (which must not interpret): each padded size once,
    its rows repeated for every corner that pads to it; ``only``: the rows of these kernel names alone."""
    compiled: dict[tuple[int, int], list[dict]] = {}
    rows = []
    for num_landmarks in landmarks:
        for head_dim in head_dims:
            key = (_CONFIG.padded(num_landmarks), _CONFIG.padded(head_dim))
            if key not in compiled:
                compiled[key] = _compile_all(archs, num_landmarks, head_dim, only)
            rows += [dict(row, num_landmarks=num_landmarks, head_dim=head_dim) for row in compiled[key]]
    return rows


def _compile_all(archs: tuple[int, ...], num_landmarks: int, head_dim: int, only: tuple[str, ...] | None = None,
                 ) -> list[dict]:
    """The table at one size, compiled in this process (which must not interpret); ``only``: these kernels alone."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernels = _load(_KERNELS)
    launches = []  # (table name, kernel, q, v, products, arch, signature, constants, warps, stages)
    for arch in archs:
        for name in TOKEN_KERNELS:
            fn = getattr(kernels, name)
            for q, v, products in LAUNCH_DTYPES:
                launches.append((name, fn, q, v, products, arch,
                                 *_signature(fn, q, v, products, num_landmarks, head_dim, arch), _CONFIG.NUM_WARPS,
                                 _CONFIG.kernel_stages(name, arch)))
        middle, middle_backward = (getattr(kernels, variants[0][0]) for variants in (MIDDLE_VARIANTS,
                                                                                      MIDDLE_BACKWARD_VARIANTS))
        for (label, soft_norm), fn in [*((variant, middle) for variant in MIDDLE_VARIANTS),
                                       *((variant, middle_backward)
                                         for variant in MIDDLE_BACKWARD_VARIANTS),
                                       *(((name, False), getattr(kernels, name)) for name in GROUP_KERNELS)]:
            launches.append((label, fn, 'fp32', '-', 'fp32', arch,
                             *_middle_signature(fn, soft_norm, num_landmarks, head_dim),
                             _CONFIG.middle_warps(num_landmarks), _CONFIG.DEFAULT_STAGES))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for label, fn, q, v, products, arch, signature, constants, warps, stages in launches:
            if only is not None and label not in only:
                continue
            compiled = triton.compile(ASTSource(fn, signature, constants), target=GPUTarget('cuda', arch, 32),
                                      options=dict(num_warps=warps, num_stages=stages))
            cubin = Path(folder) / f'{label}_{arch}.cubin'
            cubin.write_bytes(compiled.asm['cubin'])
            dump = subprocess.run([_tool('cuobjdump'), '--dump-resource-usage', str(cubin)], check=True,
                                  capture_output=True, text=True).stdout
            mma = sorted(set(re.findall(_TENSOR_CORE_INSTRUCTIONS, compiled.asm['ptx'])))
            rows.append(dict(kernel=label, q=q, v=v, products=products, arch=f'sm_{arch}',
                             num_landmarks=num_landmarks, head_dim=head_dim, num_warps=warps, num_stages=stages,
                             block=constants.get('BLOCK'), tensor_core_instructions=mma,
                             dynamic_shared_bytes=int(compiled.metadata.shared), **_parse_resources(dump)))
    return rows


def _compile_layers(archs: tuple[int, ...], widths: tuple[int, ...]) -> list[dict]:
    """One row per add + LayerNorm kernel, stream dtype, architecture and width, compiled in this process (which
    must not interpret), as :mod:`soft_mm.ops.functional.add_norm.add_norm_launch` launches them (triton's default 4
    warps)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernels = _load('ops.functional.add_norm.add_norm_kernels')
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for arch in archs:
            for width in widths:
                constants = dict(ROWS=_ADD_NORM.add_norm_rows(width), CP=_ADD_NORM.padded_width(width))
                for dtype, variant, name in itertools.product(_DTYPE_NAMES, LAYER_VARIANTS, LAYER_KERNELS):
                    fn = getattr(kernels, name)
                    used = {key: value for key, value in {**constants, **LAYER_VARIANTS[variant]}.items()
                            if key in fn.arg_names}
                    kinds = {'S': '*' + dtype, 'F': '*fp32'}
                    signature = {arg: 'constexpr' if arg in used else '*' + dtype if arg in _STREAM_POINTERS
                                 else tuple(kinds[k] for k in _LAYER_TUPLES[arg]) if arg in _LAYER_TUPLES
                                 else _LAYER_SIZES if arg == 'sizes' else '*fp32' if arg.endswith('_ptr')
                                 else 'fp32' if arg == 'eps' else 'i32'
                                 for arg in fn.arg_names}
                    compiled = triton.compile(ASTSource(fn, signature, used), target=GPUTarget('cuda', arch, 32))
                    cubin = Path(folder) / f'{name}_{arch}.cubin'
                    cubin.write_bytes(compiled.asm['cubin'])
                    dump = subprocess.run([_tool('cuobjdump'), '--dump-resource-usage', str(cubin)], check=True,
                                          capture_output=True, text=True).stdout
                    rows.append(dict(kernel=name, variant=variant, dtype=dtype, arch=f'sm_{arch}', width=width,
                                     rows=constants['ROWS'], num_warps=compiled.metadata.num_warps,
                                     dynamic_shared_bytes=int(compiled.metadata.shared),
                                     **_parse_resources(dump)))
    return rows


# the value conv's kernels (soft_mm.ops.functional.head_conv.conv_add): the launches' variants (FLIP, HAS_ADD) of the
# forward kernel, the filter sizes of SOFT's stages and the head widths compiled (SOFT's 32, and the widest it takes)
_CONV_ADD = 'ops.functional.head_conv_kernels'
_CONV_ADD_CONFIG = _load('ops.functional.head_conv_config')
CONV_ADD_VARIANTS = {'forward': dict(FLIP=False, HAS_ADD=True), 'input gradient': dict(FLIP=True, HAS_ADD=False)}
CONV_ADD_FILTERS = (3, 5, 9)
CONV_ADD_HEAD_DIMS = (32, 128)


def _compile_conv_add(archs: tuple[int, ...], dtypes: tuple[str, ...]) -> list[dict]:
    """One row per value-conv kernel (and forward variant), stream dtype, architecture, filter size and head width,
    compiled in this process (which must not interpret) as :func:`soft_mm.ops.functional.head_conv.conv_add` launches
    them."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernels = _load(_CONV_ADD)
    forward, filters = _CONV_ADD_CONFIG.KERNELS
    jobs = [(forward, variant, flags) for variant, flags in CONV_ADD_VARIANTS.items()]
    jobs.append((filters, 'filter gradient', {}))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for arch, dtype, (name, variant, flags), k, dp in itertools.product(archs, dtypes, jobs, CONV_ADD_FILTERS,
                                                                            CONV_ADD_HEAD_DIMS):
            fn = getattr(kernels, name)
            constants = dict(BLOCK=_CONV_ADD_CONFIG.block_tokens(dp), DP=dp, K=k, **flags)
            strided = ('*' + dtype, ('i32',) * 4)
            signature = {arg: 'constexpr' if arg in constants else ('i32',) * 4 if arg == 'sizes'
                         else '*fp32' if arg.endswith('_ptr') else strided for arg in fn.arg_names}
            compiled = triton.compile(ASTSource(fn, signature, constants), target=GPUTarget('cuda', arch, 32),
                                      options=dict(num_warps=_CONV_ADD_CONFIG.NUM_WARPS))
            cubin = Path(folder) / f'{name}_{arch}.cubin'
            cubin.write_bytes(compiled.asm['cubin'])
            dump = subprocess.run([_tool('cuobjdump'), '--dump-resource-usage', str(cubin)], check=True,
                                  capture_output=True, text=True).stdout
            rows.append(dict(kernel=name, variant=variant, dtype=dtype, arch=f'sm_{arch}', kernel_size=k, head_dim=dp,
                             num_warps=compiled.metadata.num_warps,
                             dynamic_shared_bytes=int(compiled.metadata.shared), **_parse_resources(dump)))
    return rows


def conv_add_resource_usage(archs: tuple[int, ...] = CHECKED_ARCHS, dtypes: tuple[str, ...] = tuple(_DTYPE_NAMES),
                            timeout: float = 1800) -> list[dict]:
    """The rows of :func:`_compile_conv_add`, compiled in a child process without ``TRITON_INTERPRET``.

    Raises:
        ValueError: an architecture below 75, or a dtype other than fp32, bf16 and fp16.
        RuntimeError: the compilation failed (its output in the message).
    """
    archs, dtypes = tuple(archs), tuple(dtypes)
    if not archs or any(isinstance(a, bool) or not isinstance(a, int) or a < 75 for a in archs):
        raise ValueError(f'conv_add_resource_usage: archs must be compute capabilities >= 75 such as 80 or 90, '
                         f'got {archs!r}')
    if not dtypes or any(d not in _DTYPE_NAMES for d in dtypes):
        raise ValueError(f'conv_add_resource_usage: dtypes must be of {", ".join(_DTYPE_NAMES)}, got {dtypes!r}')
    return _child(['--conv-add', '--dtype', *dtypes, '--arch', *map(str, archs)], timeout)


def layer_resource_usage(archs: tuple[int, ...] = CHECKED_ARCHS, widths: tuple[int, ...] = LAYER_WIDTHS,
                         timeout: float = 1800) -> list[dict]:
    """The rows of :func:`_compile_layers` (``kernel``, ``dtype``, ``arch``, ``width``, ``rows``, ``num_warps``,
    ``registers``, ``stack_bytes``, ``local_bytes``, ``shared_bytes``, ``dynamic_shared_bytes``), compiled in a child
    process without ``TRITON_INTERPRET`` as :func:`resource_usage` does.

    Raises:
        ValueError: an architecture below 75, or a width outside 1..MAX_ADD_NORM_WIDTH.
        RuntimeError: the compilation failed (its output in the message).
    """
    archs, widths = tuple(archs), tuple(widths)
    if not archs or any(isinstance(a, bool) or not isinstance(a, int) or a < 75 for a in archs):
        raise ValueError(f'layer_resource_usage: archs must be compute capabilities >= 75 such as 80 or 90, '
                         f'got {archs!r}')
    top = _ADD_NORM.MAX_ADD_NORM_WIDTH
    if not widths or any(isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= top for w in widths):
        raise ValueError(f'layer_resource_usage: widths must be ints in 1..{top} (the kernels\' limit), got {widths!r}')
    return _child(['--layers', '--width', *map(str, widths), '--arch', *map(str, archs)], timeout)


def _child(arguments: list[str], timeout: float) -> list[dict]:
    """The JSON rows this tool prints with ``arguments`` and ``--json``, run in a child process without
    ``TRITON_INTERPRET``."""
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    command = [sys.executable, str(Path(__file__).resolve()), '--json', *arguments]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f'compiling the Triton kernels failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}')
    return json.loads(proc.stdout)


def _compiles_for(arch: int) -> bool:
    """Whether the installed triton and its ptxas build a cubin for ``arch`` (Blackwell needs a recent one)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(_load(_KERNELS), MIDDLE_VARIANTS[0][0])
    try:
        triton.compile(ASTSource(fn, *_middle_signature(fn, False, 16, 16)), target=GPUTarget('cuda', arch, 32))
    except Exception:  # (triton raises several kinds: no such target, ptxas failing)
        return False
    return True


def resource_usage(archs: tuple[int, ...] = CHECKED_ARCHS, num_landmarks: int | tuple[int, ...] = 49,
                   head_dim: int | tuple[int, ...] = 32, kernels: tuple[str, ...] | None = None,
                   timeout: float = 1800) -> list[dict]:
    """One row per kernel, dtype combination, architecture and size: ``kernel``, ``q``, ``v``, ``products``,
    ``arch``, ``num_landmarks``, ``head_dim``, ``registers`` (per thread), ``stack_bytes`` (spilled registers; 0 =
    none), ``local_bytes``, ``shared_bytes`` (cuobjdump's static shared memory), ``dynamic_shared_bytes`` (the shared
    memory a launch asks for, from the compiled metadata: what must fit the device's limit per block),
    ``num_warps``, ``num_stages``, ``block`` and ``tensor_core_instructions`` (the PTX's ``mma.sync`` / ``wgmma`` /
    ``tcgen05.mma`` instructions, e.g. ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``; none where the
    products are IEEE float32 FMAs).

    Compiled in a child process without ``TRITON_INTERPRET`` (see the module docstring); needs triton, no GPU.
    ``num_landmarks`` (m) and ``head_dim`` (d = d_v), an int or a tuple of them (every pair: the corners), set the
    padded tile sizes, as a launch at those sizes does. ``kernels``: the rows of these names alone (the table's names:
    a kernel of ``TOKEN_KERNELS`` or ``GROUP_KERNELS``, or a variant name of ``MIDDLE_VARIANTS`` or
    ``MIDDLE_BACKWARD_VARIANTS``; None: all).

    Raises:
        ValueError: an architecture is not one of triton's CUDA targets (>= 75), a size is out of 1..128, or a kernel
            name is not one of the table's.
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
    names = _kernel_names()
    if kernels is not None and (not kernels or any(k not in names for k in kernels)):
        raise ValueError(f'resource_usage: kernels must be names of {", ".join(names)}; got {kernels!r}')
    return _child(['--landmarks', *map(str, sizes['num_landmarks']), '--head-dim', *map(str, sizes['head_dim']),
                   '--arch', *map(str, archs), *(['--kernels', *kernels] if kernels else [])], timeout)


def _kernel_names() -> tuple[str, ...]:
    """The rows' kernel names, in the table's order."""
    return (*TOKEN_KERNELS, *(name for name, _ in MIDDLE_VARIANTS + MIDDLE_BACKWARD_VARIANTS), *GROUP_KERNELS)


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
    that architecture's limit per block (:data:`~soft_mm.ops.triton_targets.SHARED_MEMORY_PER_BLOCK`)."""
    archs = sorted({row['arch'] for row in rows}, key=lambda a: int(a[3:]))
    largest: dict[tuple[int, int], dict[str, dict]] = {}
    for row in rows:
        per_arch = largest.setdefault((row['num_landmarks'], row['head_dim']), {})
        if row['arch'] not in per_arch or row['dynamic_shared_bytes'] > per_arch[row['arch']]['dynamic_shared_bytes']:
            per_arch[row['arch']] = row
    lines = [f'{"m":>4} {"d":>4}' + ''.join(f'{arch + " (limit " + format(limit(arch) or 0, ",") + " B)":>44}'
                                           for arch in archs)]
    for (m, d), per_arch in sorted(largest.items()):
        cells = ''
        for arch in archs:
            row = per_arch[arch]
            fits = 'fits' if row['dynamic_shared_bytes'] <= (limit(arch) or 0) else 'OVER'
            cell = f'{format(row["dynamic_shared_bytes"], ","):>12} B {fits:<4} ({row["kernel"]} {row["q"]}/{row["v"]})'
            cells += cell.rjust(44)
        lines.append(f'{m:>4} {d:>4}{cells}')
    return '\n'.join(lines)


def format_layer_table(rows: list[dict]) -> str:
    """The add + LayerNorm rows as a text table: per kernel, dtype and width, per architecture the registers per
    thread, the spilled bytes and the dynamic shared memory."""
    archs = sorted({r['arch'] for r in rows}, key=lambda a: int(a[3:]))
    lines = ['kernel variant dtype width rows ' + ' '.join(f'{a} regs / spill B / smem B' for a in archs)]
    by_key = {(r['kernel'], r['variant'], r['dtype'], r['width'], r['arch']): r for r in rows}
    for kernel, variant, dtype, width in sorted({(r['kernel'], r['variant'], r['dtype'], r['width']) for r in rows}):
        cells = []
        for arch in archs:
            r = by_key.get((kernel, variant, dtype, width, arch))
            cells.append('-' if r is None else
                         f"{r['registers']} / {r['stack_bytes'] + r['local_bytes']} / {r['dynamic_shared_bytes']}")
        rows_per_program = next(r['rows'] for r in rows if (r['kernel'], r['width']) == (kernel, width))
        lines.append(f"{kernel} '{variant}' {dtype} {width} {rows_per_program} " + ' '.join(cells))
    return '\n'.join(lines)


def limit(arch: str) -> int | None:
    """The opt-in shared memory per block of an architecture such as ``'sm_86'``, bytes (None where the table of
    :data:`~soft_mm.ops.triton_targets.SHARED_MEMORY_PER_BLOCK` does not know it)."""
    return _TARGETS.SHARED_MEMORY_PER_BLOCK.get(int(arch[3:]))


def shared_memory_table(rows: list[dict]) -> dict[tuple[int, int, int], dict[str, object]]:
    """The dispatcher's table from compiled rows: per ``(target, padded m, padded d)``, the dynamic shared memory
    each kernel asks for, by products dtype (``'float32'``, ``'bfloat16'``, ``'float16'``; the largest over the dtypes
    of q) for the three token kernels, one figure for each m×m kernel (the larger of plain and SOFT-Norm)."""
    table: dict[tuple[int, int, int], dict[str, object]] = {}
    # each m×m kernel's rows under its own name (the first of its variants' names)
    middle_names = {name: variants[0][0] for variants in (MIDDLE_VARIANTS, MIDDLE_BACKWARD_VARIANTS)
                    for name, _ in variants}
    middle_names.update({name: name for name in GROUP_KERNELS})
    for row in rows:
        key = (int(row['arch'][3:]), _CONFIG.padded(row['num_landmarks']), _CONFIG.padded(row['head_dim']))
        entry = table.setdefault(key, {})
        need = row['dynamic_shared_bytes']
        if row['kernel'] in middle_names:
            kernel = middle_names[row['kernel']]
            entry[kernel] = max(need, entry.get(kernel, 0))
        else:
            per_dtype = entry.setdefault(row['kernel'], {})
            products = _DTYPE_NAMES[row['products']]
            per_dtype[products] = max(need, per_dtype.get(products, 0))
    return {key: dict(sorted(entry.items())) for key, entry in sorted(table.items())}


def table_module(rows: list[dict]) -> str:
    """The text of ``soft_mm/ops/soft/backends/triton/nystrom_shared_memory.py`` from compiled rows
    (``--write-table``)."""
    import triton

    lines = ['"""The dynamic shared memory each Triton kernel asks for at launch, per target, padded size and products',
             'dtype: generated by ``python benchmarks/triton_cubins.py --write-table`` (triton '
             f'{triton.__version__}), held by',
             '``tests/ops/test_triton_cubins.py``, read by :mod:`.nystrom_limits`. Do not edit by hand."""',
             '',
             f'TRITON = {triton.__version__!r}  # the triton that compiled the table',
             '# the sha256 of the kernel sources it was compiled from (triton_cubins.kernel_sources)',
             f'SOURCES = {kernel_sources()!r}',
             '# (target, padded m, padded d) -> kernel -> bytes by products dtype (the m×m kernel: one figure)',
             'SHARED_MEMORY = {']
    for key, entry in shared_memory_table(rows).items():
        lines.append(f'    {key}: {{')
        for kernel, need in entry.items():
            lines.append(f'        {kernel!r}: {need!r},')
        lines.append('    },')
    lines.append('}')
    return '\n'.join(lines) + '\n'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--arch', type=int, nargs='+', default=list(CHECKED_ARCHS),
                        help='compute capabilities, e.g. 80 90 (default: the targets the installed triton is checked '
                        'with, ' + ' '.join(map(str, CHECKED_ARCHS)) + ')')
    parser.add_argument('--landmarks', type=int, nargs='+', default=[49],
                        help='m, one or more (padded to a power of two >= 16)')
    parser.add_argument('--head-dim', type=int, nargs='+', default=[32], help='d = d_v, one or more (padded likewise)')
    parser.add_argument('--json', action='store_true', help='print the rows as JSON instead of the tables')
    parser.add_argument('--layers', action='store_true',
                        help='compile the blocks\' fused add + LayerNorm kernels instead, at the --width values')
    parser.add_argument('--width', type=int, nargs='+', default=list(LAYER_WIDTHS),
                        help='row widths for --layers (default: ' + ' '.join(map(str, LAYER_WIDTHS)) + ')')
    parser.add_argument('--write-table', action='store_true',
                        help=f'compile the declared corners for every target and write {_TABLE_FILE.name}, the '
                             'dispatcher\'s shared-memory table (ignores --arch, --landmarks, --head-dim, --kernels)')
    parser.add_argument('--kernels', nargs='+', choices=_kernel_names(),
                        help='compile these kernels alone (default: every one)')
    parser.add_argument('--check-table', action='store_true',
                        help=f'compile as --write-table does and compare with the held {_TABLE_FILE.name}: exit 1 '
                             'where it differs')
    parser.add_argument('--conv-add', action='store_true',
                        help='compile the value conv\'s kernels instead, in the --dtype values')
    parser.add_argument('--dtype', nargs='+', choices=tuple(_DTYPE_NAMES), default=list(_DTYPE_NAMES),
                        help='stream dtypes for --conv-add (default: all)')
    args = parser.parse_args(argv)
    archs, landmarks, head_dims = tuple(args.arch), tuple(args.landmarks), tuple(args.head_dim)
    if args.conv_add:
        if os.environ.get('TRITON_INTERPRET', '0') == '1':
            rows = conv_add_resource_usage(archs, tuple(args.dtype))
        else:
            rows = _compile_conv_add(archs, tuple(args.dtype))
        print(json.dumps(rows) if args.json else '\n'.join(
            f"{r['kernel']} ({r['variant']}) {r['dtype']} {r['arch']} k={r['kernel_size']} d={r['head_dim']}: "
            f"{r['registers']} regs, {r['local_bytes']} B spilled, {r['dynamic_shared_bytes']} B shared" for r in rows))
        return 0
    whole_table = args.write_table or args.check_table
    if args.layers:
        if os.environ.get('TRITON_INTERPRET', '0') == '1':
            rows = layer_resource_usage(archs, tuple(args.width))
        else:
            rows = _compile_layers(archs, tuple(args.width))
        print(json.dumps(rows) if args.json else format_layer_table(rows))
        return 0
    if whole_table:
        if CHECKED_ARCHS != ARCHS:  # the table must hold every target
            newest = max(_TARGETS.TARGET_MIN_TRITON.values())
            parser.error(f'--write-table and --check-table compile every target, which needs triton >= '
                         f'{".".join(map(str, newest))}')
        archs, landmarks, head_dims = ARCHS, DECLARED_LANDMARKS, DECLARED_HEAD_DIMS
    if os.environ.get('TRITON_INTERPRET', '0') == '1':
        rows = resource_usage(archs, landmarks, head_dims, None if whole_table else args.kernels)
    else:
        unbuilt = [arch for arch in archs if arch not in CHECKED_ARCHS and not _compiles_for(arch)]
        if unbuilt:
            print(f'triton_cubins: the installed triton builds no cubin for sm_{", sm_".join(map(str, unbuilt))}; '
                  'left out', file=sys.stderr)
        rows = _compile_corners(tuple(a for a in archs if a not in unbuilt), landmarks, head_dims,
                                None if whole_table else args.kernels)
    if args.write_table:
        _TABLE_FILE.write_text(table_module(rows))
        print(f'wrote {_TABLE_FILE}')
    elif args.check_table:
        held, compiled = _TABLE_FILE.read_text().splitlines(), table_module(rows).splitlines()
        differences = [f'line {i + 1}: held {a!r}, compiled {b!r}' for i, (a, b) in enumerate(zip(held, compiled))
                       if a != b] + ([f'held {len(held)} lines, compiled {len(compiled)}']
                                     if len(held) != len(compiled) else [])
        print('\n'.join(differences) if differences else f'{_TABLE_FILE.name} holds what this triton compiles')
        return 1 if differences else 0
    else:
        print(json.dumps(rows) if args.json else format_table(rows) + '\n\n' + format_shared_memory(rows))
    return 0


if __name__ == '__main__':
    sys.exit(main())
