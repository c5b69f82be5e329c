"""Let ``torch.load(weights_only=True)`` (torch >= 2.6's default) read the checkpoints that mmengine writes.

mmengine 0.10.7 calls ``torch.load`` without ``weights_only``. Its own checkpoints keep the message hub's
``HistoryBuffer`` objects (which hold numpy arrays and, as ``getattr(HistoryBuffer, 'mean')`` and the like, their
statistics methods) and numpy scalars in ``message_hub``/``meta``, so ``--resume``, ``load_from`` and testing a
checkpoint stop with ``Unsupported global: ...``. Allow-listing exactly those types keeps the safe loader (no
arbitrary code runs while unpickling) instead of switching it off; ``getattr`` in particular is replaced by a version
that resolves only HistoryBuffer's statistics methods.

torch < 2.4 has no allow-list (``torch.serialization.add_safe_globals``) and its safe loader cannot rebuild any other
object: there :func:`safe_load` unpickles with an allow-list of its own (torch's tensor-rebuilding globals and the
same mmengine objects), so every torch reads the same files and refuses the same ones.
"""
from __future__ import annotations

import _compat_pickle
import argparse
import codecs
import functools
import os
import pickle
import types
from typing import Any

import numpy as np
import torch

from ...ops.compat import HAS_SAFE_GLOBALS

# numpy dtypes whose arrays and scalars are plain data; object and void dtypes can carry arbitrary pickles
_NUMPY_DATA_DTYPES = ('Bool', 'Int8', 'Int16', 'Int32', 'Int64', 'UInt8', 'UInt16', 'UInt32', 'UInt64',
                      'Float16', 'Float32', 'Float64', 'Str')


def _multiarray() -> types.ModuleType:
    """numpy's ``multiarray`` module: ``numpy._core`` in numpy 2 (and numpy 1.26's shim of it), else ``numpy.core``."""
    try:
        from numpy._core import multiarray
    except ImportError:
        from numpy.core import multiarray
    return multiarray


def history_buffer_getattr(obj: object, name: str) -> object:
    """``getattr`` for unpickling, limited to the statistics methods a pickled ``HistoryBuffer`` refers to."""
    from mmengine.logging import HistoryBuffer

    # the default statistics are registered on the class only when the first buffer is created
    if obj is HistoryBuffer and name in {'min', 'max', 'mean', 'current', *HistoryBuffer._statistics_methods}:
        return getattr(obj, name)
    raise pickle.UnpicklingError(f'refusing getattr({obj!r}, {name!r}) while loading a checkpoint')


def mmengine_checkpoint_globals() -> list:
    """The non-tensor types found in checkpoints written by mmengine's Runner (and timm's ``args`` Namespace); the
    message hub's ``HistoryBuffer`` where mmengine is installed (timm-only use reads no mmengine checkpoints)."""
    multiarray = _multiarray()
    safe: list = [argparse.Namespace, np.ndarray, np.dtype, multiarray._reconstruct, multiarray.scalar]
    try:
        from mmengine.logging import HistoryBuffer
    except ImportError:
        pass
    else:
        safe += [HistoryBuffer, (history_buffer_getattr, 'builtins.getattr')]
    # numpy 1 writes numpy.core, numpy 2 numpy._core: a file of either reads with either
    safe += [(function, f'{core}.multiarray.{function.__name__}')
             for core in ('numpy.core', 'numpy._core') for function in (multiarray._reconstruct, multiarray.scalar)]
    safe += [getattr(np.dtypes, f'{name}DType') for name in _NUMPY_DATA_DTYPES if hasattr(np.dtypes, f'{name}DType')]
    return safe


def allow_mmengine_checkpoint_globals() -> None:
    """Register :func:`mmengine_checkpoint_globals` with ``torch.serialization`` (idempotent; no-op on old torch)."""
    add_safe_globals = getattr(torch.serialization, 'add_safe_globals', None)
    if add_safe_globals is not None:
        add_safe_globals(mmengine_checkpoint_globals())


def _pickle_name(obj: object) -> str:
    return f'{obj.__module__}.{obj.__qualname__}'


@functools.cache
def _allowed_by_name() -> dict[str, object]:
    """``'module.name' -> object`` for the allow-list unpickler: torch's own safe globals (tensors, storages,
    dtypes, ``OrderedDict``) and :func:`mmengine_checkpoint_globals`."""
    from torch._weights_only_unpickler import _get_allowed_globals  # torch < 2.4 (the only caller)

    allowed = dict(_get_allowed_globals())
    allowed.update({str(dtype): dtype for dtype in (torch.bfloat16, torch.bool, torch.uint8)})
    allowed['_codecs.encode'] = codecs.encode  # how protocol-2 pickles hold bytes (numpy 1's scalars)
    for entry in mmengine_checkpoint_globals():
        obj, name = entry if isinstance(entry, tuple) else (entry, _pickle_name(entry))
        allowed.setdefault(name, obj)
    return allowed


class _AllowListUnpickler(pickle.Unpickler):
    """An unpickler that resolves only allow-listed globals: nothing else can be called or built."""

    def find_class(self, module: str, name: str) -> object:
        # protocol 2 (torch.save's default) names Python 2's modules; the stock find_class maps them the same way
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        found = _allowed_by_name().get(f'{module}.{name}')
        if found is None:
            raise pickle.UnpicklingError(f'Unsupported global: GLOBAL {module}.{name} is not allow-listed')
        return found


_ALLOW_LIST_PICKLE = types.ModuleType('soft_mm_allow_list_pickle')
_ALLOW_LIST_PICKLE.Unpickler = _AllowListUnpickler
_ALLOW_LIST_PICKLE.load = lambda file, **kwargs: _AllowListUnpickler(file, **kwargs).load()


def safe_load(path: str | os.PathLike, **kwargs: Any) -> Any:
    """``torch.load(path, weights_only=True, **kwargs)`` with mmengine's checkpoint objects allow-listed, on every
    torch: through torch's allow-list where it has one (>= 2.4), else through soft_mm's allow-list unpickler. A
    global outside the list raises ``pickle.UnpicklingError`` naming it (``GLOBAL module.name``)."""
    allow_mmengine_checkpoint_globals()
    if HAS_SAFE_GLOBALS:
        return torch.load(path, weights_only=True, **kwargs)
    return torch.load(path, pickle_module=_ALLOW_LIST_PICKLE, **kwargs)
