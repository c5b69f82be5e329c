"""The route of one forward, decided once: where and how the package's layers and ops run.

Every layer function of the package asks the same questions at each call (a graph being compiled or exported? plain
eager tensors? the GPU route? autocast on, to what dtype? do the fused Triton kernels take this dtype here?), and a
step asks them hundreds of times with one answer per forward. :func:`route_of` answers them once, for the input of a
forward, in a :class:`Route` (immutable, holding no tensor); the pyramid makes one per forward (each stage its own
under ``compile_stages``) and hands it down to every block, layer and op, and each op picks its fused or reference
form from it. An op called without one makes its own from its input, with the same answers.
"""
from __future__ import annotations

import dataclasses

import torch

from .graph_mode import eager_tensors, graph_mode
from .precision.autocast import autocast_dtype
from .triton_launch import KernelLauncher
from .triton_route import (
    cpu_route_state,
    device_limits,
    gpu_launcher,
    gpu_route,
    interpreting,
    launch_watch,
    load_kernels,
    triton_available,
    triton_dtypes,
)

__all__ = ['DEFERRED', 'Route', 'decided', 'route_of']


@dataclasses.dataclass(frozen=True)
class Route:
    """How one forward runs (see the module docstring).

    Attributes:
        device_type: the device type whose route the tensors take: ``'cuda'`` on the GPU route (CUDA tensors, or CPU
            tensors inside :func:`~soft_mm.ops.triton_route.interpreted_triton_route` or
            :func:`~soft_mm.ops.triton_route.stubbed_triton_route`), else the tensors' own.
        mode: :func:`~soft_mm.ops.graph_mode.graph_mode`'s ``'eager'``, ``'compile'`` or ``'export'``.
        plain: an eager call on plain tensors with no dispatch mode that records or replaces operators
            (:func:`~soft_mm.ops.graph_mode.eager_tensors`): where Python may run kernels directly.
        autocast: the autocast dtype of the tensors' device (None: autocast off).
        triton_dtypes: the dtypes the layers' fused Triton kernels take here (empty: none).
        interpret: the Triton kernels run in triton's interpreter.
        target: the GPU's compute capability as ``10 * major + minor`` (None: the interpreter, or no GPU route).
        launcher: what launches the Triton kernels (a forced Triton backend launches them off the GPU route too).
        decided: False for :data:`DEFERRED` only (a symbolic trace: each op decides at its call).
    """

    device_type: str
    mode: str = 'eager'
    plain: bool = False
    autocast: torch.dtype | None = None
    triton_dtypes: tuple[torch.dtype, ...] = ()
    interpret: bool = False
    target: int | None = None
    launcher: KernelLauncher | None = None
    decided: bool = True

    @property
    def gpu(self) -> bool:
        """The GPU route of an eager call on plain tensors, where a launch saved is time saved."""
        return self.plain and self.device_type == 'cuda'

    @property
    def exporting(self) -> bool:
        """A graph that must hold at every input size is being recorded (ONNX, ``torch.export``, jit trace)."""
        return self.mode == 'export'

    def fused(self, *tensors: torch.Tensor) -> bool:
        """Whether the layers' fused Triton kernels take ``tensors`` (their dtypes) on this route."""
        return self.plain and all(t.dtype in self.triton_dtypes for t in tensors)

    def cpu_inference(self, *tensors: torch.Tensor | None) -> bool:
        """An eager CPU call off the GPU route that records no gradient (None entries skipped): where a layer may
        compute in place and pick kernels that have no backward."""
        if not (self.plain and self.device_type == 'cpu'):
            return False
        return not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))

    def store_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """What a kernel writes for a result of ``dtype``: float32 for bfloat16 where the interpreter runs the kernels
        (its cast truncates), ``dtype`` elsewhere (and for a meter's launcher, as on a GPU)."""
        if not (self.interpret and dtype == torch.bfloat16):
            return dtype
        watch = launch_watch()
        launcher = self.launcher if watch is None else watch(self.launcher)
        return torch.float32 if launcher is None or launcher.exact_values else dtype

    def launch(self, kernel, grid: tuple[int, ...], args: tuple, meta: dict) -> None:
        """Launch a Triton kernel with the route's launcher (:class:`~soft_mm.ops.triton_launch.KernelLauncher`'s
        arguments), wrapped by the meters' :func:`~soft_mm.ops.triton_route.watching_launches` where one watches: every
        launch of the package goes through here."""
        watch = launch_watch()
        (self.launcher if watch is None else watch(self.launcher))(kernel, grid, args, meta)

    def kernels(self, module: str):
        """The kernel module ``module`` as this route runs it (interpreted or compiled)."""
        return load_kernels(module, self.interpret)


# the route of a symbolic trace (torch.fx): nothing decided, each op decides at its call
DEFERRED = Route('meta', decided=False)


def route_of(x: torch.Tensor, launcher: KernelLauncher | None = None) -> Route:
    """The :class:`Route` of a forward whose input is ``x`` (a tensor; anything else, a symbolic trace's proxy, gets
    :data:`DEFERRED`). ``launcher``: what launches the Triton kernels (None: the route's own, or the one given to
    :func:`~soft_mm.ops.triton_route.interpreted_triton_route`)."""
    if not isinstance(x, torch.Tensor):
        return DEFERRED
    mode = graph_mode()
    device = x.device
    if mode != 'eager':  # (nothing else is asked where a graph is traced but the device route)
        return Route('cuda' if gpu_route(x) else device.type, mode)
    plain = eager_tensors(x)
    cpu_state = cpu_route_state() if device.type == 'cpu' else None
    if launcher is None:
        launcher = (cpu_state.launcher if cpu_state is not None else None) or gpu_launcher()
    autocast = autocast_dtype(device.type)
    if cpu_state is not None and cpu_state.target is not None:  # a stand-in GPU behind triton's real launch path
        return Route('cuda', mode, plain, autocast, triton_dtypes(device), False, cpu_state.target,
                     launcher)
    interpret = interpreting()
    if device.type != 'cuda' and cpu_state is None:  # (a forced Triton backend still launches, interpreted)
        return Route(device.type, mode, plain, autocast, interpret=interpret, launcher=launcher)
    target = None
    if not interpret and device.type == 'cuda' and triton_available():
        target = device_limits(device.index).target
    return Route('cuda', mode, plain, autocast, triton_dtypes(device), interpret, target, launcher)


def decided(route: Route | None, x: torch.Tensor) -> Route:
    """``route`` where one was decided for the forward, else the route of ``x`` (:func:`route_of`)."""
    return route if route is not None and route.decided else route_of(x)
