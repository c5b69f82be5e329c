"""The one dispatch point of the SOFT op: a short list of backends, each declaring what it supports.

:func:`soft_attention` hands the N×m products to a backend and computes the m×m part (landmark kernel, Newton–Schulz
inverse, SOFT-Norm scaling) itself in torch, unless the backend has a kernel for that too (``middle``: the Triton
backend's one launch per call). Each :class:`Backend` declares the device types, input dtypes and precisions it runs,
whether it has a backward, whether it runs under ``torch.compile`` (a ``torch.library`` custom
op with a fake kernel, :mod:`soft_mm.ops.custom_ops`, so compiled and eager runs take the same kernels) and under export
(plain ATen operators valid at every input size: ``torch.export``, ONNX, ``torch.jit.trace``; the mode comes from
:func:`soft_mm.ops.graph_mode.graph_mode`), and the token count from which automatic selection prefers it. With
``backend=None`` the highest-priority backend that fits is taken; a named backend is used if it fits and otherwise
refused with every reason, and when nothing fits the error lists every reason of every backend. A backend also
declares its size limits (m, d, d_v): a call above them goes to the next backend. A new backend (a fused GPU kernel)
is one :func:`register_backend` call.

The backends live in :mod:`soft_mm.ops.soft.backends`, one module each (``reference``, ``tiled``, ``triton``), each
declaring its own support beside its code; that package's list names them, and this module knows none of them.

:func:`decide` is :func:`select` for the op's eager calls: the decision kept per call signature (everything a
backend's support depends on; the token count only through the backends' ``min_tokens``), so an eager step does not
walk every backend's checks again on every call, and announced: where the automatic choice passes over a backend that
runs on the call's GPU (the Triton kernels on a GPU they are not built for, a call over their size limits), a
:class:`BackendFallbackWarning` says so once per device and reason. Calls that ``torch.compile`` or an exporter trace
take :func:`select` itself.
"""
from __future__ import annotations

import bisect
import dataclasses
import warnings
from collections.abc import Callable, Hashable

import torch
from torch import Tensor

from ..graph_mode import GRAPH_MODES
from ..precision.soft_policy import Precision
from ..triton_route import cpu_route

__all__ = ['MAX_DECISIONS', 'Backend', 'BackendFallbackWarning', 'Call', 'DispatchError', 'announce_fallback',
           'backends', 'decide', 'decisions_version', 'forget_decisions', 'register_backend', 'select']

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# the most call signatures whose decisions :func:`decide` keeps (and announcements it remembers); beyond, it starts
# afresh (a model makes a few dozen: one per layer shape, dtype and mode)
MAX_DECISIONS = 1024


class DispatchError(RuntimeError):
    """No SOFT backend fits the call (the message lists each backend's reason)."""


class BackendFallbackWarning(UserWarning):
    """The SOFT op's automatic choice passed over a faster backend on the GPU a call runs on (e.g. the Triton kernels
    on a GPU they are not built for, or a kernel that could not launch there): the message names the device, the
    backend passed over and why, and what runs instead. Shown once per device and reason;
    ``warnings.filterwarnings('ignore', category=BackendFallbackWarning)`` hides it."""


@dataclasses.dataclass(frozen=True)
class Call:
    """The facts of one SOFT op call that a backend's support depends on.

    Attributes:
        device_type: ``torch.device.type`` of the inputs.
        dtype: the promoted input dtype.
        precision: the :class:`Precision` policy of the call.
        num_tokens: N.
        needs_grad: whether a backward will be asked for.
        mode: :func:`~soft_mm.ops.graph_mode.graph_mode`'s ``'eager'``, ``'compile'`` or ``'export'``.
        num_landmarks: m (None: not known, not checked).
        head_dim: d of q and the landmarks (None: not checked).
        value_dim: d_v of v (None: not checked).
        device_index: the index of the inputs' device (None: the current device of its type).
    """

    device_type: str
    dtype: torch.dtype
    precision: Precision
    num_tokens: int
    needs_grad: bool
    mode: str = 'eager'
    num_landmarks: int | None = None
    head_dim: int | None = None
    value_dim: int | None = None
    device_index: int | None = None


@dataclasses.dataclass(frozen=True)
class Backend:
    """A way to compute the SOFT op's N×m products, with what it supports.

    Attributes:
        name: what ``soft_attention(..., backend=NAME)`` forces.
        priority: automatic selection tries higher priorities first.
        run: ``run(q, landmarks, v, middle, precision, **options) -> out``; q and v in the input dtype (or the work
            dtype without mixed precision), the landmarks in the work dtype, ``middle`` the m×m factor
            (:class:`~soft_mm.ops.soft.middle.Middle`: ``A^+`` and SOFT-Norm's scaling, or the whole matrix).
        devices: device types it runs on (``torch.device.type``).
        dtypes: input dtypes it accepts.
        mixed_precision: whether it runs the lower-dtype products of a mixed :class:`Precision`.
        product_dtypes: the dtypes of those products it runs (with float32 accumulation).
        backward: whether it has a (first-order) backward.
        compile: whether it runs under ``torch.compile`` (custom ops with fake kernels, or plain ATen operators).
        export: whether it runs while a graph is exported (plain ATen operators, valid at every input size).
        min_tokens: automatic selection takes it only for more tokens than this (forcing it ignores the bound).
        max_landmarks: the largest m it takes (None: any).
        max_head_dim: the largest head dim d and value dim d_v it takes (None: any).
        options: keyword options of ``run`` and their defaults (e.g. ``tile_size``).
        check: ``check(call, forced) -> reason | None`` (``call`` a :class:`Call`), what the fields cannot say: a
            missing package, which GPU the call's device is, whether its kernels fit that device.
        check_state: ``check_state(device_type, device_index) -> hashable``: whatever ``check`` reads besides the
            :class:`Call` (an installed package's version, the device's limits, a setting, the launches that failed),
            part of the key under which :func:`decide` keeps a decision, so that a change of it is a new decision
            (None: ``check`` reads the call alone).
        resource_error: ``resource_error(error) -> bool``: whether an error its ``run`` or ``middle`` raised means the
            device lacked the resources for the call's kernels (Triton's ``OutOfResources`` at a kernel's first
            launch), the failure recorded where ``check`` reads it; an eager automatic call then runs again on the
            next backend (None: every error is raised).
        middle: ``middle(landmarks, num_iters, ridge, soft_norm) -> (B, h, m, m)`` float32, the whole m×m middle
            matrix in one kernel with the implicit backward (None: the op computes it in torch). Taken for the
            default ``backward='implicit'`` with a float32 inverse; within the backend's m and d limits.
        eager: ``eager(q, landmarks, v, num_iters, ridge, soft_norm, products, out_dtype, route) -> out``, the whole
            op of an eager call on plain tensors (middle matrix and products) as one autograd node, where ``middle``
            would be taken (None: ``middle`` and ``run`` apart); ``products`` the low dtype of a mixed policy or
            None, ``route`` the call's :class:`~soft_mm.ops.route.Route`.
    """

    name: str
    priority: int
    run: Callable[..., Tensor]
    devices: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    mixed_precision: bool = True
    product_dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)
    backward: bool = True
    compile: bool = False
    export: bool = False
    min_tokens: int = 0
    max_landmarks: int | None = None
    max_head_dim: int | None = None
    options: tuple[tuple[str, object], ...] = ()
    check: Callable[[Call, bool], str | None] | None = None
    middle: Callable[..., Tensor] | None = None
    check_state: Callable[[str, int | None], Hashable] | None = None
    resource_error: Callable[[BaseException], bool] | None = None
    eager: Callable[..., Tensor] | None = None

    def unsupported_reasons(self, call: Call, forced: bool) -> list[str]:
        """Every reason why this backend cannot take ``call`` (empty if it can)."""
        reasons = []
        if call.device_type not in self.devices:
            reasons.append(f'runs on {"/".join(self.devices)}, not {call.device_type}')
        elif self.check is not None:
            reason = self.check(call, forced)
            if reason:
                reasons.append(reason)
        if call.dtype not in self.dtypes:
            reasons.append(f'does not take {call.dtype} inputs')
        if call.precision.mixed and not self.mixed_precision:
            reasons.append(f'has no mixed-precision products ({call.precision})')
        elif call.precision.mixed and call.precision.products not in self.product_dtypes:
            products = str(call.precision.products).replace('torch.', '')
            reasons.append(f'has no {products} products with float32 accumulation')
        if call.needs_grad and not self.backward:
            reasons.append('has no backward')
        if call.mode == 'export' and not self.export:
            reasons.append('cannot run while a graph is exported (its kernels are no ATen graph valid at every size)')
        if call.mode == 'compile' and not self.compile:
            reasons.append('cannot run under torch.compile (it is no custom op with a fake kernel)')
        if self.max_landmarks is not None and call.num_landmarks is not None \
                and call.num_landmarks > self.max_landmarks:
            reasons.append(f'takes at most {self.max_landmarks} landmarks (got m = {call.num_landmarks})')
        for name, dim in (('head dim d', call.head_dim), ('value dim d_v', call.value_dim)):
            if self.max_head_dim is not None and dim is not None and dim > self.max_head_dim:
                reasons.append(f'takes a {name} of at most {self.max_head_dim} (got {dim})')
        if not forced and call.num_tokens <= self.min_tokens:
            # (the call's own count is not written into the text: under torch.compile it is a traced size, and
            # writing it would fix the graph to it)
            reasons.append(f'is chosen automatically only above {self.min_tokens} tokens')
        return reasons


_BACKENDS: dict[str, Backend] = {}
# the same, highest priority first: sorted once per registration, not per call (dynamo before torch 2.5 cannot trace
# sorted() of a dict's values)
_BY_PRIORITY: list[Backend] = []
# the backends' min_tokens, sorted: a decision depends on the token count only through which of them it exceeds
_TOKEN_THRESHOLDS: list[int] = []
# decide(): call signature -> (backend, policy); the (device, backend, reason) already announced
_DECISIONS: dict[tuple, tuple[Backend, Precision]] = {}
_ANNOUNCED: set[tuple] = set()
_VERSION = [0]  # bumped whenever a kept decision may no longer hold (decisions_version)


def decisions_version() -> int:
    """A number that changes whenever a decision kept by :func:`decide`, or by a caller that keeps decisions of its
    own per call signature, may no longer hold: a backend registered, :func:`forget_decisions` called (a backend's
    launch failed on a device, a test changed what a backend's check reads)."""
    return _VERSION[0]


def forget_decisions() -> None:
    """Drop every kept decision (:func:`decide`'s, and through :func:`decisions_version` the callers' own)."""
    _DECISIONS.clear()
    _VERSION[0] += 1


def register_backend(backend: Backend) -> Backend:
    """Add (or replace) a backend of the SOFT op; returns it. The kept decisions are dropped."""
    if not isinstance(backend, Backend):
        raise TypeError(f'register_backend: expected a Backend, got {type(backend).__name__}')
    _BACKENDS[backend.name] = backend
    _BY_PRIORITY[:] = sorted(_BACKENDS.values(), key=lambda b: -b.priority)
    _TOKEN_THRESHOLDS[:] = sorted({b.min_tokens for b in _BY_PRIORITY})
    forget_decisions()
    return backend


def backends() -> list[Backend]:
    """The registered backends, highest priority first."""
    return list(_BY_PRIORITY)


def select(device_type: str, dtype: torch.dtype, precision: Precision, num_tokens: int, needs_grad: bool,
           mode: str = 'eager', name: str | None = None, *, num_landmarks: int | None = None,
           head_dim: int | None = None, value_dim: int | None = None, device_index: int | None = None,
           ) -> tuple[Backend, Precision]:
    """The backend for a call and the precision it runs: ``name`` if given and it fits, else the first that fits by
    priority; each policy of ``precision.chain()`` in turn (e.g. float16 products, else float32 where no backend that
    fits stores its sums in float32).

    ``mode`` is :func:`~soft_mm.ops.graph_mode.graph_mode`'s: ``'eager'``, ``'compile'`` or ``'export'``. The sizes m,
    d and d_v are checked against each backend's limits when given (a backend above its limits is passed over);
    ``device_index`` names the device among those of its type (a backend's check may read which GPU it is).

    Raises:
        ValueError: ``name`` is not a registered backend.
        DispatchError: the named backend, or every backend, cannot take the call (every reason of each listed, for
            the preferred policy).
    """
    backend, policy, _ = _select(device_type, dtype, precision, num_tokens, needs_grad, mode, name, num_landmarks,
                                 head_dim, value_dim, device_index)
    return backend, policy


def _select(device_type: str, dtype: torch.dtype, precision: Precision, num_tokens: int, needs_grad: bool, mode: str,
            name: str | None, num_landmarks: int | None, head_dim: int | None, value_dim: int | None,
            device_index: int | None) -> tuple[Backend, Precision, Call]:
    """:func:`select`, and the :class:`Call` of the policy it chose."""
    if mode not in GRAPH_MODES:
        raise ValueError(f'select: mode must be one of {GRAPH_MODES}, got {mode!r}')
    if name is not None and name not in _BACKENDS:
        raise ValueError(f'soft_attention: backend={name!r} is not one of {sorted(_BACKENDS)} (or None)')
    candidates = [_BACKENDS[name]] if name is not None else backends()
    refusals: list[str] = []  # each backend's reasons for the preferred policy
    for policy in precision.chain():
        call = Call(device_type, dtype, policy, num_tokens, needs_grad, mode, num_landmarks, head_dim, value_dim,
                    device_index)
        for backend in candidates:
            reasons = backend.unsupported_reasons(call, forced=name is not None)
            if not reasons:
                return backend, policy, call
            if policy is precision:
                refusals.append(', '.join(reasons))
    if name is not None:
        raise DispatchError(f'soft_attention: backend {name!r} {refusals[0]}')
    raise DispatchError(f'soft_attention: no backend fits {device_type} {dtype} inputs of {num_tokens} tokens: '
                        + '; '.join(f'{b.name} {r}' for b, r in zip(candidates, refusals)))


def decide(device_type: str, dtype: torch.dtype, precision: Precision, num_tokens: int, needs_grad: bool,
           mode: str = 'eager', name: str | None = None, *, num_landmarks: int | None = None,
           head_dim: int | None = None, value_dim: int | None = None, device_index: int | None = None,
           ) -> tuple[Backend, Precision]:
    """:func:`select`'s decision (the same arguments, the same result, the same errors), kept per call signature: the
    device type and index, the dtype, the preferred policy and its fallbacks, whether a backward follows, the mode, the
    forced name, m, d, d_v, which backends' ``min_tokens`` the token count exceeds and each backend's
    :attr:`~Backend.check_state`; at most :data:`MAX_DECISIONS` of them. For the op's eager calls (a call that
    ``torch.compile`` traces takes :func:`select`, whose every step dynamo can follow).

    A new decision of the automatic choice on a GPU (or on the interpreted GPU route of
    :func:`~soft_mm.ops.triton_route.interpreted_triton_route`) that passes over a higher-priority backend running on
    that device type, for a reason other than its token threshold, is announced by :func:`announce_fallback`: once
    per device and reason; so is one that runs a lower precision's call in a higher one (float16 products, where no
    backend on the device takes them, in float32).
    """
    key = (device_type, device_index, dtype, precision.chain(), needs_grad, mode, name, num_landmarks, head_dim,
           value_dim, bisect.bisect_left(_TOKEN_THRESHOLDS, num_tokens),
           tuple(b.check_state(device_type, device_index) for b in _BY_PRIORITY if b.check_state is not None))
    decision = _DECISIONS.get(key)
    if decision is not None:
        return decision
    backend, policy, call = _select(device_type, dtype, precision, num_tokens, needs_grad, mode, name, num_landmarks,
                                    head_dim, value_dim, device_index)
    if name is None and (device_type == 'cuda' or (device_type == 'cpu' and cpu_route())):
        if policy is not precision:
            _announce_lower_precision_passed_over(dataclasses.replace(call, precision=precision), policy)
        _announce_passed_over(call, backend)
    if len(_DECISIONS) >= MAX_DECISIONS:
        _DECISIONS.clear()
    _DECISIONS[key] = backend, policy
    return backend, policy


def _announce_passed_over(call: Call, chosen: Backend) -> None:
    """Announce each backend above ``chosen`` that runs on the call's device type but refused it (under the chosen
    policy) for more than its token threshold."""
    for backend in _BY_PRIORITY:
        if backend is chosen:
            return
        if call.device_type in backend.devices:
            reasons = backend.unsupported_reasons(call, forced=True)  # (forced: without the token threshold)
            if reasons:
                announce_fallback(call.device_type, call.device_index, backend.name, ', '.join(reasons),
                                  f'the {chosen.name!r} backend runs instead')


def _announce_lower_precision_passed_over(call: Call, chosen: Precision) -> None:
    """Announce that ``call``'s preferred policy (its products' dtype) runs as ``chosen`` instead, with every reason
    of each backend that runs on the call's device type."""
    reasons = [f'the {backend.name!r} backend {", ".join(refused)}' for backend in _BY_PRIORITY
               if call.device_type in backend.devices
               and (refused := backend.unsupported_reasons(call, forced=True))]
    preferred, instead = (str(p.products).replace('torch.', '') for p in (call.precision, chosen))
    _warn_once((call.device_type, call.device_index, 'precision', preferred, tuple(reasons)), call.device_type,
               call.device_index, f'{preferred} products are not taken here ({"; ".join(reasons)}); the op runs in '
               f'{instead}')


def _warn_once(key: tuple, device_type: str, device_index: int | None, message: str) -> None:
    """Warn ``message`` (a :class:`BackendFallbackWarning` about the device) once per ``key``."""
    if key in _ANNOUNCED:
        return
    if len(_ANNOUNCED) >= MAX_DECISIONS:
        _ANNOUNCED.clear()
    _ANNOUNCED.add(key)
    device = device_type if device_index is None else f'{device_type}:{device_index}'
    warnings.warn(f'soft_attention on {device}: {message} (said once per device and reason; '
                  'soft_mm.ops.soft.dispatch.BackendFallbackWarning is its category)', BackendFallbackWarning,
                  stacklevel=3)


def announce_fallback(device_type: str, device_index: int | None, passed_over: str, reason: str, instead: str,
                      ) -> None:
    """Warn once per device and reason (:class:`BackendFallbackWarning`) that the backend ``passed_over`` does not run
    a call on the device, why (``reason``, in the backend's words) and what does (``instead``)."""
    _warn_once((device_type, device_index, passed_over, reason), device_type, device_index,
               f'the {passed_over!r} backend {reason}; {instead}')

