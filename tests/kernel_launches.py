"""Count the kernels a call would launch on a GPU, on CPU tensors: the ATen operators that compute something (views,
allocations and metadata excluded), the operators inside ``soft_mm`` custom ops included, and each Triton launch
(the interpreter's own copies in and out of the kernel excluded)."""
from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

# ATen operators that launch no kernel: allocations and metadata (views are recognised by their schema)
NO_KERNEL = {'empty', 'empty_strided', 'new_empty', 'new_empty_strided', 'empty_like', '_unsafe_view', 'detach',
             'lift_fresh', 'alias', 'set_', 'resize_', 'sym_size', 'sym_stride', 'sym_numel', 'is_same_size',
             'sym_storage_offset', 'is_contiguous', 'is_non_overlapping_and_dense', 'promote_types'}


class _OpCounter(TorchDispatchMode):
    def __init__(self, record: list[str]) -> None:
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == 'soft_mm':  # look inside: the custom op's kernel (its ops dispatch through this mode)
            with _OpCounter(self.record):
                return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **kwargs)
        name = func.overloadpacket.__name__
        if not func.is_view and name not in NO_KERNEL:
            self.record.append(f'aten.{name}')
        return func(*args, **kwargs)


class _CountingKernel:
    def __init__(self, kernel, name: str, record: list[str]) -> None:
        self.kernel, self.name, self.record = kernel, name, record

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.record.append(f'triton.{self.name}')
            with _disable_current_modes():  # the interpreter's copies between torch and numpy are no GPU kernels
                return self.kernel[grid](*args, **kwargs)
        return launch


class _CountingKernels:
    def __init__(self, module, record: list[str]) -> None:
        self.module, self.record = module, record

    def __getattr__(self, name: str):
        return _CountingKernel(getattr(self.module, name), name, self.record)


@contextlib.contextmanager
def counted_launches(monkeypatch):
    """Context yielding a list that collects ``'aten.<op>'`` and ``'triton.<kernel>'`` per launch made inside it."""
    import soft_mm.ops.soft.backends.triton.backend as triton_module
    record: list[str] = []
    real = triton_module._kernels
    monkeypatch.setattr(triton_module, '_kernels', lambda: _CountingKernels(real(), record))
    with _OpCounter(record):
        yield record
    monkeypatch.setattr(triton_module, '_kernels', real)


def summary(record: list[str]) -> dict[str, int]:
    return dict(Counter(record))
