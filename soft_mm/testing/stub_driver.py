"""A stand-in GPU driver for triton: its real launch path on CPU tensors, without a GPU and without the interpreter.

Inside :func:`stub_triton_driver`, triton's active driver is a :class:`StubDriver` of an NVIDIA target: a kernel's
``kernel[grid](...)`` binds and specialises its arguments, compiles the kernel for that target (triton's own
compiler and ptxas, as ``benchmarks/triton_cubins.py`` does), looks it up in triton's cache and calls the driver's
launcher, which records the call (:class:`RecordingLauncher`) or does nothing; no kernel runs and the outputs stay as
allocated. With :func:`soft_mm.ops.triton_route.stubbed_triton_route`, CPU tensors take the package's GPU route through
it: what ``benchmarks/host_time.py`` times a GPU host's work with, and what the tests compare the launch plans'
arguments with ``kernel[grid]``'s by. Needs ``TRITON_INTERPRET`` unset (the kernels decorated as compiled ones).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ..ops.triton_targets import SHARED_MEMORY_PER_BLOCK

__all__ = ['RecordingLauncher', 'StubDriver', 'stub_triton_driver']


class RecordingLauncher:
    """The launcher class of the stand-in driver: triton makes one per compiled kernel (``launcher_cls(src,
    metadata)``) and calls it with the launch's grid, stream, function, metadata, hooks and every kernel argument in
    signature order. Each call is appended to ``calls`` (a class-level list, ``(kernel name, arguments)``) where
    recording is on, else dropped."""

    calls: list[tuple[str, tuple]] | None = None

    def __init__(self, src: Any, metadata: Any) -> None:
        self.name = src.fn.__name__ if hasattr(src, 'fn') else str(src)

    def __call__(self, *args: Any) -> None:
        if RecordingLauncher.calls is not None:
            RecordingLauncher.calls.append((self.name, args))


class _Utils:
    def __init__(self, target: int) -> None:
        self.shared = SHARED_MEMORY_PER_BLOCK.get(target, 101_376)

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple[int, int, int, int, int]:
        return 1, 1, 0, 0, 1024  # (module, function, registers, spills, threads a block)

    def unload_module(self, module: Any) -> None:
        pass

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {'max_shared_mem': self.shared, 'multiprocessor_count': 132, 'max_num_regs': 65_536, 'warpSize': 32}


def _driver_class() -> type:
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class StubDriver(DriverBase):
        """triton's driver interface for an NVIDIA GPU of capability ``target`` that runs nothing (see the module
        docstring)."""

        def __init__(self, target: int) -> None:
            self.target = GPUTarget('cuda', target, 32)
            self.utils = _Utils(target)
            self.launcher_cls = RecordingLauncher

        @classmethod
        def is_active(cls) -> bool:
            return True

        def map_python_to_cpp_type(self, ty: str) -> str:
            return ty

        def get_current_target(self) -> Any:
            return self.target

        def get_active_torch_device(self) -> torch.device:
            return torch.device('cpu')

        def get_benchmarker(self) -> Any:
            raise NotImplementedError('the stand-in driver runs no kernel')

        def get_current_device(self) -> int:
            return 0

        def set_current_device(self, device: int) -> None:
            pass

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_device_capability(self, device: int = 0) -> tuple[int, int]:
            return divmod(self.target.arch, 10)

        def get_device_interface(self) -> Any:
            return torch.cuda

        def get_empty_cache_for_benchmark(self) -> torch.Tensor:
            raise NotImplementedError('the stand-in driver runs no kernel')

        def clear_cache(self, cache: Any) -> None:
            pass

    return StubDriver


def StubDriver(target: int) -> Any:
    """A stand-in driver of the NVIDIA GPU ``target`` (a capability as ``10 * major + minor``)."""
    return _driver_class()(target)


@contextlib.contextmanager
def stub_triton_driver(target: int = 90, record: bool = False) -> Iterator[list[tuple[str, tuple]] | None]:
    """Inside, triton's active driver is a :class:`StubDriver` of ``target``; yields the list the launches are
    recorded in where ``record`` (None otherwise). triton's previous driver is active again after the block."""
    from triton.runtime import driver

    # (triton >= 3.5 keeps the active driver in _active, made on first use: reading .active would make the real one,
    # which fails without a GPU; triton 3.4 keeps a lazy proxy in .active)
    attribute = '_active' if '_active' in vars(driver) else 'active'
    previous = vars(driver)[attribute]
    calls_before = RecordingLauncher.calls
    RecordingLauncher.calls = [] if record else None
    driver.set_active(StubDriver(target))
    try:
        yield RecordingLauncher.calls
    finally:
        setattr(driver, attribute, previous)
        RecordingLauncher.calls = calls_before
