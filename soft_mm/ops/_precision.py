"""Precision helpers shared by the ops: run numerically delicate steps in at least float32 with autocast off."""
import contextlib
from contextlib import AbstractContextManager

import torch

__all__ = ['compute_dtype', 'no_autocast']


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least float32: float16/bfloat16/float32 -> float32, float64 -> float64."""
    return torch.promote_types(dtype, torch.float32)


def no_autocast(device: torch.device) -> AbstractContextManager:
    """Context that disables autocast for ``device``'s type (a no-op where that type has no autocast)."""
    is_available = getattr(torch.amp, 'is_autocast_available', None)
    if is_available is not None and not is_available(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, enabled=False)
