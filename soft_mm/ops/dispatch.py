"""The one dispatch point of the SOFT op: a short list of backends, each declaring what it supports.

:func:`soft_attention` computes the m×m part (landmark kernel, Newton–Schulz inverse) itself and hands the N×m
products to a backend. Each :class:`Backend` declares the device types, input dtypes and precisions it runs, whether
it has a backward and a double backward, whether it runs under ``torch.compile`` (a ``torch.library`` custom op with
a fake kernel, :mod:`soft_mm.ops.library`, so compiled and eager runs take the same kernels) and under export
(plain ATen operators valid at every input size: ``torch.export``, ONNX, ``torch.jit.trace``; the mode comes from
:func:`soft_mm.ops.capture.graph_mode`), and the token count from which automatic selection prefers it. With
``backend=None`` the highest-priority backend that fits is taken; a named backend is used if it fits and otherwise
refused with the reason, and when nothing fits the error lists every backend's reason. A new backend (a fused GPU
kernel) is one :func:`register_backend` call.

Built in:

* ``'reference'`` — the plain PyTorch math, ``K1`` held in full and autograd's backward: every device and dtype,
  double backward, compile and export. The float64 reference of the tests, and what exported graphs hold.
* ``'triton'`` — :func:`~soft_mm.ops.triton_nystrom.triton_nystrom_products`: fused kernels that build each block
  of the kernel in registers (no N×m tensor in memory), forward and backward; CUDA (on CPU only when forced under
  ``TRITON_INTERPRET=1``, for tests), eager and compiled (custom ops), needs ``triton``.
* ``'tiled'`` — :func:`~soft_mm.ops.tiled.tiled_nystrom_products`: the kernel built per tile of tokens in cache and
  rebuilt in its own backward, nothing N×m stored; CPU only (a Python loop of small kernels per tile and sample is
  what a GPU must not run), eager and compiled (custom ops; not exported: the loop is no ATen graph), preferred above
  :data:`AUTO_TILING_MIN_TOKENS` tokens, where its smaller working set pays; its option is ``tile_size``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from .capture import GRAPH_MODES
from .precision import Precision
from .tiled import DEFAULT_TILE_SIZE

__all__ = ['AUTO_TILING_MIN_TOKENS', 'Backend', 'DispatchError', 'backends', 'register_backend', 'select_backend']

# The tiled backend's automatic threshold: below it the reference's N×m temporaries still fit in cache and the
# reference is as fast with less Python overhead.
AUTO_TILING_MIN_TOKENS = 2 * DEFAULT_TILE_SIZE
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class DispatchError(RuntimeError):
    """No SOFT backend fits the call (the message lists each backend's reason)."""


@dataclasses.dataclass(frozen=True)
class Backend:
    """A way to compute the SOFT op's N×m products, with what it supports.

    Attributes:
        name: what ``soft_attention(..., backend=NAME)`` forces.
        priority: automatic selection tries higher priorities first.
        run: ``run(q, landmarks, v, kernel_landmarks, kernel_inv, normalize, precision, **options) -> out``; q and v
            in the input dtype (or the work dtype without mixed precision), the rest in the work dtype.
        devices: device types it runs on (``torch.device.type``).
        dtypes: input dtypes it accepts.
        mixed_precision: whether it runs the lower-dtype products of a mixed :class:`Precision`.
        backward: whether it has a (first-order) backward.
        double_backward: whether it supports double backward.
        compile: whether it runs under ``torch.compile`` (custom ops with fake kernels, or plain ATen operators).
        export: whether it runs while a graph is exported (plain ATen operators, valid at every input size).
        min_tokens: automatic selection takes it only for more tokens than this (forcing it ignores the bound).
        options: keyword options of ``run`` and their defaults (e.g. ``tile_size``).
        check: ``check(device_type, forced) -> reason | None``, what the fields cannot say (e.g. a missing package).
    """

    name: str
    priority: int
    run: Callable[..., Tensor]
    devices: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    mixed_precision: bool = True
    backward: bool = True
    double_backward: bool = False
    compile: bool = False
    export: bool = False
    min_tokens: int = 0
    options: tuple[tuple[str, object], ...] = ()
    check: Callable[[str, bool], str | None] | None = None

    def unsupported(self, device_type: str, dtype: torch.dtype, precision: Precision, num_tokens: int,
                    needs_grad: bool, mode: str, forced: bool) -> str | None:
        """Why this backend cannot take the call, or None if it can."""
        if device_type not in self.devices:
            return f'runs on {"/".join(self.devices)}, not {device_type}'
        if self.check is not None:
            reason = self.check(device_type, forced)
            if reason:
                return reason
        if dtype not in self.dtypes:
            return f'does not take {dtype} inputs'
        if precision.mixed and not self.mixed_precision:
            return f'has no mixed-precision products ({precision})'
        if needs_grad and not self.backward:
            return 'has no backward'
        if mode == 'export' and not self.export:
            return 'cannot run while a graph is exported (its kernels are no ATen graph valid at every size)'
        if mode == 'compile' and not self.compile:
            return 'cannot run under torch.compile (it is no custom op with a fake kernel)'
        if not forced and num_tokens <= self.min_tokens:
            return f'is chosen automatically only above {self.min_tokens} tokens (got {num_tokens})'
        return None

    def describe(self) -> str:
        """One line of its declared support."""
        dtypes = ', '.join(str(d).replace('torch.', '') for d in self.dtypes)
        flags = [f'devices {"/".join(self.devices)}', f'dtypes {dtypes}',
                 'mixed-precision products' if self.mixed_precision else 'no mixed precision',
                 'double backward' if self.double_backward else ('backward' if self.backward else 'no backward'),
                 'eager' + (', compile' if self.compile else '') + (', export' if self.export else '')]
        if self.min_tokens:
            flags.append(f'automatic above {self.min_tokens} tokens')
        return f'{self.name} (priority {self.priority}): ' + '; '.join(flags)


_BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    """Add (or replace) a backend of the SOFT op; returns it."""
    if not isinstance(backend, Backend):
        raise TypeError(f'register_backend: expected a Backend, got {type(backend).__name__}')
    _BACKENDS[backend.name] = backend
    return backend


def backends() -> list[Backend]:
    """The registered backends, highest priority first."""
    return sorted(_BACKENDS.values(), key=lambda b: -b.priority)


def select_backend(device_type: str, dtype: torch.dtype, precision: Precision, num_tokens: int, needs_grad: bool,
                   mode: str = 'eager', name: str | None = None) -> Backend:
    """The backend for a call: ``name`` if given and it fits, else the first that fits by priority.

    ``mode`` is :func:`~soft_mm.ops.capture.graph_mode`'s: ``'eager'``, ``'compile'`` or ``'export'``.

    Raises:
        ValueError: ``name`` is not a registered backend.
        DispatchError: the named backend, or every backend, cannot take the call (each reason listed).
    """
    if mode not in GRAPH_MODES:
        raise ValueError(f'select_backend: mode must be one of {GRAPH_MODES}, got {mode!r}')
    facts = (device_type, dtype, precision, num_tokens, needs_grad, mode)
    if name is not None:
        if name not in _BACKENDS:
            raise ValueError(f'soft_attention: backend={name!r} is not one of {sorted(_BACKENDS)} (or None)')
        reason = _BACKENDS[name].unsupported(*facts, forced=True)
        if reason:
            raise DispatchError(f'soft_attention: backend {name!r} {reason}')
        return _BACKENDS[name]
    reasons = []
    for backend in backends():
        reason = backend.unsupported(*facts, forced=False)
        if reason is None:
            return backend
        reasons.append(f'{backend.name} {reason}')
    raise DispatchError(f'soft_attention: no backend fits {device_type} {dtype} inputs of {num_tokens} tokens: '
                        + '; '.join(reasons))


