"""Where the package's Triton kernels run, in one place: on CUDA tensors when a triton the kernels can use is
installed; on CPU tensors only inside :func:`interpreted_triton_route` (under ``TRITON_INTERPRET=1``: the tests, and
the tools that count what a GPU would launch, run the GPU's route there) or :func:`stubbed_triton_route` (triton's
real launch path to a stand-in driver that runs nothing: what the host-time meter runs); and how a kernel module is
loaded.

``TRITON_INTERPRET`` is read when a kernel is decorated, so :func:`load_kernels` re-imports a kernel module (and
:mod:`.triton_interpreter`, whose ``INTERPRET`` the kernels read) when the setting has changed since it was imported;
to interpret at all, the variable must be set before triton is first imported (triton decorates its own library
functions, ``tl.sum``, then).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch

from .triton_launch import KernelLauncher, PlannedLauncher
from .triton_targets import BFLOAT16_MIN_TARGET, MIN_TRITON, SHARED_MEMORY_PER_BLOCK, TARGET_MIN_TRITON, TARGETS

__all__ = ['PLATFORMS', 'TRITON_DISTRIBUTIONS', 'TRITON_VERSION', 'CpuRoute', 'DeviceLimits', 'cpu_route',
           'cpu_route_state', 'cuda_target', 'device_limits', 'device_reasons', 'gpu_launcher', 'gpu_route',
           'interpreted_triton_route', 'interpreting', 'launch_watch', 'load_kernels', 'store_dtype',
           'stubbed_triton_route', 'triton_available', 'triton_dtypes', 'watching_launches']

PLATFORMS = ('cuda', 'rocm')


# the distributions that install the ``triton`` package: triton's own, and PyTorch nightlies' builds of it
TRITON_DISTRIBUTIONS = ('triton', 'pytorch-triton', 'pytorch-triton-rocm')
_VERSION_LINE = re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)


def _version_tuple(version: str) -> tuple[int, ...] | None:
    parts = re.findall(r'\d+', version)[:2]
    return tuple(int(part) for part in parts) if len(parts) == 2 else None


def _installed_triton() -> tuple[int, ...] | None:
    """triton's version without importing it (an early import would fix ``TRITON_INTERPRET`` before the tests set
    it), None when it is not installed; read once: from the metadata of a distribution that installs it
    (:data:`TRITON_DISTRIBUTIONS`), else from the ``__version__`` line of its package (a build from source without
    metadata), else the oldest the kernels take (:data:`~.triton_targets.MIN_TRITON`)."""
    spec = importlib.util.find_spec('triton')
    if spec is None:
        return None
    for distribution in TRITON_DISTRIBUTIONS:
        try:
            version = _version_tuple(importlib.metadata.version(distribution))
        except importlib.metadata.PackageNotFoundError:
            continue
        if version is not None:
            return version
    try:
        with open(spec.origin, encoding='utf-8') as init:
            found = _VERSION_LINE.search(init.read())
    except (OSError, TypeError):  # (no file: a namespace package)
        found = None
    version = _version_tuple(found.group(1)) if found else None
    return MIN_TRITON if version is None else version


@dataclasses.dataclass(frozen=True)
class DeviceLimits:
    """What the kernels need to know of a GPU, read once per device (:func:`device_limits`).

    Attributes:
        name: the device's name (``torch.cuda.get_device_name``).
        capability: ``(major, minor)``: on ROCm what torch reports for the AMD GPU (e.g. ``(9, 0)`` for an MI250X),
            which names no NVIDIA architecture.
        shared_memory_per_block: the opt-in shared memory a block may ask for, bytes.
        platform: ``'cuda'`` (an NVIDIA GPU) or ``'rocm'`` (an AMD GPU under torch's ROCm build, where ``torch.cuda``
            is the HIP device API).
        arch: ROCm's architecture name (e.g. ``'gfx90a'``); None on NVIDIA.
    """

    name: str
    capability: tuple[int, int]
    shared_memory_per_block: int
    platform: str = 'cuda'
    arch: str | None = None

    def __post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise ValueError(f'DeviceLimits: platform must be one of {PLATFORMS}, got {self.platform!r}')

    @property
    def target(self) -> int:
        """The capability as ``10 * major + minor`` (e.g. 89), the key of the launch configurations and tables
        (meaningful on NVIDIA only: see :attr:`built_for`)."""
        return 10 * self.capability[0] + self.capability[1]

    @property
    def built_for(self) -> bool:
        """Whether the kernels are compiled and checked for this device: an NVIDIA GPU of
        :data:`~.triton_targets.TARGETS`."""
        return self.platform == 'cuda' and self.target in TARGETS

    def __str__(self) -> str:
        if self.platform == 'rocm':
            return f'{self.name} ({self.arch or "AMD GPU"}, ROCm)'
        return f'{self.name} (sm_{self.target})'


def _read_limits(index: int) -> DeviceLimits:
    props = torch.cuda.get_device_properties(index)
    optin = getattr(props, 'shared_memory_per_block_optin', None)
    if optin is None:  # a torch without the field: triton's driver reads the same attribute
        import triton

        optin = triton.runtime.driver.active.utils.get_device_properties(index)['max_shared_mem']
    if getattr(torch.version, 'hip', None):  # torch's ROCm build: an AMD GPU behind torch.cuda
        arch = str(getattr(props, 'gcnArchName', '')).split(':')[0] or None
        return DeviceLimits(props.name, (props.major, props.minor), int(optin), 'rocm', arch)
    return DeviceLimits(props.name, (props.major, props.minor), int(optin))


def device_limits(index: int | None = None) -> DeviceLimits:
    """The :class:`DeviceLimits` of CUDA device ``index`` (None: the current one), read once per device: the one
    reader of a device for every Triton kernel of the package (the SOFT op's backend, the layers' kernels)."""
    index = torch.cuda.current_device() if index is None else int(index)
    limits = _DEVICES.get(index)
    if limits is None:
        limits = _DEVICES[index] = _read_limits(index)
    return limits


@dataclasses.dataclass(frozen=True)
class CpuRoute:
    """How CPU tensors take the GPU route: interpreted (``target`` None) or through triton's real launch path to a
    stand-in driver of the GPU ``target``; ``launcher`` launches the kernels (None: the route's default)."""

    target: int | None = None
    launcher: KernelLauncher | None = None

    @property
    def limits(self) -> DeviceLimits | None:
        """The stand-in GPU's limits (None under the interpreter)."""
        if self.target is None:
            return None
        return DeviceLimits(f'a stand-in sm_{self.target}', divmod(self.target, 10),
                            SHARED_MEMORY_PER_BLOCK.get(self.target, 0))


TRITON_VERSION = _installed_triton()
# how CPU tensors take the GPU route (None: they do not); what wraps every route's launcher (None: nothing)
_ROUTE: dict[str, Any] = {'cpu': None, 'watch': None}
_LAUNCHERS: dict[str, KernelLauncher] = {}
# each kernel module (and triton_interpreter) and the setting it was imported under
_LOADED: dict[str, tuple[ModuleType, bool]] = {}
_INTERPRETER = f'{__package__}.triton_interpreter'
_DEVICES: dict[int, DeviceLimits] = {}


def triton_available() -> bool:
    """Whether a triton the kernels can use is installed (>= :data:`~.triton_targets.MIN_TRITON`)."""
    return TRITON_VERSION is not None and TRITON_VERSION >= MIN_TRITON


def interpreting() -> bool:
    """Whether triton runs kernels in its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get('TRITON_INTERPRET', '0') == '1'


@contextlib.contextmanager
def interpreted_triton_route(launcher: KernelLauncher | None = None) -> Iterator[None]:
    """Inside, CPU tensors take every Triton route a CUDA tensor takes (the SOFT op's backend, the blocks' fused
    kernels), run by triton's interpreter: what the tests check the kernels with, and how a CPU machine counts a GPU's
    launches. Needs ``TRITON_INTERPRET=1`` set before triton was first imported, and a triton the kernels can use.
    ``launcher``: what launches the kernels (a meter's; None: ``kernel[grid]``). Read once per forward, when its
    route is made (:func:`soft_mm.ops.route.route_of`).

    Raises:
        RuntimeError: ``TRITON_INTERPRET`` is not 1, or no usable triton is installed.
    """
    if not (interpreting() and triton_available()):
        raise RuntimeError('interpreted_triton_route: needs TRITON_INTERPRET=1 (set before triton is imported) and '
                           f'triton >= {".".join(map(str, MIN_TRITON))}')
    with _cpu_route(CpuRoute(None, launcher)):
        yield


@contextlib.contextmanager
def stubbed_triton_route(target: int, launcher: KernelLauncher | None = None) -> Iterator[None]:
    """Inside, CPU tensors take the GPU route of an sm_``target`` device through triton's real launch path (binder,
    specialisation, compilation for the target, the launch plans), to the stand-in driver the caller made triton's
    active one (``soft_mm.testing.stub_driver``), which runs nothing: the kernels' outputs stay as allocated. What
    ``benchmarks/host_time.py`` times a GPU host's work with. ``launcher``: as :func:`interpreted_triton_route`'s
    (None: a launch plan, as on a GPU).

    Raises:
        RuntimeError: ``TRITON_INTERPRET=1`` (the kernels would be interpreted), no usable triton, or ``target`` is
            not one of the GPUs the kernels are built for.
    """
    if interpreting() or not triton_available() or target not in TARGETS:
        raise RuntimeError(f'stubbed_triton_route: needs TRITON_INTERPRET unset, triton >= '
                           f'{".".join(map(str, MIN_TRITON))} and a target of {TARGETS}, got target={target!r}')
    with _cpu_route(CpuRoute(target, launcher or PlannedLauncher())):
        yield


@contextlib.contextmanager
def _cpu_route(route: CpuRoute) -> Iterator[None]:
    before = _ROUTE['cpu']
    _ROUTE['cpu'] = route
    try:
        yield
    finally:
        _ROUTE['cpu'] = before


@contextlib.contextmanager
def watching_launches(wrap: Callable[[KernelLauncher], KernelLauncher]) -> Iterator[None]:
    """Inside, the launcher of every route made (:func:`soft_mm.ops.route.route_of`) is ``wrap(launcher)``: how the
    meters (``benchmarks/launch_counts.py``, ``benchmarks/host_time.py``, the launch-budget test) see every Triton
    launch, whatever caches the launches go through; each launcher is wrapped once per block (the same route, step
    after step). Nested blocks wrap the outer block's wrappers."""
    outer = _ROUTE['watch']
    wrapped: dict[int, tuple[KernelLauncher, KernelLauncher]] = {}

    def watch(launcher: KernelLauncher) -> KernelLauncher:
        inner = launcher if outer is None else outer(launcher)
        kept = wrapped.get(id(inner))
        if kept is None or kept[0] is not inner:
            kept = wrapped[id(inner)] = inner, wrap(inner)
        return kept[1]

    _ROUTE['watch'] = watch
    try:
        yield
    finally:
        _ROUTE['watch'] = outer


def launch_watch() -> Callable[[KernelLauncher], KernelLauncher] | None:
    """What wraps every route's launcher now (:func:`watching_launches`), None if nothing."""
    return _ROUTE['watch']


def cpu_route() -> bool:
    """Whether CPU tensors take the Triton routes now (inside :func:`interpreted_triton_route` or
    :func:`stubbed_triton_route`)."""
    return _ROUTE['cpu'] is not None


def cpu_route_state() -> CpuRoute | None:
    """How CPU tensors take the GPU route now (None: they do not)."""
    return _ROUTE['cpu']


def gpu_launcher() -> KernelLauncher:
    """The launcher of the Triton kernels on a GPU: launch plans (one process-wide :class:`PlannedLauncher`, its plans
    keyed by device), ``kernel[grid]`` under the interpreter."""
    kind = 'interpreter' if interpreting() else 'gpu'
    launcher = _LAUNCHERS.get(kind)
    if launcher is None:
        launcher = _LAUNCHERS[kind] = KernelLauncher() if kind == 'interpreter' else PlannedLauncher()
    return launcher


def gpu_route(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` takes the package's GPU route (where an eager step's time goes to kernel launches, so the
    layers launch as few as they can): a CUDA tensor, or a CPU tensor inside :func:`interpreted_triton_route` or
    :func:`stubbed_triton_route`."""
    return tensor.device.type == 'cuda' or (tensor.device.type == 'cpu' and _ROUTE['cpu'] is not None)


_BUILT = ', '.join(f'sm_{t}' for t in TARGETS)


def device_reasons(limits: DeviceLimits, bfloat16: bool) -> list[str]:
    """Every reason why the package's Triton kernels do not run on the device of ``limits`` (empty if they do), whatever
    the call's sizes: an AMD GPU (ROCm), an NVIDIA capability not in :data:`~.triton_targets.TARGETS`, a triton older
    than the target is checked with (:data:`~.triton_targets.TARGET_MIN_TRITON`), bfloat16 below
    :data:`~.triton_targets.BFLOAT16_MIN_TARGET`. The SOFT op's backend adds its kernels' shared memory
    (``soft_mm/ops/soft/backends/triton/nystrom_limits.py``)."""
    if limits.platform == 'rocm':
        return [f'is built and checked for NVIDIA GPUs ({_BUILT}), not this {limits}: an AMD GPU, whatever capability '
                f'torch reports for it ({limits.capability[0]}.{limits.capability[1]})']
    if limits.target not in TARGETS:
        return [f'is built and checked for {_BUILT}, not this {limits}']
    needed = TARGET_MIN_TRITON.get(limits.target)
    if needed is not None and TRITON_VERSION is not None and needed > TRITON_VERSION:
        found, needed = ('.'.join(map(str, v)) for v in (TRITON_VERSION, needed))
        return [f'is checked on sm_{limits.target} with triton >= {needed} (found {found}), not on this {limits}']
    if bfloat16 and limits.target < BFLOAT16_MIN_TARGET:
        return [f'has no bfloat16 kernels below sm_{BFLOAT16_MIN_TARGET} (this {limits})']
    return []


def cuda_target(device: torch.device) -> int:
    """The compute capability of a CUDA device as ``10 * major + minor`` (e.g. 89), read once per device."""
    return device_limits(device.index).target


def triton_dtypes(device: torch.device) -> tuple[torch.dtype, ...]:
    """The dtypes the fused Triton kernels of the package's layers take for tensors on ``device`` (empty: none): with
    a usable triton, CPU tensors inside :func:`interpreted_triton_route` (all) or :func:`stubbed_triton_route` (as its
    stand-in GPU), CUDA tensors on a device :func:`device_reasons` finds nothing against (an NVIDIA GPU of
    :data:`~.triton_targets.TARGETS`, bfloat16 only from :data:`~.triton_targets.BFLOAT16_MIN_TARGET`; the SOFT op's
    backend checks its own calls, shared memory included). A tuple: a symbolic trace records a route as it records
    its arguments."""
    if not triton_available():
        return ()
    if device.type == 'cpu':
        route = _ROUTE['cpu']
        if route is None:
            return ()
        limits = route.limits
    elif device.type == 'cuda':
        limits = device_limits(device.index)
    else:
        return ()
    if limits is not None and device_reasons(limits, False):
        return ()
    bfloat16 = limits is None or not device_reasons(limits, True)
    return (torch.float32, torch.float16, torch.bfloat16) if bfloat16 else (torch.float32, torch.float16)


def store_dtype(dtype: torch.dtype, interpret: bool | None = None) -> torch.dtype:
    """What a kernel writes for a result of ``dtype``: ``dtype``, or float32 for bfloat16 under the interpreter
    (``interpret``; None: :func:`interpreting`), whose cast to bfloat16 truncates instead of rounding to nearest (numpy
    has no bfloat16); torch casts afterwards."""
    if interpret is None:
        interpret = interpreting()
    return torch.float32 if interpret and dtype == torch.bfloat16 else dtype


def _imported(module: str, interpret: bool) -> ModuleType:
    """Module ``module``, imported again where the setting it was imported under (:data:`_LOADED`) is not
    ``interpret``."""
    loaded = _LOADED.get(module)
    if loaded is None:
        imported = importlib.import_module(module)
        if module == _INTERPRETER and bool(imported.INTERPRET) != interpret:  # (imported before, under the other)
            imported = importlib.reload(imported)
    else:
        imported = loaded[0] if loaded[1] == interpret else importlib.reload(loaded[0])
    _LOADED[module] = (imported, interpret)
    return imported


def load_kernels(module: str, interpret: bool | None = None) -> ModuleType:
    """The kernel module ``module`` (a dotted name), imported under the current ``TRITON_INTERPRET`` setting: again
    when it has changed since the last import, and :mod:`.triton_interpreter` (whose ``INTERPRET`` and ``loop_bound``
    every kernel module reads) again whenever the setting differs from the one it was imported under (``interpret``:
    the setting, already read; None: read here)."""
    if interpret is None:
        interpret = interpreting()
    loaded = _LOADED.get(module)
    if loaded is None or loaded[1] != interpret or _LOADED.get(_INTERPRETER, (None, None))[1] != interpret:
        _imported(_INTERPRETER, interpret)
        loaded = (_imported(module, interpret), interpret)
    return loaded[0]
