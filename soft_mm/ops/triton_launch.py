"""How the package launches a Triton kernel: ``kernel[grid](*args, **meta)`` through triton's own launch path
(:class:`KernelLauncher`), or from a launch plan (:class:`PlannedLauncher`).

triton's own path (``JITFunction.run``) binds and specialises every argument, builds a cache key and looks the compiled
kernel up at each launch: about 10 µs of Python a launch, where an eager GPU step waits for the host. A plan keeps the
``CompiledKernel`` that a signature's first ``kernel[grid]`` returned, under a key holding what triton specialises
on (each tensor's dtype and 16-byte alignment, each int's being 1, its divisibility by 16 and its width, the
constexprs and options), and launches it directly with every parameter in signature order; the device and the stream
are read at each launch (a CUDA graph is captured on a side stream), and where triton's launch hooks call nothing (no
profiler's registered) the launch takes none and no per-launch metadata for them. Imports triton only when a plan is
made.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ['INTERPRETER_MAX_BLOCK', 'MAX_PLANS', 'KernelLauncher', 'PlannedLauncher', 'interpreter_block',
           'kernel_name', 'once_differentiable', 'specialization']

# the most launch signatures a PlannedLauncher keeps (a model makes a few hundred); beyond, it starts afresh
MAX_PLANS = 4096


# where triton's interpreter runs the kernels, the most tokens (or rows) a program takes (interpreter_block)
INTERPRETER_MAX_BLOCK = 4096


def interpreter_block(count: int, cap: int = INTERPRETER_MAX_BLOCK) -> int:
    """Tokens (or rows) a program takes where triton's interpreter runs a kernel: all ``count`` of the map or matrix,
    rounded up to a power of two, at most ``cap`` (a power of two). The interpreter's Python cost is per operation of
    a program whatever the tile's size, so fewer and larger programs cost less; a GPU's blocks are bounded by its
    registers instead (each op's ``*_config.py``), and the results differ only in how the reductions are grouped."""
    return min(int(cap), 1 << max(int(count) - 1, 0).bit_length())


def kernel_name(kernel: Any) -> str:
    """The Python name of a Triton kernel (compiled or interpreted)."""
    return kernel.fn.__name__


def once_differentiable(backward: Callable) -> Callable:
    """``torch.autograd.function.once_differentiable`` for the backward of a Function that launches kernels, without
    its ``no_grad`` block where grad mode is off already (every backward but one with ``create_graph=True``): the same
    result, a few µs less of an eager step's host work per node."""
    guarded = torch.autograd.function.once_differentiable(backward)

    @functools.wraps(backward)
    def wrapper(ctx: Any, *grads: Any) -> Any:
        return guarded(ctx, *grads) if torch.is_grad_enabled() else backward(ctx, *grads)
    return wrapper


def specialization(args: Sequence[Any]) -> tuple:
    """The part of a launch's positional arguments that selects a compiled kernel, flat: each tensor's dtype and
    whether its address is 16-byte aligned, each int's being 1, divisible by 16 and within 32 bits (one code), the
    type of anything else (a float, a bool, None); a tuple's items in place, between two markers."""
    out: list = []
    _specialize(args, out.append)
    return tuple(out)


_TENSORS = (torch.Tensor, torch.nn.Parameter)
_I32_MIN, _I32_MAX = -2 ** 31, 2 ** 31


def _specialize(args: Sequence[Any], append: Any) -> None:
    for arg in args:
        kind = arg.__class__
        if kind in _TENSORS:
            append(arg.dtype)
            append(not arg.data_ptr() & 15)
        elif kind is int:
            append((arg == 1) + 2 * (not arg % 16) + 4 * (_I32_MIN <= arg < _I32_MAX))
        elif kind is tuple:
            append('(')
            _specialize(arg, append)
            append(')')
        else:
            append(kind)


class KernelLauncher:
    """Launches a Triton kernel as ``kernel[grid](*args, **meta)``: triton's own path (its binder, specialisation and
    cache lookup at every launch). ``args``: the positional arguments in the kernel's signature order; ``meta``: its
    constexprs by name and the launch options (``num_warps``, ``num_stages``). Each forward's route holds one
    (:attr:`soft_mm.ops.route.Route.launcher`); the meters wrap it."""

    name = 'kernel[grid]'
    # whether the kernels' values matter: False for a meter's launcher (it counts, or runs nothing), where the
    # interpreter then stores bfloat16 results directly, as a GPU does (its own bfloat16 stores truncate)
    exact_values = True

    def __call__(self, kernel: Any, grid: tuple[int, ...], args: Sequence[Any], meta: Mapping[str, Any]) -> None:
        kernel[grid](*args, **meta)


class PlannedLauncher(KernelLauncher):
    """Launches a Triton kernel from a plan per launch signature (see the module docstring): the first launch of a
    signature through ``kernel[grid]``, which compiles and returns the ``CompiledKernel``; every later one through it
    directly. At most :data:`MAX_PLANS` plans, none holding a tensor. On a triton older than 3.4 (no ``triton.knobs``),
    and for a kernel triton's interpreter runs, every launch is ``kernel[grid]``."""

    name = 'plan'

    def __init__(self) -> None:
        self.plans: dict[tuple, tuple[Any, Any, tuple]] = {}
        self._driver = self._knobs = self._chain = None
        self.direct = self._load()

    def _load(self) -> bool:
        try:
            import triton
            from triton.runtime import driver
        except ImportError:
            return False
        knobs = getattr(triton, 'knobs', None)
        if knobs is None:  # triton < 3.4
            return False
        self._driver, self._knobs = driver, knobs.runtime
        self._chain = getattr(knobs, 'HookChain', None)
        return True

    def __call__(self, kernel: Any, grid: tuple[int, ...], args: Sequence[Any], meta: Mapping[str, Any]) -> None:
        if not self.direct or not hasattr(kernel, 'device_caches'):  # (an interpreted kernel compiles nothing)
            kernel[grid](*args, **meta)
            return
        active = self._driver.active
        device = active.get_current_device()
        key = (id(kernel), device, specialization(args), *meta.items())
        plan = self.plans.get(key)
        if plan is None or plan[0] is not kernel:  # (a kernel module imported again makes new kernels)
            compiled = kernel[grid](*args, **meta)
            if compiled is not None and hasattr(compiled, 'packed_metadata'):
                if len(self.plans) >= MAX_PLANS:
                    self.plans.clear()
                self.plans[key] = kernel, compiled, _trailing_parameters(kernel, len(args), meta)
            return
        _, compiled, trailing = plan
        stream = active.get_current_stream(device)
        values = (*args, *trailing)
        knobs = self._knobs
        enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
        if self._idle(enter) and self._idle(leave):  # no hook to call: no per-launch metadata for one
            enter = leave = metadata = None
        else:
            metadata = compiled.launch_metadata(grid, stream, *values)
        compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                     compiled.function, compiled.packed_metadata, metadata, enter, leave, *values)

    def _idle(self, hook: Any) -> bool:
        """Whether a launch hook of triton's knobs calls nothing: None, or an empty ``HookChain`` (the default since
        the hooks became chains, which ``kernel[grid]`` builds the per-launch metadata for and calls anyway)."""
        return hook is None or (type(hook) is self._chain and not hook.calls)


def _trailing_parameters(kernel: Any, num_args: int, meta: Mapping[str, Any]) -> tuple:
    """The kernel's parameters after the positional ones, in signature order, as triton's binder binds them: from
    ``meta`` by name, else their defaults."""
    return tuple(meta.get(param.name, param.default) for param in kernel.params[num_args:])
