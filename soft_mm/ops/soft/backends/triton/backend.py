"""The ``'triton'`` backend of the SOFT op: the fused Triton kernels (:mod:`.nystrom_launch`) declared to the
dispatcher, with the check that says why they decline a call (triton missing or too old, CPU outside the interpreter,
a GPU they are not built for, a dtype or size its shared memory does not fit, a launch that failed there before:
:mod:`.nystrom_limits`)."""
from __future__ import annotations

from collections.abc import Hashable

import torch
from torch import Tensor

from .... import triton_route
from ....precision.soft_policy import Precision
from ....triton_route import device_limits
from ....triton_targets import MIN_TRITON
from ...dispatch import Backend, Call, register_backend
from ...middle import Middle
from .nystrom_config import MAX_HEAD_DIM, MAX_LANDMARKS
from .nystrom_launch import TRITON_NAME, triton_nystrom_middle, triton_nystrom_products, triton_soft_attention
from .nystrom_limits import dtype_name, failed_launch, launch_failures, launch_reasons, out_of_resources

__all__ = ['TRITON', 'call_reasons', 'check_state', 'unsupported_reason']


def unsupported_reason(device_type: str, forced: bool) -> str | None:
    """Why the Triton backend cannot run on this kind of device (None if it can): triton missing or older than
    :data:`~soft_mm.ops.triton_targets.MIN_TRITON`, or CPU outside the interpreter. Which GPU, and the call's sizes
    and dtypes, are :func:`call_reasons`'."""
    if not triton_route.triton_available():
        if triton_route.TRITON_VERSION is None:
            return 'needs triton (pip install triton)'
        found, needed = ('.'.join(map(str, v)) for v in (triton_route.TRITON_VERSION, MIN_TRITON))
        return f'needs triton >= {needed} (found {found}: torch < 2.8 ships an older one)'
    if device_type == 'cpu' and not _cpu_takes_it(forced):
        return ('runs on CPU only when forced under TRITON_INTERPRET=1 (the interpreter, for tests) or inside '
                'soft_mm.ops.triton_route.interpreted_triton_route() or stubbed_triton_route()')
    return None


def _cpu_takes_it(forced: bool) -> bool:
    """Whether CPU tensors take the kernels: inside a CPU route of the GPU's (interpreted, or to a stand-in driver),
    or forced under the interpreter."""
    state = triton_route.cpu_route_state()
    if state is not None and state.target is not None:
        return True
    return (forced or state is not None) and triton_route.interpreting()


def call_reasons(call: Call, forced: bool) -> str | None:
    """The backend's check (:attr:`~soft_mm.ops.soft.dispatch.Backend.check`): :func:`unsupported_reason`, then on a
    GPU whether the device is a target of the kernels, runs the call's dtypes and has the shared memory every kernel
    of the call asks for (:func:`~.nystrom_limits.launch_reasons`, the device read once), and whether a launch of its
    kernels failed there before (:func:`~.nystrom_limits.failed_launch`)."""
    reason = unsupported_reason(call.device_type, forced)
    if reason is not None:
        return reason
    products = call.precision.products if call.precision.mixed else torch.float32
    reasons = []
    limits = device_limits(call.device_index) if call.device_type == 'cuda' else None
    state = triton_route.cpu_route_state() if call.device_type == 'cpu' else None
    if state is not None and state.target is not None:  # a stand-in GPU's (stubbed_triton_route)
        limits = state.limits
    if limits is not None:
        reasons = launch_reasons(limits, call.dtype, products, call.num_landmarks, call.head_dim, call.value_dim,
                                 call.needs_grad)
    failure = failed_launch(call.device_type, call.device_index, call.num_landmarks, call.head_dim, call.value_dim,
                            dtype_name(products), call.needs_grad)
    return ', '.join([*reasons, *([failure] if failure else [])]) or None


def check_state(device_type: str, device_index: int | None) -> Hashable:
    """What :func:`call_reasons` reads besides the call (:attr:`~soft_mm.ops.soft.dispatch.Backend.check_state`):
    triton's version, the interpreter settings, the GPU's limits, the launch failures recorded."""
    limits = device_limits(device_index) if device_type == 'cuda' and triton_route.triton_available() else None
    return (triton_route.TRITON_VERSION, triton_route.interpreting(), triton_route.cpu_route_state(), limits,
            launch_failures())


def _triton_attention(q: Tensor, landmarks: Tensor, v: Tensor, middle: Middle, precision: Precision) -> Tensor:
    """The backend's run function: :func:`~.nystrom_launch.triton_nystrom_products` (fused kernels, float32
    exponent)."""
    return triton_nystrom_products(q, landmarks.float(), v, middle.matrix().float(),
                                   products=precision.products if precision.mixed else None)


# CUDA (on CPU only when forced under TRITON_INTERPRET=1, for tests), eager and compiled (custom ops), needs triton;
# m, d and d_v up to MAX_LANDMARKS and MAX_HEAD_DIM (a call above them gets the next backend)
TRITON = register_backend(Backend(
    name=TRITON_NAME, priority=20, run=_triton_attention, devices=('cuda', 'cpu'),
    dtypes=(torch.float16, torch.bfloat16, torch.float32), product_dtypes=(torch.bfloat16, torch.float16),
    compile=True, max_landmarks=MAX_LANDMARKS, max_head_dim=MAX_HEAD_DIM, check=call_reasons,
    middle=triton_nystrom_middle, check_state=check_state, resource_error=out_of_resources,
    eager=triton_soft_attention))
