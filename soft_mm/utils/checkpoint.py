"""Let ``torch.load(weights_only=True)`` (torch >= 2.6's default) read the checkpoints that mmengine writes.

mmengine 0.10.7 calls ``torch.load`` without ``weights_only``. Its own checkpoints keep the message hub's
``HistoryBuffer`` objects (which hold numpy arrays and, as ``getattr(HistoryBuffer, 'mean')`` and the like, their
statistics methods) and numpy scalars in ``message_hub``/``meta``, so ``--resume``, ``load_from`` and testing a
checkpoint stop with ``Unsupported global: ...``. Allow-listing exactly those types keeps the safe loader (no
arbitrary code runs while unpickling) instead of switching it off; ``getattr`` in particular is replaced by a version
that resolves only HistoryBuffer's statistics methods.
"""
from __future__ import annotations

import argparse
import pickle

import numpy as np
import torch

# numpy dtypes whose arrays and scalars are plain data; object and void dtypes can carry arbitrary pickles
_NUMPY_DATA_DTYPES = ('Bool', 'Int8', 'Int16', 'Int32', 'Int64', 'UInt8', 'UInt16', 'UInt32', 'UInt64',
                      'Float16', 'Float32', 'Float64', 'Str')


def history_buffer_getattr(obj: object, name: str) -> object:
    """``getattr`` for unpickling, limited to the statistics methods a pickled ``HistoryBuffer`` refers to."""
    from mmengine.logging import HistoryBuffer

    # the default statistics are registered on the class only when the first buffer is created
    if obj is HistoryBuffer and name in {'min', 'max', 'mean', 'current', *HistoryBuffer._statistics_methods}:
        return getattr(obj, name)
    raise pickle.UnpicklingError(f'refusing getattr({obj!r}, {name!r}) while loading a checkpoint')


def mmengine_checkpoint_globals() -> list:
    """The non-tensor types found in checkpoints written by mmengine's Runner (and timm's ``args`` Namespace)."""
    from mmengine.logging import HistoryBuffer

    multiarray = np._core.multiarray if hasattr(np, '_core') else np.core.multiarray
    safe: list = [HistoryBuffer, argparse.Namespace, np.ndarray, np.dtype, multiarray._reconstruct, multiarray.scalar,
                  (history_buffer_getattr, 'builtins.getattr')]
    if hasattr(np, '_core'):  # numpy 2 reads files that numpy 1 wrote, which name numpy.core
        safe += [(multiarray._reconstruct, 'numpy.core.multiarray._reconstruct'),
                 (multiarray.scalar, 'numpy.core.multiarray.scalar')]
    safe += [getattr(np.dtypes, f'{name}DType') for name in _NUMPY_DATA_DTYPES if hasattr(np.dtypes, f'{name}DType')]
    return safe


def allow_mmengine_checkpoint_globals() -> None:
    """Register :func:`mmengine_checkpoint_globals` with ``torch.serialization`` (idempotent; no-op on old torch)."""
    add_safe_globals = getattr(torch.serialization, 'add_safe_globals', None)
    if add_safe_globals is not None:
        add_safe_globals(mmengine_checkpoint_globals())
